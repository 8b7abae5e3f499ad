"""What the bench does differently per model: one ``BenchModel`` class each.

A class serves the driver (variants, what a chunk is, its budget, the report's words);
an instance lives in a worker and builds, applies and streams its variant.
"""

from __future__ import annotations

import collections
import hashlib
import os
import time
from typing import Any, Callable, Mapping

from . import BenchError
from .controls import CONTROLS, apply_control, count_vendor_calls
from .stats import paired_speedups

#: Token2Wav's variants (Mimi's are ``MimiBench``'s)
RULE_VARIANTS = ("B0", "S", "R", "SR", "Rc", "SRc")
#: a Token2Wav chunk is 25 tokens at 25 Hz: one second of audio, due before the next second
CHUNK_BUDGET_MS = 1000.0


def state_sha256(state: Mapping[str, Any], n_timesteps: int | None = None) -> str:
    """SHA-256 over the carried state: each region's name, dtype, shape and bytes, by name.

    Token2Wav: stock keeps 16 flow-step slots in its estimator caches and the arena only
    the ``n_timesteps`` live ones, so those regions are hashed at ``[:n_timesteps]``.
    """
    import torch
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        if name.startswith("estimator_"):
            t = t[:n_timesteps]
        t = t.detach().cpu().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _fill(template: str, report: Mapping[str, Any]) -> str:
    return template.format_map(collections.defaultdict(lambda: None, report))


