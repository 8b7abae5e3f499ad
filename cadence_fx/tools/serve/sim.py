"""``serve-sim``: N conversations on a virtual clock of ticks, stock against optimized.

Every tick, each *speaking* session turns its next chunk into PCM (Token2Wav: 1 s;
Mimi: one 80 ms frame); a tick's wall time (its SPEAK time) must stay under the
audio it makes (``SimConfig.budget_ms``) or the tick misses its deadline.  Nothing sleeps: a tick's SPEAK time is measured and compared with the budget.
``stock`` runs one stock model per session (its own weights and state buffers, as
upstream serves one stream per model); ``optimized`` one optimized model with N
sessions.  Before chunk ``k`` of session ``i`` both seed ``chunk_seed(seed, i, k)``, so
each session's PCM can be compared across the modes by SHA-256.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import os
import random
import time
from typing import Any, Callable, Iterable, Sequence

from ...errors import InputError
from ...runtime.counters import sum_setup
from ..bench.stats import percentile
from ..registry import SeededFrames, ServeHooks, TokenChunks

CHUNK_SECONDS = 1.0  # Token2Wav: 25 tokens at 25 Hz -> 50 mel frames -> 24,000 samples (the default budget)
MIXES = ("speak-heavy", "mixed")
MODES = ("stock", "optimized")


def chunk_seed(seed: int, session: int, chunk: int) -> int:
    """The generator seed set before chunk ``chunk`` of session ``session`` (both modes)."""
    return (seed * 1_000_003 + session * 100_003 + chunk) % (2 ** 62)


def start_stock(tail, prompt) -> None:
    """A new stream on a stock model: its prompt set up (Token2Wav), or reset (a frame codec)."""
    if prompt is None:
        tail.reset()
    else:
        tail.set_stream_cache(*prompt)


class TokenFeed:
    """Session ``i``'s speech tokens: chunk ``k`` is tokens ``n k .. n (k + 1) + a`` of one
    seeded endless sequence (``n`` new tokens a chunk; its ``a`` lookahead tokens are the
    next chunk's first ``a``).  Given ``SeededFrames`` instead (frames that are not token
    ids), chunk ``k`` is ``frame(seed, i, k)``."""

    def __init__(self, seed: int, session: int, tokens: "TokenChunks | SeededFrames"):
        import torch
        self._frames = None if isinstance(tokens, TokenChunks) else tokens
        self._seed, self._session = seed, session
        self._gen = torch.Generator().manual_seed(30_000 + seed * 10_007 + session)
        self._tokens: list[int] = []
        if self._frames is None:
            self._vocab, self._chunk, self._look = tokens.vocab, tokens.new, tokens.lookahead
        self.next_chunk = 0

    def chunk(self, k: int):
        import torch
        if self._frames is not None:
            return self._frames.frame(self._seed, self._session, k)
        need = self._chunk * k + self._chunk + self._look
        while len(self._tokens) < need:
            self._tokens += torch.randint(0, self._vocab, (1024,), generator=self._gen).tolist()
        return self._tokens[self._chunk * k: need]

    def take(self) -> tuple[int, list[int]]:
        """The next chunk's index and tokens."""
        k = self.next_chunk
        self.next_chunk += 1
        return k, self.chunk(k)


def speaking_schedule(mix: str, n_sessions: int, ticks: int, seed: int, p_speak: float = 0.5) -> list[list[int]]:
    """Per tick, the sessions that speak (the others listen: their tails idle that tick)."""
    if mix not in MIXES:
        raise InputError(f"unknown mix {mix!r}; choose one of {', '.join(MIXES)}")
    if mix == "speak-heavy":
        return [list(range(n_sessions)) for _ in range(ticks)]
    rng = random.Random(seed * 7919 + n_sessions)
    return [[i for i in range(n_sessions) if rng.random() < p_speak] for _ in range(ticks)]


def sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _memory_reset(device) -> None:
    import torch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device) -> int | None:
    import torch
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def peak_of(streams, device) -> int | None:
    """The peak device memory since the last reading: this process's, or (streams that
    serve elsewhere: ``RayStreams``) what ``streams.peak_memory()`` reads from its replicas."""
    read = getattr(streams, "peak_memory", None)
    return read() if read is not None else _peak_memory(device)


def allocated(device) -> int | None:
    import torch
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None


def rss_bytes() -> int | None:
    """This process's resident set (Linux), for CPU runs; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def ms_summary(xs: Sequence[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    return {"mean": round(sum(xs) / len(xs), 3), "p50": round(percentile(xs, 50), 3),
            "p99": round(percentile(xs, 99), 3), "max": round(max(xs), 3)}


# ------------------------------------------------------------------ the two modes
class StockStreams:
    """N stock tails, one per session (upstream keeps one stream per ``Token2wav``)."""

    name = "stock"

    def __init__(self, make_stock: Callable[[int], Any]):
        self.make_stock = make_stock
        self.tails: list[Any] = []

    def open(self, i: int, prompt) -> None:
        tail = self.make_stock(i)
        start_stock(tail, prompt)
        self.tails.append(tail)

    def run_tick(self, work: list[tuple[int, list[int], int]]) -> list[bytes]:
        import torch
        out = []
        for i, tokens, seed in work:
            torch.manual_seed(seed)
            out.append(self.tails[i].stream(tokens))
        return out

    def report(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.tails.clear()


class OptimizedStreams:
    """One optimized model, N sessions; with ``overlap`` (CUDA) each on its own stream."""

    name = "optimized"

    def __init__(self, model, overlap: bool = False, weights_bytes: Callable[[Any], int] | None = None):
        self.model, self.overlap, self.weights_bytes = model, overlap, weights_bytes
        self.sessions: list[Any] = []

    def open(self, i: int, prompt) -> None:
        import torch
        stream = torch.cuda.Stream(self.model.device) if self.overlap and self.model.device.type == "cuda" else None
        self.sessions.append(self.model.open_session(*(prompt or ()), stream=stream))

    def run_tick(self, work: list[tuple[int, list[int], int]]) -> list[bytes]:
        import torch
        if not self.overlap:
            out = []
            for i, tokens, seed in work:
                torch.manual_seed(seed)
                out.append(self.sessions[i].stream(tokens))
            return out
        from ...serving import run_tick  # launch every session's chunk, then wait for each
        # seeded right before each launch (read on the host then): the draws do not depend on overlap
        return run_tick([(self.sessions[i], tokens) for i, tokens, _ in work],
                        before_submit=lambda n: torch.manual_seed(work[n][2]))

    def report(self) -> dict[str, Any]:
        fallbacks: dict[str, int] = {}
        for s in self.sessions:
            for reason, n in s.stats()["fallbacks"].items():
                fallbacks[reason] = fallbacks.get(reason, 0) + n
        capture_failures = {s.name: f for s in self.sessions if s.session is not None
                            for f in [{i: r for i, r in s.session.capture_failures.items() if r}] if f}
        weights = self.weights_bytes(self.model) if self.weights_bytes else None
        return {"weights_bytes": weights,
                "arena_bytes_per_session": self.sessions[0].arena_bytes if self.sessions else None,
                "fallbacks": fallbacks, "capture_failures": capture_failures,
                "setup_split": sum_setup([s.stats().get("setup_s") for s in self.sessions]),
                "stats": [s.stats() for s in self.sessions]}

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        self.sessions.clear()


@dataclasses.dataclass
class SimConfig:
    seconds: int
    mix: str = "speak-heavy"
    seed: int = 0
    warmup_ticks: int = 1
    budget_ms: float = 1000.0 * CHUNK_SECONDS
    profile: bool = False  # CUDA: one more tick (every session speaks) under torch.profiler per run or N


def device_time(events) -> dict[str, float | int]:
    """Kernel (and copy) time of a profiled tick from ``torch.profiler`` events on the
    device: the sum of their durations, the time the device was busy with any of them
    (the union of their intervals), and their ratio (how many ran at once, on average)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.time_range.end > e.time_range.start)
    busy, end = 0.0, None
    start = None
    for s, e in spans:
        if end is None or s > end:
            if end is not None:
                busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        busy += end - start
    kernel = sum(e - s for s, e in spans)
    return {"device_ops": len(spans), "kernel_ms": round(kernel / 1e3, 3), "gpu_busy_ms": round(busy / 1e3, 3),
            "concurrency": round(kernel / busy, 3) if busy else None}


