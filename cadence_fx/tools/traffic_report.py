"""``cadence-fx traffic``'s report as Markdown and a plot (``tools.traffic`` makes the report), and
what it gathers from the live sessions (their specializations, their working arenas)."""

from __future__ import annotations


def _classes(prepare: dict) -> str:
    """The prompt lengths a capacity refused at ``--prepare`` (another branch class) and where they run."""
    where = [(f, how) for per in (prepare.get("classes") or {}).values() for f, how in per.items()]
    if not where:
        return ""
    on = sorted({how for _, how in where if how.startswith("on ")})
    left = [f for f, how in where if not how.startswith("on ")]
    n = len(where) - len(left)
    return (f"; {n} prompt length{'s' * (n != 1)} of another branch class on {'their' if n != 1 else 'its'} "
            f"class's capacity, built and prepared there too ({', '.join(h[3:] for h in on) or 'none'})"
            + (f"; {len(left)} served by none, built for their own length when they come: {', '.join(left)}"
               if left else ""))


def _loaded(prepare: dict) -> str:
    """How many of the prepared shapes' graphs came from the program cache on disk (``capacity_build``)."""
    n = prepare.get("loaded") or 0
    return f" ({n} of them loaded from the program cache on disk)" if n else ""


def markdown(report: dict) -> str:
    lines = [f"# traffic: {report['conversations']} conversations, {report['chunks']} chunks",
             "", f"`{report['command']}`" if report["command"] else "",
             f"{report['model']}, rules {report['rules']}, {report['dtype']}, {report['n_timesteps']} steps, "
             f"{report['device']} ({report['gpu'] or 'CPU'}), torch {report['torch']}, {report['date']}", "",
             f"**exact: {report['exact']}**; program share {report['program_share']}, replayed share "
             f"{report['replayed_share']}; time to first audio p50 {report['ttfa_ms_p50']} ms (stock "
             f"{report['stock_ttfa_ms_p50']} ms); chunk p50/p99 {report['chunk_ms_p50']}/{report['chunk_ms_p99']} ms "
             f"(stock {report['stock_chunk_ms_p50']}/{report['stock_chunk_ms_p99']}); peak {report['peak_mib']} MiB",
             "", f"fallbacks: {report['fallbacks'] or 'none'}", "",
             f"off-catalog chunks: {report['off_catalog']}; capacity {report.get('capacity') or 'none'} (prompt "
             f"frames on one set of graphs); specializations built {report['specializations']['built']} "
             f"in {report['specializations']['build_s']} s, captured in {report['specializations']['capture_s']} s"
             + (f"; prepared before the traffic: {report['prepare']['served']}/{report['prepare']['shapes']} window "
                f"and flush shapes in {report['prepare']['s']} s"
                f"{_loaded(report['prepare'])}{_classes(report['prepare'])}"
                if report.get("prepare") else ""),
             "", f"background builds: {report['background']} (share of the host while chunks run: "
             f"{report['build_share']}); idle time between chunks: {report['idle']}"
             + (f" ({report['idle_s']} s in all, {report['captured_idle']} entries captured there; "
                f"{_ahead(report['specializations'])})" if report["idle"] else ""),
             "", (f"paced (voices {report['stagger_s']} s apart, chunks at the audio rate; warm-up voices "
                  f"{report['warm_up_tokens']} tokens, {report['warm_up_s']} s, before the clock): latency from arrival "
                  f"p50/p99 {report['latency_ms_p50']}/{report['latency_ms_p99']} ms (a turn's first chunk "
                  f"{report['turn_start_latency_ms_p50']}/{report['turn_start_latency_ms_p99']} ms); "
                  f"{report['stalls']} stalls, {report['stall_ms']} ms in all; stock checked after the timed run, "
                  f"state at every turn's end" if report.get("pace") else
                  "back to back, each chunk against stock in lockstep (waveform, PCM and state)"),
             "",
             "| conv | prompt | turns | chunks | exact | program | replayed | TTFA ms (stock) | p50/p99 ms |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for p in report["per_conversation"]:
        lines.append(f"| {p['conversation']} | {p['prompt_tokens']} | {p['turns']} | {p['chunks']} | {p['exact']} | "
                     f"{p['program_share']} | {p['replayed_share']} | {p['ttfa_ms']} ({p['stock_ttfa_ms']}) | "
                     f"{p['chunk_ms_p50']}/{p['chunk_ms_p99']} |")
    slow = sorted((r for r in report["per_chunk"] if "work" in r), key=lambda r: -r["ms"])[:5]
    if slow:
        lines += ["", "The slowest chunks and what each paid for besides its step (programs built, their "
                      "seconds, captures, checks taken from idle time, collections by generation):", "",
                  "| conv | turn | chunk | tokens | route | ms | built (s) | captured s | idle checks | gc |",
                  "|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
        for r in slow:
            w = r["work"]
            lines.append(f"| {r['conversation']} | {r['turn']} | {r['chunk']} | {r['tokens']}"
                         f"{' last' if r['last'] else ''} | {_cell(r['route'])} | {r['ms']:.1f} | {w['built']} "
                         f"({w['build_s']}) | {w['captured_s']} | {w.get('ahead_taken', '-')} | {w['gc']} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: a route names its shape with ``|`` (``entry 2 | token
    (1, 17), ...``), which would otherwise split the row into more columns than its header."""
    return text.replace("|", "\\|")


def plot(report: dict, path: str) -> str | None:
    """Per chunk: optimized and stock milliseconds, coloured by route; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = report["per_chunk"]
    colour = {"replay": "tab:green", "graph": "tab:blue", "fallback": "tab:red"}
    fig, ax = plt.subplots(figsize=(10, 4))
    xs = range(len(rows))
    ax.bar(xs, [r["ms"] for r in rows], color=[colour.get(r["route"].split(" ")[0].rstrip(":"), "grey") for r in rows])
    ax.plot(xs, [r["stock_ms"] for r in rows], "k.", markersize=3, label="stock")
    ax.set(yscale="log", xlabel="chunk (interleaved conversations)", ylabel="ms")
    ax.set_title(f"traffic: exact={report['exact']}, replayed {report['replayed_share']}, "
                 f"program {report['program_share']} (green replay, blue graph, red eager)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def working_arenas(live) -> list:
    """``--shared-captures``: each working arena the conversations ran on, its stats
    (``runtime.working.WorkingArena.stats``: turns, copies, captures, graphs held)."""
    seen = {}
    for c in live.values():
        working = getattr(c["session"].session, "working", None)
        if working is not None:
            seen[id(working)] = working.stats()
    return list(seen.values())


def gc_counts() -> list[int]:
    """The collector's collections so far, by generation (``gc.get_stats``)."""
    import gc
    return [g["collections"] for g in gc.get_stats()]


def chunk_work(before: dict, after: dict, gc_before: list, gc_after: list) -> dict:
    """What a chunk did besides its step, from its session's stats before and after: programs
    built (and their seconds), specialization captures (seconds), checks it took from idle
    time, and the collector's collections by generation while it ran: what a slow chunk
    paid for."""
    b, a = before.get("specializations") or {}, after.get("specializations") or {}
    out = {"built": a.get("built", 0) - b.get("built", 0),
           "build_s": round(a.get("build_s", 0.0) - b.get("build_s", 0.0), 3),
           "captured_s": round(sum(a.get("captured_here_s", {}).values())
                               - sum(b.get("captured_here_s", {}).values()), 3),
           "gc": [x - y for x, y in zip(gc_after, gc_before)]}
    if "ahead" in a:
        out["ahead_taken"] = a["ahead"]["taken_by_chunks"] - b.get("ahead", {}).get("taken_by_chunks", 0)
    return out


def _ahead(spec: dict) -> str:
    a = spec.get("ahead") or {}
    return (f"shared graphs checked there ahead of their chunks: {a.get('checked', 0)} in {a.get('s', 0.0)} s, "
            f"taken by {a.get('taken_by_chunks', 0)} chunks, {a.get('left_to_chunks', 0)} left to their chunks; "
            f"programs of a voice's own for shapes of another branch class built there: {a.get('built', 0)}")


def specializations(live: dict) -> dict:
    """Off-catalog programs over every conversation's executable: how many, build and capture
    seconds (idle time's builds among them); ``ahead``: the shared graphs' checks idle time made
    (``Session.idle``), those left to their chunks, their seconds, the chunks that took one, and
    the streams' own programs of shapes of another branch class built there (``built``) or not
    yet (``own_waiting``)."""
    built, build_s, captured_s, refused = 0, 0.0, 0.0, {}
    ahead = {"checked": 0, "left_to_chunks": 0, "s": 0.0, "taken_by_chunks": 0, "built": 0, "own_waiting": 0}
    seen = set()
    for c in live.values():
        spec = c["session"].stats().get("specializations")
        if not spec:
            continue
        captured_s += sum(spec["captured_here_s"].values())
        key = id(c["session"].session.executable)  # one Variants per executable (prompt length)
        if key in seen:
            continue
        seen.add(key)
        built += spec["built"]
        build_s += spec["build_s"]
        refused.update(spec["refused"])
        for k, v in spec.get("ahead", {}).items():
            ahead[k] += v
    ahead["s"] = round(ahead["s"], 2)
    return {"built": built, "build_s": round(build_s, 2), "capture_s": round(captured_s, 2), "refused": refused,
            "ahead": ahead}
