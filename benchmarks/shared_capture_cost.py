"""What one graph for a shared step's calls costs a steady chunk, paired (CUDA).

``runtime.graphs.SHARE_CALLS`` records the first later flow step's call once per entry
and replays that graph at every later call, each call's cache slot copied in.  This
builds two optimized models (rules SRc) on ONE released Token2Wav tail in one process,
the first with the shared calls' graph, the second with every call recorded where it
stands, sets both up on the same prompt, and runs the same steady chunks on both,
alternating (A B A B ...), each chunk timed to a device sync.  Every chunk's waveform
must be bit-equal between the two, and both final states too; it prints medians, their
ratio, the capture time of each set-up, the bytes the shared graphs' copies take (summed
over entries, and what the session's one buffer holds: ``runtime/pools.py``), the device
memory each model's set-up left allocated and peaked at (the first model's includes what
the tail's first trace leaves), and, per model, what one more session on the same prompt
takes (``session_mib``: allocated by ``open_session`` and its peak, the fair comparison).

    python3 benchmarks/shared_capture_cost.py --n-timesteps 10 --prompt-tokens 250 --chunks 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import deterministic_protocol
from cadence_fx.runtime import graphs


def regions(opt) -> list:
    """The captured regions of every entry of ``opt``'s session."""
    return [m for program in opt.session._programs.values() for m in program.run.children()
            if isinstance(m, graphs.CapturedRegion)]


def copied_bytes(opt) -> int:
    """Bytes of the static copies the shared calls' first graphs read their slots through,
    summed over the entries (they share one buffer: ``stats()["static_copies"]``)."""
    return sum(s.nbytes for m in regions(opt) if m.copy_reads
               for s, b in zip(m.static_in, m.bound) if s is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-timesteps", type=int, default=10)
    ap.add_argument("--prompt-tokens", type=int, default=250)
    ap.add_argument("--chunks", type=int, default=20, help="timed steady chunks per model")
    args = ap.parse_args()
    deterministic_protocol()
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=args.n_timesteps)
    prompt = s2.synthetic_prompt(args.prompt_tokens, seed=1, device="cuda")
    models, mib, before = {}, {}, graphs.SHARE_CALLS
    try:
        for name, share in (("shared", True), ("per_call", False)):
            graphs.SHARE_CALLS = share  # read when a model compiles and captures
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            opt = cadence_fx.optimize(tail, rules="SRc")
            opt.set_stream_cache(*prompt)
            torch.cuda.synchronize()
            mib[name] = {"allocated": round((torch.cuda.memory_allocated() - base) / 2**20, 1),
                         "peak": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)}
            models[name] = opt
    finally:
        graphs.SHARE_CALLS = before
    chunks = s2.synthetic_chunks(3 + args.chunks, seed=2)
    ms = {name: [] for name in models}
    equal = True
    for k, (tokens, last) in enumerate(chunks):
        waves = {}
        for name, opt in models.items():
            torch.manual_seed(1000 + k)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.stream(tokens, last_chunk=last, return_waveform=True)  # a host copy: synced
            waves[name] = opt.last_speech.clone()
            if k >= 3:
                ms[name].append(1000 * (time.perf_counter() - t0))
        equal &= torch.equal(waves["shared"], waves["per_call"])
    session_mib = {}
    for name, opt in models.items():  # one more session each: what a session costs, in either order
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        extra = opt.open_session(*prompt)
        torch.cuda.synchronize()
        session_mib[name] = {"allocated": round((torch.cuda.memory_allocated() - base) / 2**20, 1),
                             "peak": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)}
        extra.close()
    states = [m.state() for m in models.values()]
    equal_state = all(torch.equal(states[0][r], states[1][r]) for r in states[0])
    p50 = {name: round(statistics.median(v), 3) for name, v in ms.items()}
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n_timesteps": args.n_timesteps,
           "prompt_tokens": args.prompt_tokens, "steady_chunks": args.chunks, "chunk_ms_p50": p50,
           "ratio_shared_to_per_call": round(p50["shared"] / p50["per_call"], 4),
           "capture_s": {n: round(m.session.stats()["setup_s"]["capture_s"], 3) for n, m in models.items()},
           "shared_copy_bytes": copied_bytes(models["shared"]),
           "static_copies": models["shared"].session.stats().get("static_copies"),
           "setup_mib_over_before": mib, "session_mib": session_mib,
           "calls_replaying_another": {n: sum(r.leader is not None for r in regions(m)) for n, m in models.items()},
           "waveforms_equal": bool(equal), "states_equal": bool(equal_state),
           "fallbacks": {n: m.stats()["fallbacks"] for n, m in models.items()}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