def profiled_tick(streams, work: list, device) -> tuple[list[bytes], dict[str, Any]]:
    """One tick under ``torch.profiler`` (CUDA activity): its PCM and ``device_time``, with
    the tick's wall time (profiler overhead included) and the share of it the GPU was
    busy.  ``torch.profiler`` reports no SM occupancy (that needs CUPTI metrics, e.g.
    Nsight Compute): ``concurrency`` is what it does tell."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        pcm = streams.run_tick(work)
        sync(device)
        wall = (time.perf_counter() - t0) * 1e3
    cuda = torch.autograd.DeviceType.CUDA
    out = device_time([e for e in prof.events() if e.device_type == cuda])
    out.update(tick_ms=round(wall, 3), busy_share=round(out["gpu_busy_ms"] / wall, 3) if wall else None,
               sessions=len(work), sm_occupancy=None)
    return pcm, out


def take_work(feeds: list[TokenFeed], speakers: Iterable[int], seed: int) -> list[tuple[int, Any, int]]:
    """A tick's work: ``(session, its next chunk, that chunk's seed)`` per speaker."""
    work = []
    for i in speakers:
        k, tokens = feeds[i].take()
        work.append((i, tokens, chunk_seed(seed, i, k)))
    return work


def record(hashes: list[Any], work: list[tuple[int, Any, int]], pcm: list[bytes]) -> None:
    """Each speaker's PCM into its session's running hash."""
    for (i, _, _), b in zip(work, pcm):
        hashes[i].update(b)


def run_ticks(streams, feeds: list[TokenFeed], n_sessions: int, cfg: SimConfig, device,
              hashes: list[Any]) -> dict[str, Any]:
    """``cfg.warmup_ticks + cfg.seconds`` ticks of ``n_sessions`` (untimed warm-up ticks first)."""
    ticks = cfg.warmup_ticks + cfg.seconds
    schedule = speaking_schedule(cfg.mix, n_sessions, ticks, cfg.seed)
    speak_ms, chunks = [], 0
    for t, speakers in enumerate(schedule):
        work = take_work(feeds, speakers, cfg.seed)
        sync(device)
        t0 = time.perf_counter()
        pcm = streams.run_tick(work)
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        record(hashes, work, pcm)
        chunks += len(work)
        if t >= cfg.warmup_ticks and work:  # a tick where nobody speaks has no deadline
            speak_ms.append(ms)
    misses = sum(1 for ms in speak_ms if ms > cfg.budget_ms)
    out = {"ticks": cfg.seconds, "speaking_ticks": len(speak_ms), "chunks": chunks,
           "speak_ms": ms_summary(speak_ms), "deadline_misses": misses,
           "holds_cadence": misses == 0, "speak_ms_per_tick": [round(x, 3) for x in speak_ms]}
    if cfg.profile and device.type == "cuda":  # untimed: after the timed ticks, every session speaks
        work = take_work(feeds, range(n_sessions), cfg.seed)
        pcm, out["profile"] = profiled_tick(streams, work, device)
        record(hashes, work, pcm)
        out["chunks"] += len(work)
    return out


def simulate(mode: str, factory: Callable[[], Any], make_prompt: Callable[[int], tuple], n_sessions: int,
             cfg: SimConfig, device, tokens: TokenChunks) -> dict[str, Any]:
    """One fixed-N run of one mode: open ``n_sessions``, run the ticks, report.

    ``factory()`` returns the mode's streams object (``StockStreams`` or
    ``OptimizedStreams``); it and everything it holds are dropped afterwards.  Peak
    memory counts from after ``factory()``: the weights, what the sessions open
    (arenas, graphs; stock: whole tails) and the ticks' work.
    """
    import torch
    streams = factory()
    _memory_reset(device)  # after the model is built: what it was built from is freed, not counted
    t0 = time.perf_counter()
    feeds = [TokenFeed(cfg.seed, i, tokens) for i in range(n_sessions)]
    hashes = [hashlib.sha256() for _ in range(n_sessions)]
    status = "ok"
    try:
        for i in range(n_sessions):
            streams.open(i, make_prompt(i))
        setup_s = time.perf_counter() - t0
        result = run_ticks(streams, feeds, n_sessions, cfg, device, hashes)
    except torch.OutOfMemoryError as e:
        status, setup_s, result = f"out of memory: {str(e).splitlines()[0]}", time.perf_counter() - t0, {}
    report = {"mode": mode, "sessions": n_sessions, "status": status, "setup_s": round(setup_s, 2), **result,
              "peak_memory_bytes": peak_of(streams, device), "rss_bytes": rss_bytes(),
              "pcm_sha256": [h.hexdigest() for h in hashes], **(streams.report() if status == "ok" else {})}
    streams.close()
    del streams
    _memory_reset(device)
    return report


def sweep_sizes(max_sessions: int, points: Sequence[int] | None = None) -> list[int]:
    """The N a sweep measures: ``points`` (ascending, each in 1..``max_sessions``), else 1, 2, ..."""
    if not points:
        return list(range(1, max_sessions + 1))
    sizes = list(points)
    if any(not isinstance(n, int) or n < 1 for n in sizes) or sizes != sorted(set(sizes)):
        raise InputError(f"sweep points {sizes}: give distinct session counts >= 1 in ascending order")
    if sizes[-1] > max_sessions:
        raise InputError(f"sweep point {sizes[-1]} is above --max-sessions {max_sessions}")
    return sizes


def sweep(mode: str, factory: Callable[[], Any], make_prompt: Callable[[int], tuple], cfg: SimConfig, device,
          tokens: TokenChunks, max_sessions: int, say=None, points: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """N = 1, 2, ... (or each of ``points``) until a tick misses its deadline, memory runs
    out, or ``max_sessions``.

    Sessions persist from one N to the next (the next N opens the ones it adds), as
    conversations join a live server; each N runs ``cfg.seconds`` timed ticks after its
    warm-up ticks.  ``open_s`` is the wall time of opening the sessions an N added.
    """
    import torch
    streams = factory()
    _memory_reset(device)
    feeds: list[TokenFeed] = []
    hashes: list[Any] = []
    points_out = []
    try:
        for n in sweep_sizes(max_sessions, points):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                t0 = time.perf_counter()
                for i in range(len(feeds), n):
                    streams.open(i, make_prompt(i))
                    feeds.append(TokenFeed(cfg.seed, i, tokens))
                    hashes.append(hashlib.sha256())
                open_s = round(time.perf_counter() - t0, 3)
                point = run_ticks(streams, feeds, n, cfg, device, hashes)
                point.pop("speak_ms_per_tick")
                point.update(sessions=n, status="ok" if point["holds_cadence"] else "miss", open_s=open_s,
                             # each session's PCM so far, for check_sweep
                             chunks_per_session=[f.next_chunk for f in feeds],
                             pcm_sha256=[h.copy().hexdigest() for h in hashes])
            except torch.OutOfMemoryError as e:
                point = {"sessions": n, "status": f"out of memory: {str(e).splitlines()[0]}", "holds_cadence": False}
            point["peak_memory_bytes"] = peak_of(streams, device)
            point["rss_bytes"] = rss_bytes()
            points_out.append(point)
            if say:
                p99 = (point.get("speak_ms") or {}).get("p99")
                say(f"{mode}: N={n} {point['status']}, SPEAK p99 {p99} ms, peak {point['peak_memory_bytes']}")
            if point["status"] != "ok":
                break
    finally:
        streams.close()
        del streams
        _memory_reset(device)
    return points_out


def largest_holding(points: Iterable[dict[str, Any]]) -> int:
    """The largest N with every measured N' <= N holding the cadence (0 if none)."""
    best = 0
    for p in points:
        if not p.get("holds_cadence"):
            break
        best = p["sessions"]
    return best