class BenchModel:
    """One model's part of the bench; the driver, worker loop, statistics and report are shared.

    The class serves the driver: which variants exist (and which need CUDA), what a chunk
    is (``unit``) and its cadence budget, the report's file stem, heading and notes.  An
    instance lives in a worker (``args``: the worker's options): it builds the stock
    model, applies a variant, and gives the chunk sequence, a chunk's PCM bytes and the
    carried state's hash.  A chunk is an ``(x, last)`` pair for ``model.stream(x,
    last_chunk=last, return_waveform=True)``, which returns the float waveform.
    """

    name = ""
    unit = "chunk"
    budget_ms = CHUNK_BUDGET_MS
    #: the budget as the report words it: (its length, what each share is of)
    budget_words = ("1 s", "each second")
    rule_variants: tuple[str, ...] = ()
    controls: Mapping[str, str] = {}
    #: variants this model has none of, and why
    refused: Mapping[str, str] = {}
    #: what the controls would do off CUDA, for the refusal
    controls_off_cuda = ""
    default_chunks = 8
    vocoder_column = False
    #: variants drawn in the duplex plot besides stock (B0) and optimized (SRc)
    duplex_plotted: tuple[str, ...] = ()

    @classmethod
    def variants(cls) -> tuple[str, ...]:
        return (*cls.rule_variants, *cls.controls)

    @classmethod
    def cuda_only(cls) -> tuple[str, ...]:
        return (*(v for v in cls.rule_variants if v not in ("B0", "S")), *cls.controls)

    @classmethod
    def check_options(cls, opts: Mapping[str, Any]) -> None:
        """Refuse options this model cannot run (a ``BenchError`` naming the option)."""

    @classmethod
    def meta(cls, opts: Mapping[str, Any]) -> dict[str, Any]:
        """The model's settings for the report."""
        return {}

    @classmethod
    def stem(cls, out: str, opts: Mapping[str, Any]) -> str:
        return os.path.join(out, f"bench-{cls.name}-{opts['device'].replace(':', '')}-{opts['dtype']}")

    @staticmethod
    def machine(report: Mapping[str, Any]) -> str:
        """Where the report was measured: the GPU's name, else the device."""
        return report.get("gpu") or report.get("device")

    #: the report title's first words (markdown), then what was measured and the plot
    #: subtitle's few words, as templates over the report's keys (a missing key prints None)
    heading: str = ""
    configuration: str = "{dtype}"
    short: str = "{dtype}"

    @classmethod
    def title(cls, report: Mapping[str, Any]) -> str:
        return (f"{cls.heading} on {cls.machine(report)}, torch {report.get('torch')}, "
                f"{_fill(cls.configuration, report)}, {report.get('date')}")

    @classmethod
    def subtitle(cls, report: Mapping[str, Any]) -> str:
        return f"{cls.machine(report)}, {_fill(cls.short, report)}"

    @classmethod
    def notes(cls, variants: Mapping[str, Mapping[str, Any]]) -> list[str]:
        return []

    @classmethod
    def targets(cls, variants: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
        """The model's issue targets, measured (None: the model states none)."""
        return None

    def __init__(self, args, spec):
        self.args, self.spec = args, spec  # spec: the model's ``registry.ModelSpec``
        self.prompt = None

    def build(self):
        """The stock streaming model on ``args.device`` (seeded weights, or ``args.checkpoint``)."""
        stock, self.prompt = self.spec.build(self.args)
        return stock

    def apply(self, stock, variant: str, say: Callable[[str], None]):
        """The model the variant streams through: ``stock`` itself, or one built from it."""
        raise NotImplementedError

    def start(self, model) -> None:
        """Begin the stream (after ``apply``, part of the setup time)."""

    def chunks(self, n: int) -> list[tuple[Any, bool]]:
        return self.spec.chunks(self.args, n, 0)

    def pcm_bytes(self, wav) -> bytes:
        from ...pcm import pcm_bytes
        return pcm_bytes(wav)

    def state_sha256(self, model) -> str:
        return state_sha256(model.state())

    def reset_counters(self, model) -> None:
        """Zero the variant's counters after the warm-up."""

    def counters(self, model) -> dict[str, Any]:
        """The variant's counters for the finish record (``vendor_*`` keys reach the report)."""
        return {}

    def vocoder_ms(self, model, stream: Callable[[], Any], device) -> float | None:
        """Time the vocoder over one chunk (``stream()`` streams it); None: not timed."""
        return None


class Token2WavBench(BenchModel):
    """Step-Audio2's Token2Wav tail: a chunk is 25 tokens, one second of audio at 25 Hz.

    Every variant streams after a ``--prompt-tokens`` prompt (``set_stream_cache``); the
    state hash covers the ``--n-timesteps`` live flow steps.
    """

    name = "token2wav"
    rule_variants = RULE_VARIANTS
    controls = CONTROLS
    vocoder_column = True

    @classmethod
    def meta(cls, opts):
        return {"n_timesteps": opts["n_timesteps"], "dtype": opts["dtype"], "prompt_tokens": opts["prompt_tokens"]}

    @classmethod
    def stem(cls, out, opts):
        return super().stem(out, opts) + f"-nt{opts['n_timesteps']}"

    heading = "**Token2Wav bench**"
    configuration = ("{dtype}, {n_timesteps} flow steps, prompt {prompt_tokens} tokens, {blocks} blocks x "
                     "{chunks} chunks")
    short = "{dtype}, {n_timesteps} steps"

    @classmethod
    def notes(cls, variants):
        """Findings the table cannot show: whether the vendor's graphs ran at all."""
        notes = []
        v = variants.get("vendor")
        if v and v.get("vendor_graph_calls") is not None:
            g, e = v["vendor_graph_calls"], v["vendor_eager_calls"]
            buckets = "/".join(str(k) for k in sorted(int(k) for k in (v.get("vendor_buckets") or {})))
            frames = "/".join(str(k) for k in sorted(int(k) for k in (v.get("vendor_call_frames") or {})))
            head = (f"vendor: {g} of {g + e} DiT estimator calls in the timed chunks replayed one of upstream's "
                    f"captured graphs (buckets of {buckets or '?'} frames; the calls had {frames or '?'} frames)")
            if g == 0:
                head += ("; its graphs were never used, so it ran the stock eager path and its numbers are stock's "
                         "plus the captured graphs' memory")
            notes.append(head)
        return notes

    def __init__(self, args, spec):
        super().__init__(args, spec)
        self.vendor_counts = None

    def apply(self, stock, variant, say):
        import cadence_fx
        if variant in RULE_VARIANTS and variant != "B0":
            return cadence_fx.optimize(stock, rules=variant, progress=say)
        if variant in CONTROLS:
            apply_control(stock, variant)
        if variant == "vendor":
            self.vendor_counts = count_vendor_calls(stock.flow.decoder.estimator)
        return stock

    def start(self, model):
        model.set_stream_cache(*self.prompt)

    def state_sha256(self, model):
        return state_sha256(model.state(), self.args.n_timesteps)

    def reset_counters(self, model):
        if self.vendor_counts is not None:
            self.vendor_counts.update(calls=0, graph=0, frames={})

    def counters(self, model):
        if self.vendor_counts is None:
            return {}
        c = self.vendor_counts
        return {"vendor_graph_calls": c["graph"], "vendor_eager_calls": c["calls"] - c["graph"],
                "vendor_call_frames": dict(c["frames"]),
                "vendor_buckets": dict(model.flow.decoder.estimator.max_size_chunk)}

    def vocoder_ms(self, model, stream, device):
        """``HiFTGenerator.forward`` over one chunk: CUDA events (CPU: wall time).

        None if the chunk made no module call to the vocoder (traced into the rule graphs).
        """
        import torch
        hift = model.hift
        inner, spans = hift.forward, []

        def forward(*args, **kwargs):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = inner(*args, **kwargs)
                end.record()
                spans.append((start, end))
            else:
                t = time.perf_counter()
                out = inner(*args, **kwargs)
                spans.append((time.perf_counter() - t) * 1e3)
            return out
        hift.forward = forward
        try:
            stream()
        finally:
            del hift.forward
        if device.type == "cuda":
            return sum(s.elapsed_time(e) for s, e in spans) if spans else None
        return sum(spans) if spans else None


#: what ``--model mimi`` measures against: the same decoder, made faster by moshi itself
MIMI_CONTROLS = {
    "vendor": "moshi's own CUDA graphs, as moshi.server runs Mimi: CUDAGraphed decoder_transformer and "
              "decoder, torch_compile_lazy apply_rope",
    "vendor-nocompile": "moshi's own CUDAGraphed decoder_transformer and decoder, under its no_compile() "
                        "(eager apply_rope: the graphs alone)",
}
#: issue 5: SRc at least 1.3x moshi's graphs, and within 1.15x of its kernel floor
MIMI_TARGETS = {"vs_vendor": 1.3, "floor_ratio": 1.15}


class MimiBench(BenchModel):
    """moshi's Mimi decoder: a chunk is one 80 ms frame, 8 codes -> 1,920 samples at 24 kHz.

    B0 is ``MimiDecoder`` (``mimi.decode`` in ``streaming(1)``, moshi's compile and graph
    switches off); S/SR/SRc are ``OptimizedMimi``; ``vendor`` is moshi's own path
    (``VendorMimi``).  The KV ring (250 slots, 2 per frame) wraps at frame 125, so the
    default 150 frames per block pass it in the first block.  float32 only.
    """

    name = "mimi"
    unit = "frame"
    budget_ms = 80.0
    budget_words = ("80 ms", "each 80 ms frame")
    rule_variants = ("B0", "S", "SR", "SRc")
    controls = MIMI_CONTROLS
    controls_off_cuda = ("CUDA graphs need CUDA: off CUDA moshi disables its CUDAGraphed wrappers and its compile, "
                         "so this would be the stock eager path, B0.")
    refused = {r: "replay over stock-managed state; moshi keeps Mimi's state in streaming dataclasses, not module "
                  "buffers: use SR or SRc" for r in ("R", "Rc")}
    default_chunks = 150
    duplex_plotted = tuple(MIMI_CONTROLS)

    @classmethod
    def check_options(cls, opts):
        if opts.get("dtype", "float32") != "float32":
            raise BenchError(f"--model mimi runs in float32 (as moshi runs Mimi); got --dtype {opts['dtype']}")

    @classmethod
    def meta(cls, opts):
        from ...integrations import moshi as mm
        return {"dtype": "float32", "unit": cls.unit, "frame_samples": mm.FRAME_SAMPLES, "sample_rate": 24000,
                "codebooks": mm.N_Q, "upstream": f"moshi {mm.UPSTREAM_VERSION}"}

    heading = "**Mimi bench** (moshi decode, one 80 ms frame = 8 codes -> 1,920 samples per chunk)"
    configuration = "float32, {blocks} blocks x {chunks} frames after {warmup} warm-up frames"
    short = "Mimi decode, float32"

    @classmethod
    def targets(cls, variants):
        """SRc against each vendor control (median over blocks of ``vendor p50 / SRc p50``), SRc's
        p50 over its kernel floor, and whether SRc replays the whole frame as one exact graph."""
        s = variants.get("SRc")
        if not s:
            return None
        vs = {}
        for name in MIMI_CONTROLS:
            v = variants.get(name)
            if v and s["block_p50_ms"] and v["block_p50_ms"]:
                vs[name] = paired_speedups([[x] for x in v["block_p50_ms"]],
                                           [[x] for x in s["block_p50_ms"]])["median"]
        fr, g = s.get("floor_ratio"), s.get("graph_launches")
        return {"vs_vendor_min": MIMI_TARGETS["vs_vendor"], "vs": vs,
                "vs_met": {n: r >= MIMI_TARGETS["vs_vendor"] for n, r in vs.items()},
                "floor_ratio_max": MIMI_TARGETS["floor_ratio"], "floor_ratio": fr,
                "floor_ratio_met": None if fr is None else fr <= MIMI_TARGETS["floor_ratio"],
                "graph_launches": g, "kernel_launches": s.get("kernel_launches"), "exact": s["exact"],
                "one_replay": None if g is None else g == 1 and s["exact"] is True}

    @classmethod
    def notes(cls, variants):
        notes = []
        for name in MIMI_CONTROLS:
            v = variants.get(name)
            if not v or v.get("vendor_graphed_calls") is None:
                continue
            calls, replays = v["vendor_graphed_calls"], v["vendor_replays"]
            graphed = " and ".join(v.get("vendor_graphed") or [])
            eager = " and ".join(v.get("vendor_eager") or [])
            rope = "torch.compile'd (moshi's torch_compile_lazy)" if v.get("vendor_compile") else "eager (no_compile)"
            line = (f"{name}: moshi's CUDAGraphed wrappers ({graphed}) replayed {replays} of their {calls} calls in "
                    f"the timed frames; {eager} run eagerly between them, as do the copies into the graphs' static "
                    f"inputs and the clone of the decoder's output; rope {rope}")
            if v.get("graph_launches") is not None:
                line += (f". The profiled frame: {v['kernel_launches']} kernels launched outside its graphs, "
                         f"{v['graph_launches']} graph launches")
            if replays == 0:
                line += ". Its graphs never replayed: its numbers are the eager path's"
            notes.append(line + ".")
        split = [f"{n} {v['kernel_launches']} + {v['graph_launches']}" for n, v in variants.items()
                 if v.get("kernel_launches") is not None and v.get("graph_launches") is not None]
        if split:
            notes.append("Launches in the profiled frame, kernels + CUDA graphs: " + "; ".join(split) + ".")
        t = cls.targets(variants)
        if t:
            said = [f"SRc is {r:.2f}x {n} (median of per-block paired ratios; target >= {t['vs_vendor_min']}x: "
                    f"{'met' if t['vs_met'][n] else 'NOT met'})" for n, r in t["vs"].items()]
            if t["floor_ratio"] is not None:
                said.append(f"SRc p50 / kernel floor {t['floor_ratio']:.2f} (target <= {t['floor_ratio_max']}: "
                            f"{'met' if t['floor_ratio_met'] else 'NOT met'})")
            if t["one_replay"] is not None:
                said.append(f"the whole frame in one exact replay: {'yes' if t['one_replay'] else 'NO'} "
                            f"({t['graph_launches']} graph launches, {t['kernel_launches']} kernels outside, "
                            f"exact {t['exact']})")
            if said:
                notes.append("Targets (issue 5): " + "; ".join(said) + ".")
        return notes

    def apply(self, stock, variant, say):
        import cadence_fx
        from ...integrations import moshi as mm
        if variant in MIMI_CONTROLS:
            return mm.VendorMimi(stock.mimi, compile=variant == "vendor")
        if variant != "B0":
            return cadence_fx.optimize(stock, rules=variant, progress=say)
        return stock

    def reset_counters(self, model):
        if hasattr(model, "graph_calls"):
            model.graph_calls.update(calls=0, replays=0)

    def counters(self, model):
        if not hasattr(model, "graph_calls"):
            return {}
        from ...integrations import moshi as mm
        return {"vendor_graphed_calls": model.graph_calls["calls"], "vendor_replays": model.graph_calls["replays"],
                "vendor_graphed": list(mm.VENDOR_GRAPHED.values()), "vendor_eager": list(mm.VENDOR_EAGER),
                "vendor_compile": model.compile}


