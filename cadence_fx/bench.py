"""``cadence-fx bench``: latency, kernel floor, launches, peak memory and exactness per variant.

One long-lived worker process per variant (``python -m cadence_fx.bench --worker``), so a
variant's peak memory is its own and no variant inherits another's allocator, graphs or
compiled code.  The driver starts every worker at once: their setups (build with seeded
weights, apply the variant: optimize/trace/capture/compile, prompt, ``--warmup`` chunks)
run concurrently, and each worker says ``ready`` on stdout.  Then the driver runs the
matched blocks: block ``b`` asks every variant, in an order rotated by ``b``, for
``--chunks`` timed chunks, one worker at a time (``block B`` on the worker's stdin, one JSON
line back), so exactly one worker runs timed work at any moment while the others wait,
idle, on stdin.  ``finish`` makes a worker report and exit.  Speedups are the median over
blocks of the paired ratio ``B0_p50 / V_p50``.  A second B0 worker (``B0-replica``) streams
the same blocks, untimed for the table: ``b0_reproducible`` says whether stock gives the
same hashes in another process, the premise of every cross-process exactness verdict.

Models (``--model``; what differs is a ``BenchModel``: build, variants, the chunk, PCM, state):
``token2wav`` (a chunk is 25 tokens, 1 s of audio at 25 Hz: its budget is 1 s) and
``mimi`` (a chunk is one 80 ms frame, 8 codes -> 1,920 samples: its budget is 80 ms).

Chunks and noise are shared: every worker streams the same chunk sequence
(``synthetic_chunks`` / ``synthetic_codes``), and before streamed chunk ``i`` (warm-up
included, counted from 0) seeds ``torch.manual_seed(seed * 1000 + i)`` (CPU and CUDA
generators), so block ``b`` of every variant covers the same chunk indices and its PCM,
float waveform and carried state can be compared with B0's by SHA-256 across processes;
the finish adds the PCM hash of the whole stream, warm-up included.  On CUDA the
deterministic protocol of ``verify`` is on.  The warm-up (default 3 chunks) reaches the
steady shape: Token2Wav's chunk 0 has no crossfade partner, chunk 1 grows the attention
caches to the prompt + 100 retained frames; moshi's graphs run eagerly on their first call
and are captured on their second.

Per variant: p50/p90 ms per timed chunk; ``peak_mib`` (``torch.cuda.max_memory_allocated``
over the timed chunks; ``setup_peak_mib`` for setup and warm-up); after the blocks, for
Token2Wav, one untimed chunk times the HiFT vocoder (``vocoder_ms``: CUDA events, CPU wall
time on the CPU, around ``HiFTGenerator.forward``; None where the vocoder is traced into
the rule graphs and no module call happens), and one chunk runs under ``torch.profiler``
(CUDA): ``kernel_ms`` (GPU time of kernels, memcpy and memset: the floor), ``launches``
(kernel and graph launch API calls; ``kernel_launches`` + ``graph_launches``) and
``floor_ratio = p50_ms / kernel_ms``.  ``compile_s`` is the setup
(optimize/trace/capture/compile + prompt) plus warm-up time beyond steady speed; setups
run concurrently, so it is measured under contention (an upper bound).  The duplex view
puts each chunk's time against its cadence budget.

Variants: ``B0`` (stock), ``S``, ``R``, ``SR``, ``Rc``, ``SRc`` (``cadence_fx.optimize``
rules; Mimi has no R/Rc) and each model's CUDA-only controls (``CONTROLS``,
``MIMI_CONTROLS``).  Token2Wav's ``vendor``: the worker counts how many DiT estimator
calls replayed one of upstream's captured graphs and how many ran eagerly (upstream
captures 30/48/96-frame buckets; a streaming chunk is 50 frames).  Mimi's ``vendor``:
moshi's own ``CUDAGraphed`` decoder transformer and SEANet decoder (and its lazily
compiled rope; ``vendor-nocompile`` without it), counted call by call; the quantizer
decode and the upsample stay eager between the two graphs, and the notes say so.

Worker protocol, usable by hand::

    printf 'block 0\\nblock 1\\nfinish\\n' | python -m cadence_fx.bench --worker --variant B0 \\
        --blocks 2 --chunks 2 --prompt-tokens 5
    printf 'block 0\\nfinish\\n' | python -m cadence_fx.bench --worker --model mimi --variant S \\
        --blocks 1 --chunks 3 --warmup 1

stdout carries only protocol lines (``{"event": "ready" | "block" | "finish" | "error", ...}``);
anything else the process prints goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import CadenceError

#: Token2Wav's variants (Mimi's are ``MimiBench``'s)
RULE_VARIANTS = ("B0", "S", "R", "SR", "Rc", "SRc")
#: controls: the same stock tail, made faster by something other than cadence_fx
CONTROLS = {
    "compile-ro": "torch.compile(estimator.forward_chunk, mode='reduce-overhead', dynamic=False)",
    "compile-ro-auto": "torch.compile(estimator.forward_chunk, mode='reduce-overhead') (dynamic: default)",
    "compile": "torch.compile(estimator.forward_chunk) (default mode, dynamic=False)",
    "cudagraphs": "torch.compile(estimator.forward_chunk, backend='cudagraphs', dynamic=False)",
    "vendor": "upstream's own CUDA graphs: flow.scatter_cuda_graph(True)",
}
DEFAULT_WARMUP = 3
#: a Token2Wav chunk is 25 tokens at 25 Hz: one second of audio, due before the next second
CHUNK_BUDGET_MS = 1000.0
SETUP_TIMEOUT_S = 900.0
BLOCK_TIMEOUT_S = 300.0
#: a second, independent B0 worker streaming the same blocks: is stock reproducible across processes?
B0_REPLICA = "B0-replica"


class BenchError(CadenceError, ValueError):
    """A bench request that cannot run as asked (unknown variant, CUDA-only on CPU, ...)."""


def check_variants(variants: Sequence[str], device: str, model: str = "token2wav") -> list[str]:
    """Validate the variant list of ``model`` for ``device``; a clear error names the offending variant."""
    spec = bench_model(model)
    variants = list(variants)
    if not variants:
        raise BenchError("no variants given; e.g. --variants B0,S")
    if len(set(variants)) != len(variants):
        raise BenchError(f"duplicate variants in {','.join(variants)}")
    for v in variants:
        if v in spec.refused:
            raise BenchError(f"variant {v!r} is not built for --model {model}: {spec.refused[v]}")
        if v not in spec.variants():
            raise BenchError(f"unknown variant {v!r} for --model {model}; choose from {', '.join(spec.variants())}")
        if v in spec.cuda_only() and not device.startswith("cuda"):
            what = spec.controls.get(v, f"rules {v} (CUDA-graph replay)")
            why = f" {spec.controls_off_cuda}" if v in spec.controls and spec.controls_off_cuda else ""
            raise BenchError(f"variant {v!r} needs CUDA ({what}); this bench runs on --device {device}.{why} "
                             f"On the CPU use B0 and S.")
    return variants


def rotating_order(variants: Sequence[str], blocks: int) -> list[tuple[int, str]]:
    """Block ``b`` runs every variant once, starting at variant ``b mod n``."""
    n = len(variants)
    return [(b, variants[(b + k) % n]) for b in range(blocks) for k in range(n)]


# ---------------------------------------------------------------------------- statistics
def _percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), no numpy needed."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of no values")
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def paired_speedups(b0_blocks: Sequence[Sequence[float]], v_blocks: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per block ``b``: ``p50(B0 chunk ms of b) / p50(V chunk ms of b)``; their median.

    Blocks pair by index; unmatched trailing blocks (a failed run) are ignored.
    """
    ratios = [statistics.median(b) / statistics.median(v) for b, v in zip(b0_blocks, v_blocks) if b and v]
    return {"median": statistics.median(ratios) if ratios else None, "ratios": ratios}