def plot_sweep(report: dict[str, Any], path: str) -> str | None:
    """Peak memory and p99 SPEAK time vs N per mode; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, points in report["sweep"].items():
        ok = [p for p in points if p.get("speak_ms")]
        a.plot([p["sessions"] for p in ok], [p["speak_ms"]["p99"] for p in ok], marker="o", label=mode)
        mem = [p for p in points if p.get("peak_memory_bytes") is not None]
        b.plot([p["sessions"] for p in mem], [p["peak_memory_bytes"] / 2 ** 30 for p in mem], marker="o", label=mode)
    a.axhline(report["budget_ms"], color="tab:red", linestyle="--", label="1 s budget")
    a.set_xlabel("concurrent sessions N")
    a.set_ylabel("SPEAK time p99 per tick (ms)")
    a.legend()
    b.set_xlabel("concurrent sessions N")
    b.set_ylabel("peak allocated (GiB)" if report["device"].startswith("cuda") else "peak allocated (n/a on CPU)")
    b.legend()
    fig.suptitle(f"serve-sim {report['model']} {report['device']} rules {report['rules']} {report['mix']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path



def stock_prefixes(tail, prompt: tuple | None, cfg: SimConfig, tokens: "TokenChunks | SeededFrames", session: int,
                   upto: int) -> dict[int, str]:
    """Session ``session`` alone on the stock model ``tail``: its PCM hash after each of its
    first ``upto`` chunks (its prompt, its chunks and their seeds), keyed by chunk count."""
    import torch
    start_stock(tail, prompt)
    feed, h = TokenFeed(cfg.seed, session, tokens), hashlib.sha256()
    seen = {0: h.hexdigest()}
    for k in range(upto):
        torch.manual_seed(chunk_seed(cfg.seed, session, k))
        h.update(tail.stream(feed.chunk(k)))
        seen[k + 1] = h.copy().hexdigest()
    return seen


def check_sweep(points: list[dict[str, Any]], make_stock: Callable[[int], Any], make_prompt: Callable[[int], tuple],
                cfg: SimConfig, tokens: "TokenChunks | SeededFrames", say=None,
                run_jobs: Callable[[list[tuple[int, int]]], list[dict[int, str]]] | None = None) -> bool | None:
    """Every session's PCM at every N of a sweep against its own stock stream alone.

    Session ``i`` replays on one stock model of its own, with its prompt, its chunks and
    their seeds (what it spoke in the sweep), and its PCM hash after each chunk is
    compared with the sweep's at every point; each point gets ``exact``.  One stock
    model at a time here; ``run_jobs`` (``[(session, chunks)]`` -> their
    ``stock_prefixes``, in order) runs them elsewhere, e.g. ``check.in_processes``.
    None when no point has hashes (e.g. out of memory at N = 1)."""
    counts = [p["chunks_per_session"] for p in points if "chunks_per_session" in p]
    if not counts:
        return None
    jobs = [(i, max(c[i] for c in counts if len(c) > i)) for i in range(max(len(c) for c in counts))]
    if run_jobs is not None:
        prefixes = run_jobs(jobs)
    else:
        prefixes = []
        for i, upto in jobs:
            if say:
                say(f"exactness: session {i + 1}, {upto} chunks on a stock model alone")
            prefixes.append(stock_prefixes(make_stock(i), make_prompt(i), cfg, tokens, i, upto))
    for p in points:
        if "pcm_sha256" in p:
            p["exact"] = all(prefixes[i][c] == hx
                             for i, (c, hx) in enumerate(zip(p["chunks_per_session"], p["pcm_sha256"])))
    return all(p["exact"] for p in points if "exact" in p)


def serve_sim_report(*, make_optimized: Callable[[], Any], make_stock: Callable[[int], Any],
                     make_prompt: Callable[[int], tuple], hooks: ServeHooks, device, cfg: SimConfig,
                     sessions: int, modes: Sequence[str] = MODES, sweep_to: int | None = None, overlap: bool = False,
                     meta: dict[str, Any] | None = None, say=None, check_exact: bool = True,
                     points: Sequence[int] | None = None, tokens: "TokenChunks | SeededFrames | None" = None,
                     run_jobs: Callable[[list[tuple[int, int]]], list[dict[int, str]]] | None = None,
                     make_streams: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The serve-sim report: a fixed-N run of each mode, or (``sweep_to``) a sweep of each.

    Sweeping (at ``points``, else every N), ``exact`` is ``check_sweep`` of the optimized
    sweep (every session against its own stock stream at every N; ``run_jobs`` as there)
    when ``make_stock`` is given and ``check_exact``.

    Optimized runs first, stock second (each mode's memory freed before the next).
    ``exact``: every session's PCM SHA-256 equal between the modes (fixed-N runs with
    both modes; None otherwise).  ``hooks``: the model's serve hooks (its token chunks,
    the weights it reports).  ``make_streams``: the optimized mode's streams object instead
    of ``OptimizedStreams`` on ``make_optimized()`` (``serve-sim --ray-replicas``: ``RayStreams``).
    """
    tokens = tokens if tokens is not None else hooks.tokens(None)
    factories = {"optimized": make_streams or (lambda: OptimizedStreams(make_optimized(), overlap, hooks.weights_bytes)),
                 "stock": lambda: StockStreams(make_stock)}
    report: dict[str, Any] = {**(meta or {}), "device": str(device), "mix": cfg.mix, "seconds": cfg.seconds,
                              "warmup_ticks": cfg.warmup_ticks, "budget_ms": cfg.budget_ms, "seed": cfg.seed,
                              "overlap": overlap}
    order = [m for m in ("optimized", "stock") if m in modes]
    if sweep_to:
        report["sweep"] = {m: sweep(m, factories[m], make_prompt, cfg, device, tokens, sweep_to, say, points)
                           for m in order}
        report["max_sessions_holding_cadence"] = {m: largest_holding(p) for m, p in report["sweep"].items()}
        report["exact"] = None
        if check_exact and make_stock is not None and "optimized" in report["sweep"]:
            report["exact"] = check_sweep(report["sweep"]["optimized"], make_stock, make_prompt, cfg, tokens, say,
                                          run_jobs)
        return report
    report["sessions"] = sessions
    report["modes"] = {}
    for m in order:
        if say:
            say(f"{m}: {sessions} sessions, {cfg.warmup_ticks} + {cfg.seconds} ticks")
        report["modes"][m] = simulate(m, factories[m], make_prompt, sessions, cfg, device, tokens)
    if len(order) == 2:
        a, b = (report["modes"][m]["pcm_sha256"] for m in order)
        report["exact_sessions"] = [x == y for x, y in zip(a, b)]
        report["exact"] = all(report["exact_sessions"]) and len(a) == len(b) == sessions
    else:
        report["exact"] = None
    return report

