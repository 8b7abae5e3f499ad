"""What a new prompt length saves by reusing what an earlier one made on this process, paired.

Two things a new voice's set-up used to make again at every prompt length, though
nothing in them depends on the length:

- ``stream``: a session's first entry was warmed up (each region run eagerly, then
  captured) even on a capture stream an earlier session had warmed on this thread
  (``runtime/streams.py``: ``warmed`` / ``is_warm``), or on a new stream of a thread that
  had warmed another (``prime``: a few GEMMs make its cuBLAS workspace instead);
- ``istft``: the istft pass recorded ``aten.istft`` and checked the recording on two
  random signals at every length (``passes/istft_check.py``: ``_RECORDED``).

In ONE process, on one optimized Token2Wav tail (SRc, the drop-in), each prompt length
in ``--prompt-tokens`` is a new length, set up once; the lengths alternate between the
variants (``before``: the istft recordings cleared and every stream taken for cold, never
primed, during the set-up, so both are made again as before; ``after``: as the code
runs), the order flipped every pair.  ``set_stream_cache`` sets the new session up while
the old one lives, so the first timed length takes a new stream (primed after) and the
later ones the stream the length before the last gave back.  Timed per length: ``ready_s`` (``set_stream_cache``, synchronized),
``capture_s`` and ``passes_s`` (the session's ``stats()["setup_s"]``).  Every length is
then streamed against stock (``lockstep.compare_streams``: every waveform and state
tensor ``torch.equal``, SHA-256 of the PCM): ``exact`` beside every row.  Prints one
JSON object: the rows, per variant the medians, and the paired ratios (after / before,
adjacent lengths).

    python3 benchmarks/reuse_cost.py --device cuda --n-timesteps 10 --prompt-tokens 80,90,100,110,120,130,140,150
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--rules", default="SRc")
    p.add_argument("--n-timesteps", type=int, default=10)
    p.add_argument("--prompt-tokens", type=lambda s: [int(x) for x in s.split(",")],
                   default=[80, 90, 100, 110, 120, 130, 140, 150])
    p.add_argument("--first-tokens", type=int, default=75, help="the first length: traced, not timed")
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams, deterministic_protocol
    from cadence_fx.passes import istft_check
    from cadence_fx.runtime import streams
    if args.device == "cuda":
        deterministic_protocol()
    device = torch.device(args.device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    flow, hift = s2.build_modules(args.seed)
    tail = s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, rules=args.rules, cache=False)
    t0 = time.perf_counter()
    opt.set_stream_cache(*s2.synthetic_prompt(args.first_tokens, seed=args.first_tokens, device=device))
    sync()
    first_s = time.perf_counter() - t0
    rows, is_warm, prime = [], streams.is_warm, streams.prime
    for i, tokens in enumerate(args.prompt_tokens):
        variant = ("before", "after")[(i + i // 2) % 2]  # before, after, after, before, ...
        prompt = s2.synthetic_prompt(tokens, seed=tokens, device=device)
        if variant == "before":  # the stream counts as cold for this set-up (what it warms is still recorded)
            istft_check._RECORDED.clear()
            streams.is_warm = streams.prime = lambda stream: False
        sync()
        t0 = time.perf_counter()
        try:
            opt.set_stream_cache(*prompt)
            sync()
        finally:
            streams.is_warm, streams.prime = is_warm, prime
        ready = time.perf_counter() - t0
        setup = opt.session.stats()["setup_s"]
        tail.set_stream_cache(*prompt)
        report = compare_streams(tail, opt, s2.synthetic_chunks(args.chunks, seed=tokens, final_tokens=11),
                                 device, seed=tokens)
        rows.append({"prompt_tokens": tokens, "variant": variant, "ready_s": round(ready, 3),
                     "capture_s": setup.get("capture_s"), "passes_s": setup.get("passes_s"),
                     "specialize_s": setup.get("specialize_s"), "exact": bool(report["exact"]),
                     "capture_retried": opt.session.stats().get("capture_retried", {})})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    def med(variant, key):
        vals = [r[key] for r in rows if r["variant"] == variant and r[key] is not None]
        return round(statistics.median(vals), 3) if vals else None

    pairs = [(rows[j], rows[j + 1]) for j in range(0, len(rows) - 1, 2)]

    def ratio(a, b, key):  # after / before of one pair (None where before took no time: the CPU's capture)
        after, before = (a, b) if a["variant"] == "after" else (b, a)
        return round(after[key] / before[key], 3) if before[key] else None

    ratios = {key: [ratio(a, b, key) for a, b in pairs] for key in ("ready_s", "capture_s", "passes_s")}
    out = {"command": "python3 benchmarks/reuse_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "rules": args.rules, "n_timesteps": args.n_timesteps,
           "first_setup_s": round(first_s, 3), "rows": rows,
           "median": {v: {k: med(v, k) for k in ("ready_s", "capture_s", "passes_s", "specialize_s")}
                      for v in ("before", "after")},
           "paired_after_over_before": ratios,
           "exact": all(r["exact"] for r in rows)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