def _first(recs: Iterable[Mapping[str, Any]], key: str) -> Any:
    """A per-variant value (the worker's finish record, merged into each of its block records)."""
    return next((r[key] for r in recs if r.get(key) is not None), None)


def duplex_view(chunk_ms: Mapping[str, Sequence[float]], budget_ms: float = CHUNK_BUDGET_MS) -> dict[str, Any]:
    """Each chunk's time as a share of its cadence budget, per variant (chunks in stream order).

    A share above 1.0 is a deadline miss: that second of audio came late.  ``stock`` and
    ``optimized`` name the pair the report compares (B0 and SRc), None where absent.
    """
    out: dict[str, Any] = {"budget_ms": budget_ms, "stock": "B0" if "B0" in chunk_ms else None,
                           "optimized": "SRc" if "SRc" in chunk_ms else None, "variants": {}}
    for name, ms in chunk_ms.items():
        share = [t / budget_ms for t in ms]
        out["variants"][name] = {
            "share_p50": _percentile(share, 50) if share else None,
            "share_p90": _percentile(share, 90) if share else None,
            "share_max": max(share) if share else None,
            "misses": sum(s > 1.0 for s in share),
            "chunks": len(share),
            "share_per_chunk": share,
        }
    return out


def _mismatched(rec: Mapping[str, Any], ref: Mapping[str, Any] | None) -> list[str]:
    """Which hashes of a block differ from B0's same block (all of them if B0 lacks it).

    ``stream`` (the PCM of the whole stream, warm-up included, from a worker's finish)
    is compared where both records have it: a worker cut short, or the replica, has none.
    """
    keys = (("pcm", "pcm_sha256"), ("wave", "wave_sha256"), ("state", "state_sha256"))
    if ref is None:
        return [k for k, _ in keys]
    out = [k for k, field in keys if rec.get(field) != ref.get(field)]
    if rec.get("stream_pcm_sha256") and ref.get("stream_pcm_sha256") \
            and rec["stream_pcm_sha256"] != ref["stream_pcm_sha256"]:
        out.append("stream")
    return out


