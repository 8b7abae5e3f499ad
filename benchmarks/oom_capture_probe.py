"""Session 48's wrong float16 chunk, under real memory pressure this time (GPU only).

In session 48's GPU suite, run beside eight build processes on one 80 GB card,
``test_on_cuda_each_entry_is_captured_when_a_chunk_first_needs_it_and_replays_exactly[float16]``
reported the chunk that captured entry 2 mid-stream as not exact (a region "not captured").
Out of memory injected into that capture (``test_background.py``'s cut tests) left every chunk
exact, and stock alone under an allocator cap gave the same bits (``oom_kernels.py``).  This
runs the test's own sequence (SRc, background builds, 5 flow steps, a 23-token first voice,
then a 61-token voice whose build is held; chunk 0 eager, chunk 1 with its capture deferred,
chunk 2 captures entry 2, chunks 3-5 replay it and flush) with the process's allocator capped
at what it holds (cached blocks released first) plus ``headroom`` MiB around chunk 2, stock's
chunk and the optimized one's together, as a card shared with other processes would be.

One process per case (float16/float32 x no cap, 16 MiB .. 1 GiB).  Reported per case: each
chunk's verdict against stock (waveform, PCM, state), its route, whether it raised, the
allocator's ``num_ooms``, and the session's capture failures.  A case with a chunk not exact
and nothing raised reproduces session 48.

Usage: python benchmarks/oom_capture_probe.py [--parallel N] > report.json
       python benchmarks/oom_capture_probe.py --case float16 64
"""

from __future__ import annotations

import json
import sys
import threading

HEADROOMS_MIB = (None, 16, 64, 128, 256, 512, 1024)
DTYPES = ("float16", "float32")


def run_case(dtype: str, headroom: int | None) -> dict:
    import torch
    import cadence_fx
    from cadence_fx.integrations import dropin as dropin_module
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams, deterministic_protocol
    from cadence_fx.runtime import device_work
    deterministic_protocol()
    dev = torch.device("cuda")
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5, float16=dtype == "float16")
    opt = cadence_fx.optimize(tail, rules="SRc", background=True)

    def voice(tokens: int) -> None:
        prompt = s2.synthetic_prompt(tokens, seed=tokens, device="cuda")
        tail.set_stream_cache(*prompt)
        opt.set_stream_cache(*prompt)
    voice(23)  # the first voice builds in the foreground
    gate, real = threading.Event(), dropin_module.compile_executable
    dropin_module.compile_executable = lambda *a, **k: gate.wait(300) and real(*a, **k)
    voice(61)
    chunks = s2.synthetic_chunks(6, seed=61, final_tokens=13)
    rows = []

    def compare(i: int, seed: int) -> dict:
        row = {"chunk": i}
        try:
            r = compare_streams(tail, opt, chunks[i:i + 1], dev, seed=seed)
            c = r["per_chunk"][0]
            row.update(exact=r["exact"], route=c["route"],
                       differs=[m for m in ("wave_equal", "pcm_equal", "state_equal") if not c.get(m, True)],
                       mismatched=c.get("mismatched"))
        except torch.OutOfMemoryError as e:
            row["raised"] = f"OutOfMemoryError: {str(e)[:120]}"
        row["num_ooms"] = torch.cuda.memory_stats().get("num_ooms", 0)
        return row
    rows.append(compare(0, 611))
    gate.set()
    assert opt.wait_for_builds(300)
    with device_work.LOCK:  # chunk 1's capture deferred, as in the test
        held = threading.Thread(target=lambda: rows.append(compare(1, 612)))
        held.start()
        held.join()
    total = torch.cuda.get_device_properties(0).total_memory
    if headroom is not None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + headroom * 2**20) / total))
    try:
        rows.append(compare(2, 613))  # entry 2 is captured in this chunk
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    for i in range(3, len(chunks)):
        if any("raised" in r for r in rows):
            break
        rows.append(compare(i, 611 + i))
    session = opt.session
    return {"dtype": dtype, "headroom_mib": headroom, "torch": torch.__version__, "chunks": rows,
            "capture_failures": {str(k): v for k, v in (getattr(session, "capture_failures", None) or {}).items()},
            "fallbacks": opt.stats().get("fallbacks"),
            "reproduced": any(r.get("exact") is False for r in rows)}


def main() -> None:
    from oom_kernels import case_or_cases  # (this script's folder is on the path when it runs)
    results = case_or_cases(__file__, run_case, DTYPES, HEADROOMS_MIB, 7)
    if results is None:
        return
    print(json.dumps(results, indent=1))
    for r in results:
        print(r["dtype"], r["headroom_mib"], "reproduced:", r.get("reproduced"), "failed:" if "failed" in r else "",
              [(c["chunk"], c.get("exact"), c.get("raised", "")[:40], c["num_ooms"]) for c in r.get("chunks", [])],
              "capture failures:", r.get("capture_failures"), file=sys.stderr)


if __name__ == "__main__":
    main()
