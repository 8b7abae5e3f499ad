"""What a device synchronize around every region's capture costs a new session, paired (CUDA).

``runtime/pools.recording`` records an entry's regions one after another without the
device synchronize and emptied allocator cache that ``torch.cuda.graph`` does before each
capture (once an entry instead); ``CADENCE_FX_CAPTURE_SYNC=1`` (``pools.SYNC_EACH_CAPTURE``)
is the control that does.  This opens sessions of the released Token2Wav tail (rules SRc)
in ONE process, on one optimized model: for each prompt length, one session compiles the
length's programs (not timed), then ``--reps`` pairs of sessions on that prompt, the flag
off and on in alternating order, each session's ``open_session`` timed to a device sync
(``capture_s`` from its stats).  Each session then streams the same chunks in lockstep
with a stock tail set up on the same prompt (``lockstep.compare_streams``, the same seeds):
every chunk's waveform, PCM and state must be bit-equal to stock's (``exact``).  It prints
medians per variant and their ratio.

    python3 benchmarks/capture_sync_cost.py --n-timesteps 10 --prompt-tokens 150,250 --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import compare_streams, deterministic_protocol
from cadence_fx.runtime import pools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-timesteps", type=int, default=10)
    ap.add_argument("--prompt-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[150, 250])
    ap.add_argument("--reps", type=int, default=3, help="pairs of sessions per prompt length")
    ap.add_argument("--chunks", type=int, default=3, help="chunks each session streams against stock")
    ap.add_argument("--device", default="cuda", help="cpu: rule S, nothing captured (a dry run of the script)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        deterministic_protocol()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, rules="SRc" if device.type == "cuda" else "S")
    opt.set_stream_cache(*s2.synthetic_prompt(23, seed=23, device=device))  # the trace, not timed
    before = pools.SYNC_EACH_CAPTURE
    rows, exact = [], True
    try:
        for tokens in args.prompt_tokens:
            prompt = s2.synthetic_prompt(tokens, seed=tokens, device=device)
            chunks = s2.synthetic_chunks(args.chunks, seed=tokens, final_tokens=11)
            opt.open_session(*prompt).close()  # this length's programs: compiled here, not timed
            for rep in range(args.reps):
                order = (False, True) if rep % 2 == 0 else (True, False)
                for sync_each in order:
                    pools.SYNC_EACH_CAPTURE = sync_each
                    sync()
                    t0 = time.perf_counter()
                    session = opt.open_session(*prompt)
                    sync()
                    ready = time.perf_counter() - t0
                    pools.SYNC_EACH_CAPTURE = before
                    tail.set_stream_cache(*prompt)
                    same = compare_streams(tail, session, chunks, device, seed=1000 * tokens)["exact"]
                    stats = session.stats()
                    exact &= bool(same)
                    rows.append({"prompt_tokens": tokens, "rep": rep, "sync_each": sync_each,
                                 "ready_s": round(ready, 4),
                                 "capture_s": round(stats["setup_s"].get("capture_s", 0.0), 4),
                                 "exact": bool(same), "fallbacks": stats["fallbacks"]})
                    print(json.dumps(rows[-1]), flush=True)
                    session.close()
    finally:
        pools.SYNC_EACH_CAPTURE = before

    def med(key: str, sync_each: bool) -> float:
        return round(statistics.median(r[key] for r in rows if r["sync_each"] == sync_each), 4)

    out = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__, "n_timesteps": args.n_timesteps,
           "prompt_tokens": args.prompt_tokens, "reps": args.reps, "exact": exact,
           "capture_s_p50": {"recording": med("capture_s", False), "sync_each": med("capture_s", True)},
           "ready_s_p50": {"recording": med("ready_s", False), "sync_each": med("ready_s", True)}}
    out["capture_ratio"] = round(out["capture_s_p50"]["recording"] / max(out["capture_s_p50"]["sync_each"], 1e-9), 4)
    out["ready_ratio"] = round(out["ready_s_p50"]["recording"] / out["ready_s_p50"]["sync_each"], 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