def summarize(results: dict[str, list[dict[str, Any]]], meta: dict[str, Any],
              b0_replica: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The report from the workers' JSON records.

    ``results[variant]`` is the list of block records (``block``, ``chunk_ms``,
    ``pcm_sha256``, ``wave_sha256``, ``state_sha256``, and the variant's ``peak_bytes``,
    ``compile_s``, ``kernel_ms``, ``launches``, ...).  ``exact`` is None for B0 and
    otherwise whether every block's PCM, waveform and state hashes equal B0's for that
    block; ``mismatched`` names the hashes that differed in any block.
    ``b0_replica``: the block records of a second, independent B0 process;
    ``b0_reproducible`` says whether its hashes equal B0's in every block they share
    (None without a shared block).  ``meta["model"]`` (default token2wav) picks the
    cadence budget of the duplex view and the notes.
    """
    spec = bench_model(meta.get("model") or "token2wav")
    b0 = sorted(results.get("B0", []), key=lambda r: r["block"])
    b0_by_block = {r["block"]: r for r in b0}
    b0_ms = [r["chunk_ms"] for r in b0]
    out = dict(meta)
    out["variants"] = {}
    shared = [r for r in b0_replica if r["block"] in b0_by_block]
    out["b0_reproducible"] = not any(_mismatched(r, b0_by_block[r["block"]]) for r in shared) if shared else None
    out["b0_replica_p50_ms"] = [statistics.median(r["chunk_ms"]) for r in sorted(b0_replica, key=lambda r: r["block"])]
    stream_ms = {}
    for name, recs in results.items():
        recs = sorted(recs, key=lambda r: r["block"])
        all_ms = [t for r in recs for t in r["chunk_ms"]]
        stream_ms[name] = all_ms
        peaks = [r.get("peak_bytes") for r in recs if r.get("peak_bytes") is not None]
        setup_peaks = [r.get("setup_peak_bytes") for r in recs if r.get("setup_peak_bytes") is not None]
        mismatched: list[str] = []
        exact = None
        if name != "B0" and b0:
            for r in recs:
                mismatched += [k for k in _mismatched(r, b0_by_block.get(r["block"])) if k not in mismatched]
            exact = not mismatched
        sp = paired_speedups(b0_ms, [r["chunk_ms"] for r in recs]) if b0 else {"median": None, "ratios": []}
        p50 = _percentile(all_ms, 50) if all_ms else None
        kernel = _first(recs, "kernel_ms")
        rec = {
            "p50_ms": p50,
            "p90_ms": _percentile(all_ms, 90) if all_ms else None,
            "kernel_ms": kernel,
            "floor_ratio": p50 / kernel if p50 is not None and kernel else None,
            "vocoder_ms": _first(recs, "vocoder_ms"),
            "peak_mib": max(peaks) / 2**20 if peaks else None,
            "setup_peak_mib": max(setup_peaks) / 2**20 if setup_peaks else None,
            "launches": _first(recs, "launches"),
            "kernel_launches": _first(recs, "kernel_launches"),
            "graph_launches": _first(recs, "graph_launches"),
            "compile_s": _first(recs, "compile_s"),
            "setup_s": _first(recs, "setup_s"),
            "fallbacks": _first(recs, "fallbacks"),
            "exact": exact,
            "mismatched": mismatched,
            "speedup": sp["median"],
            "speedup_per_block": sp["ratios"],
            "block_p50_ms": [statistics.median(r["chunk_ms"]) for r in recs],
            "pcm_sha256": recs[0]["pcm_sha256"] if recs else None,
            "wave_sha256": recs[0]["wave_sha256"] if recs else None,
            "state_sha256": recs[0].get("state_sha256") if recs else None,
            "stream_pcm_sha256": _first(recs, "stream_pcm_sha256"),
            "blocks": len(recs),
            "chunks": len(all_ms),
        }
        for key in (recs[0] if recs else {}):  # the model's counters of a vendor path
            if key.startswith("vendor_"):
                rec[key] = recs[0][key]
        out["variants"][name] = rec
    out["duplex"] = duplex_view(stream_ms, spec.budget_ms)
    targets = spec.targets(out["variants"])
    if targets is not None:
        out["targets"] = targets
    out["notes"] = spec.notes(out["variants"])
    return out


def _token2wav_notes(variants: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Token2Wav findings the table cannot show: whether the vendor's graphs ran at all."""
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


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _model_of(report: Mapping[str, Any]) -> type[BenchModel]:
    return bench_model(report.get("model") or "token2wav")


def markdown_table(report: dict[str, Any]) -> str:
    """One row per variant; the vocoder column only for a model that times one."""
    vocoder = _model_of(report).vocoder_column
    head = ("| variant | p50 ms | p90 ms | speedup vs B0 | kernel ms | p50 / kernel | " +
            ("vocoder ms | " if vocoder else "") + "launches | peak MiB | compile s | exact |\n" +
            "|---|---:|---:|---:|---:|---:|" + ("---:|" if vocoder else "") + "---:|---:|---:|:---:|")
    rows = []
    for name, v in report["variants"].items():
        if name == "B0":
            exact = "(ref)"
        else:
            exact = {None: "n/a", True: "yes"}.get(v["exact"], f"NO ({','.join(v.get('mismatched') or [])})")
        speed = "1.00x" if name == "B0" else ("n/a" if v["speedup"] is None else f"{v['speedup']:.2f}x")
        rows.append(f"| {name} | {_fmt(v['p50_ms'], '.1f')} | {_fmt(v['p90_ms'], '.1f')} | {speed} | "
                    f"{_fmt(v['kernel_ms'], '.1f')} | {_fmt(v.get('floor_ratio'), '.2f')} | " +
                    (f"{_fmt(v.get('vocoder_ms'), '.1f')} | " if vocoder else "") +
                    f"{_fmt(v['launches'], '.0f')} | "
                    f"{_fmt(v['peak_mib'], '.0f')} | {_fmt(v['compile_s'], '.1f')} | {exact} |")
    return "\n".join([head, *rows])


def duplex_markdown(report: dict[str, Any]) -> str:
    """The duplex section: every variant's share of its unit's budget, then stock against SRc."""
    d = report["duplex"]
    spec = _model_of(report)
    budget, each = spec.budget_words
    lines = [f"### Duplex view: time per {spec.unit} as a share of its {budget} cadence budget",
             "", f"| variant | p50 share | p90 share | max share | late {spec.unit}s (share > 1) |",
             "|---|---:|---:|---:|---:|"]
    for name, v in d["variants"].items():
        lines.append(f"| {name} | {_fmt(v['share_p50'], '.1%')} | {_fmt(v['share_p90'], '.1%')} | "
                     f"{_fmt(v['share_max'], '.1%')} | {v['misses']} of {v['chunks']} |")
    pair = [n for n in (d["stock"], d["optimized"]) if n]
    if pair:
        said = [f"{n} uses {_fmt(d['variants'][n]['share_p50'], '.1%')} of {each} at p50 "
                f"(max {_fmt(d['variants'][n]['share_max'], '.1%')}, {d['variants'][n]['misses']} late)" for n in pair]
        tail = ""
        if len(pair) == 2 and d["variants"][pair[1]]["share_p50"]:
            tail = (f"; {pair[1]} leaves {1 - d['variants'][pair[1]]['share_p50']:.1%} of the budget free against "
                    f"{pair[0]}'s {1 - d['variants'][pair[0]]['share_p50']:.1%}")
        lines += ["", "; ".join(said) + tail + "."]
    return "\n".join(lines)


def report_markdown(report: dict[str, Any]) -> str:
    """The whole report as markdown: settings, the table, the duplex view, notes, failures."""
    parts = [_model_of(report).title(report), "", markdown_table(report), "", duplex_markdown(report)]
    if report.get("b0_reproducible") is not None:
        parts += ["", f"B0 reproducible in a second process (same PCM, waveform and state hashes in every "
                      f"block): {'yes' if report['b0_reproducible'] else 'NO'}"]
    for note in report.get("notes") or []:
        parts += ["", note]
    for name, why in (report.get("failures") or {}).items():
        parts += ["", f"FAILED {name}: {why}"]
    return "\n".join(parts)


def plot(report: dict[str, Any], path: str) -> str | None:
    """Latency against the kernel floor, peak memory, and the duplex view; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    spec = _model_of(report)
    budget = spec.budget_words[0]
    names = list(report["variants"])
    v = report["variants"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(8 + 1.6 * len(names), 4))
    xs = range(len(names))
    p50 = [v[n]["p50_ms"] or 0 for n in names]
    err = [max(0.0, (v[n]["p90_ms"] or 0) - (v[n]["p50_ms"] or 0)) for n in names]
    a.bar(xs, p50, yerr=[[0] * len(names), err], color="tab:blue", label="p50 (whisker: p90)")
    kern = [(i, v[n]["kernel_ms"]) for i, n in enumerate(names) if v[n]["kernel_ms"] is not None]
    if kern:
        a.scatter([i for i, _ in kern], [k for _, k in kern], marker="_", s=600, color="tab:red",
                  label="GPU kernel time (floor)", zorder=3)
    a.set_xticks(list(xs), names, rotation=30)
    a.set_ylabel(f"ms per {spec.unit}")
    a.set_title(f"latency per {spec.unit}")
    a.legend(fontsize=8)
    mem = [v[n]["peak_mib"] or 0 for n in names]
    b.bar(xs, mem, color="tab:green")
    b.set_xticks(list(xs), names, rotation=30)
    b.set_ylabel("MiB")
    b.set_title("peak allocated (n/a on CPU)" if not any(mem) else "peak allocated")
    d = report["duplex"]
    first = report.get("warmup") or 0
    for name in (d["stock"], d["optimized"], *(n for n in spec.duplex_plotted if n in d["variants"])):
        if name and d["variants"][name]["chunks"]:
            share = d["variants"][name]["share_per_chunk"]
            c.plot(range(first, first + len(share)), share, marker=".", label=name)
    c.axhline(1.0, color="tab:red", linestyle="--", label=f"{budget} budget")
    c.set_ylim(bottom=0)
    c.set_xlabel(f"{spec.unit} (stream order)")
    c.set_ylabel(f"share of the {budget} budget")
    c.set_title("duplex view")
    c.legend(fontsize=8)
    fig.suptitle(spec.subtitle(report), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- worker
def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=tuple(BENCH_MODELS), default="token2wav",
                   help="token2wav (a chunk: 25 tokens, 1 s of audio) or mimi (a chunk: one 80 ms frame, 8 codes)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--chunks", type=int, default=None,
                   help="timed chunks (mimi: frames) per block (default: token2wav 8, mimi 150: the first block "
                        "passes the KV ring's wrap at frame 125)")
    p.add_argument("--blocks", type=int, default=3, help="matched blocks; each runs every variant once")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed chunks before the blocks (default {DEFAULT_WARMUP}: until every chunk has the "
                        "steady shape)")
    p.add_argument("--prompt-tokens", type=int, default=50, help="token2wav only")
    p.add_argument("--n-timesteps", type=int, default=5, help="token2wav only")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="mimi: float32 only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--no-profile", action="store_true", help="skip the profiler chunk (CUDA)")


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _apply_control(tail, variant: str) -> None:
    """Make the stock tail's DiT estimator run through the control's mechanism (CUDA only)."""
    import torch
    est = tail.flow.decoder.estimator
    if variant == "vendor":
        with torch.inference_mode():
            tail.flow.scatter_cuda_graph(True)
        return
    inner = type(est).forward_chunk.__get__(est)
    if variant == "compile-ro":
        compiled = torch.compile(inner, mode="reduce-overhead", dynamic=False)
    elif variant == "compile-ro-auto":
        compiled = torch.compile(inner, mode="reduce-overhead")
    elif variant == "compile":
        compiled = torch.compile(inner, dynamic=False)
    elif variant == "cudagraphs":
        compiled = torch.compile(inner, backend="cudagraphs", dynamic=False)
    else:
        raise BenchError(f"unknown control {variant!r}")
    graphed = variant != "compile"

    def forward_chunk(*args, **kwargs):
        if not graphed:
            return compiled(*args, **kwargs)
        # graph outputs live in a static pool that the next replay overwrites: start a new
        # step and hand the CFM its own copies (it copies them into its cache buffers anyway)
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
    est.forward_chunk = forward_chunk


class _CountedGraph:
    """Stands in for one of upstream's captured DiT graphs and counts its replays."""

    def __init__(self, graph, counts: dict[str, Any]):
        self.graph, self.counts = graph, counts

    def replay(self) -> None:
        self.counts["graph"] += 1
        self.graph.replay()


def count_vendor_calls(estimator) -> dict[str, Any]:
    """Count the upstream DiT's ``forward_chunk`` calls and its graph replays (no upstream edits).

    Upstream replays ``estimator.graph_chunk[frames]`` when a call's frame count has a
    captured bucket and the cache fits it, and runs eagerly otherwise.  Returns the live
    counters: ``calls``, ``graph`` (replays) and ``frames`` (calls per frame count).
    """
    counts: dict[str, Any] = {"calls": 0, "graph": 0, "frames": {}}
    estimator.graph_chunk = {k: _CountedGraph(g, counts) for k, g in estimator.graph_chunk.items()}
    inner = estimator.forward_chunk

    def forward_chunk(*args, **kwargs):
        x = kwargs["x"] if "x" in kwargs else args[0]
        counts["calls"] += 1
        counts["frames"][int(x.shape[2])] = counts["frames"].get(int(x.shape[2]), 0) + 1
        return inner(*args, **kwargs)
    estimator.forward_chunk = forward_chunk
    return counts


def _profile_chunk(model, tokens, last, device) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------- models
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

    @classmethod
    def title(cls, report: Mapping[str, Any]) -> str:
        raise NotImplementedError

    @classmethod
    def subtitle(cls, report: Mapping[str, Any]) -> str:
        return f"{cls.machine(report)}, {cls.name}, {report.get('dtype')}"

    @classmethod
    def notes(cls, variants: Mapping[str, Mapping[str, Any]]) -> list[str]:
        return []

    @classmethod
    def targets(cls, variants: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
        """The model's issue targets, measured (None: the model states none)."""
        return None

    def __init__(self, args):
        self.args = args

    def build(self):
        """The stock streaming model on ``args.device`` (seeded weights, or ``args.checkpoint``)."""
        raise NotImplementedError

    def apply(self, stock, variant: str, say: Callable[[str], None]):
        """The model the variant streams through: ``stock`` itself, or one built from it."""
        raise NotImplementedError

    def start(self, model) -> None:
        """Begin the stream (after ``apply``, part of the setup time)."""

    def chunks(self, n: int) -> list[tuple[Any, bool]]:
        raise NotImplementedError

    def pcm_bytes(self, wav) -> bytes:
        raise NotImplementedError

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

    @classmethod
    def title(cls, report):
        return (f"**Token2Wav bench** on {cls.machine(report)}, torch {report.get('torch')}, "
                f"{report.get('dtype')}, {report.get('n_timesteps')} flow steps, prompt {report.get('prompt_tokens')} "
                f"tokens, {report.get('blocks')} blocks x {report.get('chunks')} chunks, {report.get('date')}")

    @classmethod
    def subtitle(cls, report):
        return f"{cls.machine(report)}, {report.get('dtype')}, {report.get('n_timesteps')} steps"

    @classmethod
    def notes(cls, variants):
        return _token2wav_notes(variants)

    def __init__(self, args):
        super().__init__(args)
        self.prompt = None
        self.vendor_counts = None

    def build(self):
        from .cli import _build
        tail, self.prompt = _build(self.args)
        return tail

    def apply(self, stock, variant, say):
        import cadence_fx
        if variant in RULE_VARIANTS and variant != "B0":
            return cadence_fx.optimize(stock, rules=variant, progress=say)
        if variant in CONTROLS:
            _apply_control(stock, variant)
        if variant == "vendor":
            self.vendor_counts = count_vendor_calls(stock.flow.decoder.estimator)
        return stock

    def start(self, model):
        model.set_stream_cache(*self.prompt)

    def chunks(self, n):
        from .integrations import stepaudio2 as s2
        return s2.synthetic_chunks(n, self.args.seed)

    def pcm_bytes(self, wav):
        from .integrations import stepaudio2 as s2
        return s2.pcm_bytes(wav)

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
        from .integrations import moshi as mm
        return {"dtype": "float32", "unit": cls.unit, "frame_samples": mm.FRAME_SAMPLES, "sample_rate": 24000,
                "codebooks": mm.N_Q, "upstream": f"moshi {mm.UPSTREAM_VERSION}"}

    @classmethod
    def title(cls, report):
        return (f"**Mimi bench** (moshi decode, one 80 ms frame = 8 codes -> 1,920 samples per chunk) on "
                f"{cls.machine(report)}, torch {report.get('torch')}, float32, "
                f"{report.get('blocks')} blocks x {report.get('chunks')} frames after {report.get('warmup')} "
                f"warm-up frames, {report.get('date')}")

    @classmethod
    def subtitle(cls, report):
        return f"{cls.machine(report)}, Mimi decode, float32"

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

    def build(self):
        from .cli import _build_mimi
        return _build_mimi(self.args)

    def apply(self, stock, variant, say):
        import cadence_fx
        from .integrations import moshi as mm
        if variant in MIMI_CONTROLS:
            return mm.VendorMimi(stock.mimi, compile=variant == "vendor")
        if variant != "B0":
            return cadence_fx.optimize(stock, rules=variant, progress=say)
        return stock

    def chunks(self, n):
        from .integrations import moshi as mm
        return mm.synthetic_codes(n, self.args.seed)

    def pcm_bytes(self, wav):
        from .integrations import moshi as mm
        return mm.pcm_bytes(wav)

    def reset_counters(self, model):
        if hasattr(model, "graph_calls"):
            model.graph_calls.update(calls=0, replays=0)

    def counters(self, model):
        if not hasattr(model, "graph_calls"):
            return {}
        from .integrations import moshi as mm
        return {"vendor_graphed_calls": model.graph_calls["calls"], "vendor_replays": model.graph_calls["replays"],
                "vendor_graphed": list(mm.VENDOR_GRAPHED.values()), "vendor_eager": list(mm.VENDOR_EAGER),
                "vendor_compile": model.compile}


BENCH_MODELS: dict[str, type[BenchModel]] = {"token2wav": Token2WavBench, "mimi": MimiBench}


def bench_model(name: str) -> type[BenchModel]:
    if name not in BENCH_MODELS:
        raise BenchError(f"unknown model {name!r}; choose from {', '.join(BENCH_MODELS)}")
    return BENCH_MODELS[name]


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
        from .verify import deterministic_protocol
        check_variants([args.variant], args.device, args.model)
        spec = bench_model(args.model)
        spec.check_options(vars(args))
        args.chunks = args.chunks or spec.default_chunks
        self.args = args
        self.device = torch.device(args.device)
        if self.device.type == "cuda":
            deterministic_protocol()
        self.bm = spec(args)
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
        torch.manual_seed(self.args.seed * 1000 + i)  # seeds the CUDA generators too
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
                "build_s": self.build_s, "setup_s": self.setup_s, "warmup_ms": self.warmup_ms,
                "setup_peak_bytes": self.setup_peak}

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
                               "setup_s": self.setup_s, "warmup_ms": self.warmup_ms}
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
            torch.manual_seed(a.seed * 1000 + i + 1)
            rec.update(_profile_chunk(self.model, x, last, self.device))
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
    p = argparse.ArgumentParser(prog="python -m cadence_fx.bench --worker")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--variant", required=True)
    _model_args(p)
    args = p.parse_args(argv)
    # protocol lines only on stdout: anything else printed (upstream prints) goes to stderr
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(msg: dict) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()
    return serve(args, send, sys.stdin.readline)


