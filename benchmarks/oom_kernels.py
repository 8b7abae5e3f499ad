"""Does stock eager give other bits after the card ran out of memory?  (GPU only.)

The GPU suite of session 48 (docs/results/h100-2026-12-06-session48/) ran out of memory and
one float16 chunk came out not exact, with no error anywhere.  PyTorch's cuDNN convolution
(ATen ``native/cudnn/Conv_v8.cpp``: ``try_configs`` / ``run_single_conv``) catches an out of
memory while it allocates an engine's workspace, clears the CUDA error, runs the next engine
that fits and keeps it in its process-wide plan cache for that key: nothing reaches Python,
and later calls with the same key keep the other engine.  The allocator still counts each
out of memory (``torch.cuda.memory_stats()["num_ooms"]``).

Each case runs in its own process (a polluted cache lives as long as the process): stock's
released Token2Wav tail (seed-0 weights, a 61-token voice, 6 chunks with a 13-token flush,
5 flow steps) under the deterministic protocol; from the voice's set-up (each convolution's
first call) to the end of chunk 1 the process's allocator is capped at what it holds (its cached
free blocks released first) plus ``headroom`` MiB (``torch.cuda.set_per_process_memory_fraction``),
then the cap is lifted.  Reported per case: each chunk's waveform sha256, whether the
chunk raised, the allocator's ``num_ooms`` after it.  A case whose chunks differ from the
uncapped case's while none raised is stock giving other bits, silently, after an out of memory.

Usage: python benchmarks/oom_kernels.py [--parallel N] > report.json   (one process per case)
       python benchmarks/oom_kernels.py --case float16 64             (one case, JSON on stdout)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys

HEADROOMS_MIB = (None, 8, 64, 128, 256, 512, 1024, 2048)
DTYPES = ("float16", "float32")


def run_case(dtype: str, headroom: int | None) -> dict:
    import numpy
    import torch
    from cadence_fx.integrations.stepaudio2 import stock as s2
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5, float16=dtype == "float16")
    total = torch.cuda.get_device_properties(0).total_memory

    def cap() -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the cached free blocks go back: the cap leaves only the headroom
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + headroom * 2**20) / total))

    rows = []
    if headroom is not None:  # from the set-up (every convolution's first call) to the end of chunk 1
        cap()
    try:
        tail.set_stream_cache(*s2.synthetic_prompt(61, seed=61, device="cuda"))
    except torch.OutOfMemoryError as e:
        torch.cuda.set_per_process_memory_fraction(1.0)
        return {"dtype": dtype, "headroom_mib": headroom, "setup_raised": str(e)[:120], "chunks": []}
    torch.manual_seed(613)
    for i, (tokens, last) in enumerate(s2.synthetic_chunks(6, seed=61, final_tokens=13)):
        capped = i <= 1 and headroom is not None
        row = {"chunk": i, "capped": capped}
        try:
            wave = tail.stream(tokens, last_chunk=last, return_waveform=True)
            torch.cuda.synchronize()
            wave = wave.float().cpu().numpy() if isinstance(wave, torch.Tensor) else numpy.asarray(wave, dtype=numpy.float32)
            row["wave_sha256"] = hashlib.sha256(wave.tobytes()).hexdigest()[:16]
        except torch.OutOfMemoryError as e:
            row["raised"] = f"OutOfMemoryError: {str(e)[:120]}"
        finally:
            if i == 1:
                torch.cuda.set_per_process_memory_fraction(1.0)
        row["num_ooms"] = torch.cuda.memory_stats().get("num_ooms", 0)
        rows.append(row)
        if "raised" in row:
            break
    return {"dtype": dtype, "headroom_mib": headroom, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "chunks": rows}


def run_cases(script: str, dtypes: tuple, headrooms: tuple, parallel: int) -> list:
    """Each (dtype, headroom) case of ``script`` in a process of its own (``script --case DTYPE
    HEADROOM_MIB``: its last stdout line a JSON report), ``parallel`` at a time; a process that
    printed none gives ``{"dtype", "headroom_mib", "failed": the end of its stderr}``.  Shared
    with ``oom_capture_probe.py``."""
    def one(case):
        d, h = case
        out = subprocess.run([sys.executable, script, "--case", d, "none" if h is None else str(h)],
                             capture_output=True, text=True, env=os.environ)
        try:
            return json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return {"dtype": d, "headroom_mib": h, "failed": out.stderr[-800:]}

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, [(d, h) for d in dtypes for h in headrooms]))


def case_or_cases(script: str, run_case, dtypes: tuple, headrooms: tuple, parallel: int) -> list | None:
    """A probe's command line (shared with ``oom_capture_probe.py``): ``--case DTYPE HEADROOM_MIB``
    runs ``run_case`` here and prints its JSON (returns None); else every case through
    ``run_cases`` (``--parallel N``, default ``parallel``), returned."""
    p = argparse.ArgumentParser()
    p.add_argument("--case", nargs=2, metavar=("DTYPE", "HEADROOM_MIB"))
    p.add_argument("--parallel", type=int, default=parallel)
    a = p.parse_args()
    if a.case:
        print(json.dumps(run_case(a.case[0], None if a.case[1] == "none" else int(a.case[1])), default=str))
        return None
    return run_cases(script, dtypes, headrooms, a.parallel)


def main() -> None:
    results = case_or_cases(__file__, run_case, DTYPES, HEADROOMS_MIB, 4)
    if results is None:
        return
    for r in results:  # the verdict: chunks against the uncapped run of the same dtype
        clean = next((c for c in results if c["dtype"] == r["dtype"] and c["headroom_mib"] is None), None)
        if r["headroom_mib"] is None or "chunks" not in r or clean is None or "chunks" not in clean:
            continue
        ref = {c["chunk"]: c.get("wave_sha256") for c in clean["chunks"]}
        r["differs_from_uncapped"] = [c["chunk"] for c in r["chunks"]
                                      if "wave_sha256" in c and c["wave_sha256"] != ref.get(c["chunk"])]
        r["raised"] = any("raised" in c for c in r["chunks"])
    print(json.dumps(results, indent=1))
    for r in results:
        print(r["dtype"], r["headroom_mib"], "differs:", r.get("differs_from_uncapped"), "raised:", r.get("raised"),
              "num_ooms:", [c.get("num_ooms") for c in r.get("chunks", [])], file=sys.stderr)


if __name__ == "__main__":
    main()
