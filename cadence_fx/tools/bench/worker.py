"""One bench variant in its own process: set up once, then stream blocks on request.

Protocol, usable by hand::

    printf 'block 0\\nblock 1\\nfinish\\n' | python -m cadence_fx.tools.bench.worker --variant B0 \\
        --blocks 2 --chunks 2 --prompt-tokens 5

stdout carries only protocol lines (``{"event": "ready" | "block" | "finish" | "error", ...}``,
one JSON object each); anything else the process prints goes to stderr.  Before streamed
chunk ``i`` (warm-up included) the generators are seeded ``chunk_seed(seed, i)``, so every
variant's block ``b`` can be compared with B0's by SHA-256 across processes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from ...lockstep import chunk_seed
from .. import registry
from . import BenchError
from .cmd import check_variants, model_args


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)



def profile_chunk(model, tokens, last, device) -> dict[str, Any]:
    """GPU time (kernels, memcpy, memset) and launch API calls of one chunk (CUDA)."""
    from torch.profiler import ProfilerActivity, profile
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.stream(tokens, last_chunk=last, return_waveform=True)
        _sync(device)
    gpu_us, launches, graph_launches, kernels = 0.0, 0, 0, 0
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and str(dt).endswith("CUDA"):
            gpu_us += e.time_range.elapsed_us()  # a device event: its own duration
            kernels += 1
        elif e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                        "cudaLaunchCooperativeKernel"):
            launches += 1
        elif e.name in ("cudaGraphLaunch", "cuGraphLaunch"):
            graph_launches += 1
    return {"kernel_ms": gpu_us / 1e3, "launches": launches + graph_launches, "kernel_launches": launches,
            "graph_launches": graph_launches, "gpu_events": kernels}



class BenchWorker:
    """One variant of one model, set up once, then streaming the shared chunk sequence block by block.

    Chunk ``i`` of the sequence: ``warmup`` untimed chunks, then ``blocks x chunks``
    timed ones (block ``b`` from ``warmup + b * chunks``), then one vocoder-timing and one
    profiler chunk.  Blocks must come in order: the streaming state carries across them.
    What is model-specific (build, variant, chunks, PCM, state) is ``args.model``'s
    ``BenchModel``.
    """

    def __init__(self, args, say: Callable[[str], None]):
        import torch
        from ...lockstep import deterministic_protocol
        check_variants([args.variant], args.device, args.model)
        spec = registry.bench_model(args.model)
        spec.check_options(vars(args))
        args.chunks = args.chunks or spec.default_chunks
        self.args = args
        self.device = torch.device(args.device)
        if self.device.type == "cuda":
            deterministic_protocol()
        self.bm = spec(args, registry.get(args.model))
        t0 = time.perf_counter()
        stock = self.bm.build()
        self.build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.model = self.bm.apply(stock, args.variant, say)
        if self.model is not stock:
            # a user of the optimized model keeps no stock one: its buffers and state must not
            # count in this variant's peak (the optimized model shares only parameters)
            del stock
            import gc
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.bm.start(self.model)
        _sync(self.device)
        self.setup_s = time.perf_counter() - t0
        # cadence_fx models split their set-up (trace, specialize, passes, capture); stock has no stats
        self.setup_split = self.model.stats().get("setup_s") if hasattr(self.model, "stats") else None
        self.chunks = self.bm.chunks(args.warmup + args.blocks * args.chunks + 2)
        self.stream_pcm = hashlib.sha256()  # every chunk's PCM, warm-up and blocks, in stream order
        t1 = time.perf_counter()
        self.warmup_ms = [self._stream(i)[1] for i in range(args.warmup)]
        self.warmup_s = time.perf_counter() - t1
        self.setup_peak = self._take_peak()
        self.bm.reset_counters(self.model)  # count the timed chunks only
        self.peak = None if self.setup_peak is None else 0
        self.next_block = 0
        self.timed_ms: list[float] = []

    def _stream(self, i: int, hashed: bool = True):
        import torch
        x, last = self.chunks[i]
        torch.manual_seed(chunk_seed(self.args.seed, i))  # seeds the CUDA generators too
        _sync(self.device)
        a = time.perf_counter()
        wav = self.model.stream(x, last_chunk=last, return_waveform=True)
        _sync(self.device)
        ms = (time.perf_counter() - a) * 1e3
        if hashed:
            self.stream_pcm.update(self.bm.pcm_bytes(wav))
        return wav, ms

    def _take_peak(self) -> int | None:
        """Peak bytes allocated since the last call (CUDA; None on the CPU), then restart the count."""
        import torch
        if self.device.type != "cuda":
            return None
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def ready(self) -> dict[str, Any]:
        import torch
        cuda = self.device.type == "cuda"
        return {"event": "ready", "variant": self.args.variant, "device": str(self.device),
                "torch": torch.__version__, "gpu": torch.cuda.get_device_name(self.device) if cuda else None,
                "build_s": self.build_s, "setup_s": self.setup_s, "setup_split": self.setup_split,
                "warmup_ms": self.warmup_ms, "setup_peak_bytes": self.setup_peak}

    def block(self, b: int) -> dict[str, Any]:
        """Stream block ``b``'s timed chunks; their ms and the PCM, waveform and state hashes."""
        a = self.args
        if b != self.next_block or b >= a.blocks:
            raise BenchError(f"block {b} asked; next is block {self.next_block} of {a.blocks} (blocks run in order)")
        pcm, wave, ms = hashlib.sha256(), hashlib.sha256(), []
        for i in range(a.warmup + b * a.chunks, a.warmup + (b + 1) * a.chunks):
            wav, t = self._stream(i)
            ms.append(t)
            pcm.update(self.bm.pcm_bytes(wav))
            wave.update(wav.tobytes())
        peak = self._take_peak()  # before hashing the state, which copies it to the host
        if peak is not None:
            self.peak = max(self.peak, peak)
        state = self.bm.state_sha256(self.model)
        self._take_peak()
        self.next_block += 1
        self.timed_ms += ms
        return {"event": "block", "variant": a.variant, "block": b, "chunk_ms": ms, "pcm_sha256": pcm.hexdigest(),
                "wave_sha256": wave.hexdigest(), "state_sha256": state}

    def finish(self) -> dict[str, Any]:
        """Peak memory, counters, vocoder time and the profiler chunk (CUDA), after the blocks."""
        import torch
        a = self.args
        rec: dict[str, Any] = {"event": "finish", "variant": a.variant, "peak_bytes": self.peak,
                               "setup_peak_bytes": self.setup_peak, "build_s": self.build_s,
                               "setup_s": self.setup_s, "setup_split": self.setup_split,
                               "warmup_ms": self.warmup_ms}
        steady = statistics.median(self.timed_ms) / 1e3 if self.timed_ms else 0.0
        rec["compile_s"] = self.setup_s + max(0.0, self.warmup_s - a.warmup * steady)
        if self.next_block == a.blocks:  # the whole stream ran: its PCM hash covers warm-up and every block
            rec["stream_pcm_sha256"] = self.stream_pcm.hexdigest()
        if hasattr(self.model, "stats"):  # cadence_fx models count fallbacks; stock has none
            rec["fallbacks"] = self.model.stats().get("fallback_total")
        rec.update(self.bm.counters(self.model))
        i = a.warmup + a.blocks * a.chunks
        rec["vocoder_ms"] = self.bm.vocoder_ms(self.model, lambda: self._stream(i, hashed=False), self.device)
        rec.update(kernel_ms=None, launches=None, graph_launches=None)
        if self.device.type == "cuda" and not a.no_profile:
            x, last = self.chunks[i + 1]
            torch.manual_seed(chunk_seed(a.seed, i + 1))
            rec.update(profile_chunk(self.model, x, last, self.device))
        return rec