# ---------------------------------------------------------------------------- driver
def _worker_cmd(python: str, variant: str, opts: dict[str, Any]) -> list[str]:
    cmd = [python, "-m", "cadence_fx.bench", "--worker", "--variant", variant]
    for k, v in opts.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        cmd += [flag] if v is True else [flag, str(v)]
    return cmd


@dataclasses.dataclass
class _Worker:
    name: str  # the variant, or B0_REPLICA
    proc: subprocess.Popen
    log: str
    ready: dict | None = None
    finished: bool = False  # answered finish: its exit is expected
    failure: str | None = None


class WorkerFleet:
    """The variant workers of one bench run: started together, then spoken to one at a time.

    Each worker's stdout lines arrive on one queue (a reader thread per worker), so every
    wait has a deadline and notices a worker that died while idle.  A worker that fails
    (error reply, exit, timeout) is killed and its reason kept; the others go on.  Each
    worker leads its own process group, so ``close`` kills it with whatever it spawned
    (torch.compile's helpers).  stderr goes to ``<log_dir>/<name>.log``.
    """

    def __init__(self, commands: Mapping[str, list[str]], env: Mapping[str, str], log_dir: str,
                 say: Callable[[str], None]):
        self.say = say
        self.events: queue.Queue = queue.Queue()
        self.workers: dict[str, _Worker] = {}
        self.t0 = time.perf_counter()
        os.makedirs(log_dir, exist_ok=True)
        try:
            for name, cmd in commands.items():
                log = os.path.join(log_dir, f"{name}.log")
                with open(log, "w") as f:
                    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f, text=True,
                                            env=dict(env), start_new_session=True)
                self.workers[name] = _Worker(name, proc, log)
                threading.Thread(target=self._pump, args=(name, proc.stdout), daemon=True).start()
        except BaseException:
            self.close()  # the ones already started
            raise

    def _pump(self, name: str, stream) -> None:
        for line in stream:
            self.events.put((name, line))
        self.events.put((name, None))

    def live(self) -> list[str]:
        return [v for v, w in self.workers.items() if w.failure is None]

    def failures(self) -> dict[str, str]:
        return {v: w.failure for v, w in self.workers.items() if w.failure is not None}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _log_tail(self, w: _Worker) -> str:
        try:
            with open(w.log) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            lines = []
        return f"{lines[-1] if lines else 'no output'} (log: {w.log})"

    def _fail(self, w: _Worker, reason: str) -> None:
        if w.failure is None:
            w.failure = reason
            self._kill(w)
            self.say(f"{w.name} FAILED: {reason}")

    @staticmethod
    def _kill(w: _Worker) -> None:
        """SIGKILL the worker's process group, then reap the worker.

        Only while the worker is unreaped (``returncode`` None): until then its pid, and so
        its group id, cannot belong to anyone else.
        """
        if w.proc.returncode is None:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            w.proc.wait()

    def _next(self, deadline: float) -> tuple[str, dict] | None:
        """The next protocol message from a live worker, or None at the deadline.

        Failures on the way (an error reply, an exit) are recorded and skipped.
        """
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            try:
                name, line = self.events.get(timeout=left)
            except queue.Empty:
                return None
            w = self.workers[name]
            if w.failure is not None or w.finished:
                continue
            if line is None:
                self._kill(w)  # reaps it, and whatever it left in its process group
                self._fail(w, f"exited (rc={w.proc.returncode}): {self._log_tail(w)}")
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not a protocol line
            if not isinstance(msg, dict):
                continue
            if msg.get("event") == "error":
                self._fail(w, f"{msg.get('error')} (log: {w.log})")
                continue
            return name, msg

    def wait_ready(self, timeout: float) -> None:
        """Wait until every worker is ready or failed; past ``timeout`` the pending ones fail."""
        deadline = time.perf_counter() + timeout
        while True:
            pending = [w for w in self.workers.values() if w.ready is None and w.failure is None]
            if not pending:
                return
            got = self._next(deadline)
            if got is None:
                for w in pending:
                    self._fail(w, f"setup timed out after {timeout:.0f} s: {self._log_tail(w)}")
                return
            name, msg = got
            if msg.get("event") == "ready":
                self.workers[name].ready = msg
                n = sum(w.ready is not None for w in self.workers.values())
                self.say(f"{name} ready after {self.elapsed():.0f} s (build {msg.get('build_s', 0):.1f} s, "
                         f"setup {msg.get('setup_s', 0):.1f} s) [{n}/{len(self.workers)} ready]")

    def ask(self, name: str, command: str, timeout: float) -> dict | None:
        """Send one command line to a worker and wait for its reply; None if it failed."""
        w = self.workers[name]
        if w.failure is not None:
            return None
        try:
            w.proc.stdin.write(command + "\n")
            w.proc.stdin.flush()
        except OSError:
            self._fail(w, f"exited before '{command}': {self._log_tail(w)}")
            return None
        deadline = time.perf_counter() + timeout
        while w.failure is None:
            got = self._next(deadline)
            if got is None:
                self._fail(w, f"'{command}' timed out after {timeout:.0f} s: {self._log_tail(w)}")
                return None
            src, msg = got
            if src == name:
                return msg
        return None

    def finish(self, name: str, timeout: float) -> dict | None:
        """``finish`` a worker and reap it."""
        msg = self.ask(name, "finish", timeout)
        w = self.workers[name]
        if msg is not None:
            w.finished = True
            try:
                w.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill(w)
        return msg

    def close(self) -> None:
        """Kill every worker still running (with its process group) and reap them all."""
        for w in self.workers.values():
            self._kill(w)
            try:
                w.proc.stdin.close()
            except OSError:
                pass


