"""The bench report: per-variant summary from the workers' records, its markdown and plot."""

from __future__ import annotations

import json
import statistics
from typing import Any, Iterable, Mapping, Sequence

from ..registry import DEFAULT_MODEL, bench_model
from .models import CHUNK_BUDGET_MS
from .stats import paired_speedups, percentile


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
            "share_p50": percentile(share, 50) if share else None,
            "share_p90": percentile(share, 90) if share else None,
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
    spec = bench_model(meta.get("model") or DEFAULT_MODEL)
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
        p50 = percentile(all_ms, 50) if all_ms else None
        kernel = _first(recs, "kernel_ms")
        rec = {
            "p50_ms": p50,
            "p90_ms": percentile(all_ms, 90) if all_ms else None,
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



def fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _model_of(report: Mapping[str, Any]):
    return bench_model(report.get("model") or DEFAULT_MODEL)


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
        rows.append(f"| {name} | {fmt(v['p50_ms'], '.1f')} | {fmt(v['p90_ms'], '.1f')} | {speed} | "
                    f"{fmt(v['kernel_ms'], '.1f')} | {fmt(v.get('floor_ratio'), '.2f')} | " +
                    (f"{fmt(v.get('vocoder_ms'), '.1f')} | " if vocoder else "") +
                    f"{fmt(v['launches'], '.0f')} | "
                    f"{fmt(v['peak_mib'], '.0f')} | {fmt(v['compile_s'], '.1f')} | {exact} |")
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
        lines.append(f"| {name} | {fmt(v['share_p50'], '.1%')} | {fmt(v['share_p90'], '.1%')} | "
                     f"{fmt(v['share_max'], '.1%')} | {v['misses']} of {v['chunks']} |")
    pair = [n for n in (d["stock"], d["optimized"]) if n]
    if pair:
        said = [f"{n} uses {fmt(d['variants'][n]['share_p50'], '.1%')} of {each} at p50 "
                f"(max {fmt(d['variants'][n]['share_max'], '.1%')}, {d['variants'][n]['misses']} late)" for n in pair]
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



def write_report(report: dict[str, Any], stem: str, with_plot: bool) -> None:
    """``<stem>.json`` and ``<stem>.md`` (and ``<stem>.png`` with matplotlib if ``with_plot``)."""
    report["json"], report["md"] = stem + ".json", stem + ".md"
    if with_plot:
        report["png"] = plot(report, stem + ".png")
    with open(stem + ".md", "w") as f:
        f.write(report_markdown(report) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=2)