def serve(args, send: Callable[[dict], None], readline: Callable[[], str]) -> int:
    """Set up, say ready, then answer ``block B`` and ``finish`` lines until finish or EOF.

    An unknown or out-of-order command gets an error reply and the worker keeps serving;
    any other failure gets an error reply (traceback on stderr) and exit status 2.
    """
    def say(m: str) -> None:
        print(f"[bench {args.variant}] {m}", file=sys.stderr, flush=True)

    def fail(e: BaseException) -> int:
        traceback.print_exc(file=sys.stderr)
        send({"event": "error", "variant": args.variant, "error": f"{type(e).__name__}: {e}"})
        return 2
    try:
        worker = BenchWorker(args, say)
    except Exception as e:  # noqa: BLE001 - the process boundary: report any failure as one line
        return fail(e)
    send(worker.ready())
    while True:
        line = readline()
        if not line:
            return 0  # the driver went away
        cmd = line.split()
        try:
            if cmd == ["finish"]:
                send(worker.finish())
                return 0
            if len(cmd) == 2 and cmd[0] == "block" and cmd[1].isdigit():
                send(worker.block(int(cmd[1])))
            else:
                raise BenchError(f"unknown command {line.strip()!r}; expected 'block B' or 'finish'")
        except BenchError as e:
            send({"event": "error", "variant": args.variant, "error": f"{type(e).__name__}: {e}"})
        except Exception as e:  # noqa: BLE001 - the process boundary: report any failure as one line
            return fail(e)


def worker_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cadence_fx.tools.bench.worker")
    p.add_argument("--variant", required=True)
    model_args(p)
    args = p.parse_args(argv)
    # protocol lines only on stdout: anything else printed (upstream prints) goes to stderr
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(msg: dict) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()
    return serve(args, send, sys.stdin.readline)



if __name__ == "__main__":
    sys.exit(worker_main())