def _worker_env() -> dict[str, str]:
    """The driver's environment, with this cadence_fx first on the path and cuBLAS made deterministic."""
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def write_report(report: dict[str, Any], stem: str, with_plot: bool) -> None:
    """``<stem>.json`` and ``<stem>.md`` (and ``<stem>.png`` with matplotlib if ``with_plot``)."""
    report["json"], report["md"] = stem + ".json", stem + ".md"
    if with_plot:
        report["png"] = plot(report, stem + ".png")
    with open(stem + ".md", "w") as f:
        f.write(report_markdown(report) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=2)


def run_bench(variants: Sequence[str], *, model: str = "token2wav", device: str = "cpu", chunks: int | None = None,
              blocks: int = 3,
              warmup: int = DEFAULT_WARMUP, prompt_tokens: int = 50, n_timesteps: int = 5, dtype: str = "float32",
              seed: int = 0, checkpoint: str | None = None, out: str | None = None, profile: bool = True,
              setup_timeout: float = SETUP_TIMEOUT_S, block_timeout: float = BLOCK_TIMEOUT_S,
              python: str = sys.executable, command: str | None = None,
              worker_command: Callable[[str], list[str]] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the variants of ``model`` in their own worker processes; summarize; write JSON/markdown/PNG into ``out``.

    ``chunks``: timed chunks per block (None: the model's default; a Mimi chunk is one
    80 ms frame).  ``prompt_tokens`` and ``n_timesteps`` are Token2Wav's.
    ``worker_command(variant)`` gives a worker's command line (default: this module's
    ``--worker`` with the options above).  With ``out`` the report is rewritten after
    every block and every finish (``"complete": false`` until the end), so a run cut
    short keeps its data.
    """
    spec = bench_model(model)
    variants = check_variants(variants, device, model)
    if "B0" not in variants:
        variants = ["B0", *variants]  # speedups and exactness are against B0
    chunks = spec.default_chunks if chunks is None else chunks
    if chunks < 1 or blocks < 1 or warmup < 0:
        raise BenchError("--chunks and --blocks must be >= 1, --warmup >= 0")
    opts = dict(model=model, device=device, chunks=chunks, blocks=blocks, warmup=warmup, prompt_tokens=prompt_tokens,
                n_timesteps=n_timesteps, dtype=dtype, seed=seed, checkpoint=checkpoint, no_profile=not profile)
    spec.check_options(opts)
    worker_command = worker_command or (lambda v: _worker_cmd(python, v, opts))
    say = progress or (lambda m: print(f"[cadence-fx bench] {m}", file=sys.stderr, flush=True))
    order = rotating_order(variants, blocks)
    meta = {
        "model": model, "gpu": None, "torch": None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv), "device": device, **spec.meta(opts),
        "chunks": chunks, "blocks": blocks, "warmup": warmup, "seed": seed,
        "order": [f"{b}:{v}" for b, v in order], "deterministic_protocol": device.startswith("cuda"),
        "budget_ms": spec.budget_ms, "setup": "concurrent (all workers at once)",
    }
    stem = spec.stem(out, opts) if out else None
    log_dir = os.path.join(out, "logs") if out else tempfile.mkdtemp(prefix="cadence-fx-bench-")
    meta["logs"] = log_dir
    names = [*variants, B0_REPLICA]
    done: dict[str, list[dict]] = {n: [] for n in names}
    finals: dict[str, dict] = {}

    def current_report(complete: bool) -> dict[str, Any]:
        ready = [w.ready for w in fleet.workers.values() if w.ready]
        meta.update(gpu=next((r.get("gpu") for r in ready), None),
                    torch=next((r.get("torch") for r in ready), None),
                    failures=fleet.failures(), complete=complete, elapsed_s=round(fleet.elapsed(), 1))
        recs = {v: [{**_setup_fields(fleet.workers[v].ready), **finals.get(v, {}), **r} for r in done[v]]
                for v in variants if done[v]}
        return summarize(recs, meta, b0_replica=done[B0_REPLICA])

    say(f"starting {len(names)} workers ({', '.join(names)}); logs in {log_dir}")
    fleet = WorkerFleet({n: worker_command("B0" if n == B0_REPLICA else n) for n in names}, _worker_env(),
                        log_dir, say)
    try:
        fleet.wait_ready(setup_timeout)
        for b in range(blocks):
            for name in [v for bb, v in order if bb == b] + [B0_REPLICA]:
                msg = fleet.ask(name, f"block {b}", block_timeout)
                if msg is None:
                    continue
                done[name].append(msg)
                say(f"block {b + 1}/{blocks} {name}: p50 {statistics.median(msg['chunk_ms']):.1f} ms "
                    f"[{fleet.elapsed():.0f} s]")
            if stem:
                write_report(current_report(False), stem, with_plot=False)
        for v in [v for v in variants if v in fleet.live()]:
            msg = fleet.finish(v, block_timeout)
            if msg is not None:
                finals[v] = {k: x for k, x in msg.items() if k not in ("event", "variant")}
                peak = msg.get("peak_bytes")
                say(f"{v} finished: kernel {_fmt(msg.get('kernel_ms'), '.1f')} ms, peak "
                    f"{_fmt(None if peak is None else peak / 2**20, '.0f')} MiB [{fleet.elapsed():.0f} s]")
                if stem:  # a run cut short keeps every finish it got
                    write_report(current_report(False), stem, with_plot=False)
    finally:
        fleet.close()
    report = current_report(True)
    if stem:
        write_report(report, stem, with_plot=True)
    say(f"done in {fleet.elapsed():.0f} s")
    return report


def _setup_fields(ready: dict | None) -> dict[str, Any]:
    """What a ready message says about the variant (until its finish says more)."""
    return {k: ready[k] for k in ("build_s", "setup_s", "setup_peak_bytes") if k in ready} if ready else {}


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The ``bench`` options (for wiring into the ``cadence-fx`` CLI)."""
    p.add_argument("--variants", default="B0,S",
                   help="comma-separated; " + "; ".join(
                       f"{m}: {','.join(spec.variants())} (CUDA only: {','.join(spec.cuda_only())})"
                       for m, spec in BENCH_MODELS.items()))
    p.add_argument("--out", default=None, help="directory for the JSON, markdown, PNG (with matplotlib) and "
                                               "the workers' logs")
    p.add_argument("--json", action="store_true", help="last stdout line: the report as JSON")
    p.add_argument("--setup-timeout", type=float, default=SETUP_TIMEOUT_S,
                   help=f"seconds for every worker to be ready (default {SETUP_TIMEOUT_S:.0f})")
    p.add_argument("--block-timeout", type=float, default=BLOCK_TIMEOUT_S,
                   help=f"seconds for one block (and for the finish) of one worker (default {BLOCK_TIMEOUT_S:.0f})")
    _model_args(p)


def cmd_bench(args) -> int:
    # SIGTERM (``timeout``, a job scheduler) unwinds like Ctrl-C, so the workers are killed too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = run_bench([v.strip() for v in args.variants.split(",") if v.strip()], model=args.model,
                           device=args.device,
                           chunks=args.chunks, blocks=args.blocks, warmup=args.warmup,
                           prompt_tokens=args.prompt_tokens, n_timesteps=args.n_timesteps, dtype=args.dtype,
                           seed=args.seed, checkpoint=args.checkpoint, out=args.out, profile=not args.no_profile,
                           setup_timeout=args.setup_timeout, block_timeout=args.block_timeout)
    except BenchError as e:
        print(f"cadence-fx bench: {e}", file=sys.stderr)
        return 2
    print(report_markdown(report))
    if report.get("json"):
        print(f"\nJSON: {report['json']}  markdown: {report['md']}" +
              (f"  PNG: {report['png']}" if report.get("png") else "  (no PNG: matplotlib not importable)"))
    if args.json:
        print(json.dumps(report))
    ok = not report["failures"] and all(v["exact"] is not False for v in report["variants"].values())
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        return worker_main(argv)
    p = argparse.ArgumentParser(prog="python -m cadence_fx.bench", description=__doc__.splitlines()[0])
    add_bench_args(p)
    return cmd_bench(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
