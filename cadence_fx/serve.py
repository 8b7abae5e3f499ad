"""Serving: many streams on one set of weights, on the 1 s cadence of a duplex loop.

``cadence-fx serve-sim``: N conversations on a virtual clock of 1 s ticks.  Every
tick, each *speaking* session turns its next chunk (25 new tokens at 25 Hz, + 3
lookahead) into 1 s of PCM; the wall time of a tick's work (its SPEAK time) must
stay under the 1 s budget or the tick misses its deadline.  The clock is virtual:
nothing sleeps, a tick's SPEAK time is measured and compared with the budget.

Two modes, run one after the other in one process (the first one's memory freed
before the second starts):

* ``stock``: one ``Token2WavTail`` per session, each with its own copy of the
  weights and of upstream's fixed state buffers (~2.2 GiB in fp32).  Upstream keeps
  one stream cache per ``Token2wav`` object, so this is what serving N concurrent
  streams with the stock runtime takes; the report also gives the weight bytes, for
  the (non-stock) variant that would share them.
* ``optimized``: one ``OptimizedToken2Wav`` (one copy of the weights) and N
  sessions, each with its own arena and, under rules R, its own captured graphs.

Before chunk ``k`` of session ``i`` both modes seed ``torch.manual_seed(chunk_seed(
seed, i, k))`` (CPU and CUDA generators), so each session draws the same noise in
both modes whatever the interleaving, and its PCM can be compared by SHA-256.

``cadence-fx soak``: one optimized session streams thousands of chunks; every
``--check-every`` chunks it records allocated memory and checks one chunk against
the stock step run from a copy of the session's state (see ``soak``).

``SessionPool``: sessions spread over local devices, one optimized model per
device, least-loaded placement, optional admission limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import random
import sys
import time
from typing import Any, Callable, Iterable, Sequence

from .bench import _percentile
from .errors import CadenceError, InputError

CHUNK_SECONDS = 1.0  # 25 tokens at 25 Hz -> 50 mel frames -> 24,000 samples
MIXES = ("speak-heavy", "mixed")
MODES = ("stock", "optimized")


class PoolFull(CadenceError, RuntimeError):
    """Every device of a ``SessionPool`` holds its maximum number of sessions."""


def chunk_seed(seed: int, session: int, chunk: int) -> int:
    """The generator seed set before chunk ``chunk`` of session ``session`` (both modes)."""
    return (seed * 1_000_003 + session * 100_003 + chunk) % (2 ** 62)


class TokenFeed:
    """Session ``i``'s speech tokens: chunk ``k`` is tokens ``25k .. 25k + 28`` of one
    seeded endless sequence (the 3 lookahead tokens are the next chunk's first 3)."""

    def __init__(self, seed: int, session: int):
        import torch
        from .integrations import stepaudio2 as s2
        self._gen = torch.Generator().manual_seed(30_000 + seed * 10_007 + session)
        self._tokens: list[int] = []
        self._vocab, self._chunk, self._look = s2.VOCAB, s2.CHUNK_TOKENS, s2.LOOKAHEAD_TOKENS
        self.next_chunk = 0

    def chunk(self, k: int) -> list[int]:
        import torch
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


def _sync(device) -> None:
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


def _allocated(device) -> int | None:
    import torch
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None


def rss_bytes() -> int | None:
    """This process's resident set (Linux), for CPU runs; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _ms_summary(xs: Sequence[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    return {"mean": round(sum(xs) / len(xs), 3), "p50": round(_percentile(xs, 50), 3),
            "p99": round(_percentile(xs, 99), 3), "max": round(max(xs), 3)}


# ------------------------------------------------------------------ the two modes
class StockStreams:
    """N stock tails, one per session (upstream keeps one stream per ``Token2wav``)."""

    name = "stock"

    def __init__(self, make_stock: Callable[[int], Any]):
        self.make_stock = make_stock
        self.tails: list[Any] = []

    def open(self, i: int, prompt) -> None:
        tail = self.make_stock(i)
        tail.set_stream_cache(*prompt)
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

    def __init__(self, model, overlap: bool = False):
        self.model, self.overlap = model, overlap
        self.sessions: list[Any] = []

    def open(self, i: int, prompt) -> None:
        import torch
        stream = torch.cuda.Stream(self.model.device) if self.overlap and self.model.device.type == "cuda" else None
        self.sessions.append(self.model.open_session(*prompt, stream=stream))

    def run_tick(self, work: list[tuple[int, list[int], int]]) -> list[bytes]:
        import torch
        if not self.overlap:
            out = []
            for i, tokens, seed in work:
                torch.manual_seed(seed)
                out.append(self.sessions[i].stream(tokens))
            return out
        pending = []
        for i, tokens, seed in work:  # launch every session's chunk, then wait for each
            torch.manual_seed(seed)  # read on the host at launch: the draws do not depend on overlap
            pending.append(self.sessions[i].submit(tokens))
        return [p.result() for p in pending]

    def report(self) -> dict[str, Any]:
        fallbacks: dict[str, int] = {}
        for s in self.sessions:
            for reason, n in s.stats()["fallbacks"].items():
                fallbacks[reason] = fallbacks.get(reason, 0) + n
        capture_failures = {s.name: f for s in self.sessions if s.session is not None
                            for f in [{i: r for i, r in s.session.capture_failures.items() if r}] if f}
        weights = sum(p.nbytes for m in (self.model.flow, self.model.hift) for p in m.parameters())
        return {"weights_bytes": weights,
                "arena_bytes_per_session": self.sessions[0].arena_bytes if self.sessions else None,
                "fallbacks": fallbacks, "capture_failures": capture_failures,
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


def run_ticks(streams, feeds: list[TokenFeed], n_sessions: int, cfg: SimConfig, device,
              hashes: list[Any]) -> dict[str, Any]:
    """``cfg.warmup_ticks + cfg.seconds`` ticks of ``n_sessions`` (untimed warm-up ticks first)."""
    ticks = cfg.warmup_ticks + cfg.seconds
    schedule = speaking_schedule(cfg.mix, n_sessions, ticks, cfg.seed)
    speak_ms, chunks = [], 0
    for t, speakers in enumerate(schedule):
        work = []
        for i in speakers:
            k, tokens = feeds[i].take()
            work.append((i, tokens, chunk_seed(cfg.seed, i, k)))
        _sync(device)
        t0 = time.perf_counter()
        pcm = streams.run_tick(work)
        _sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        for (i, _, _), b in zip(work, pcm):
            hashes[i].update(b)
        chunks += len(work)
        if t >= cfg.warmup_ticks and work:  # a tick where nobody speaks has no deadline
            speak_ms.append(ms)
    misses = sum(1 for ms in speak_ms if ms > cfg.budget_ms)
    return {"ticks": cfg.seconds, "speaking_ticks": len(speak_ms), "chunks": chunks,
            "speak_ms": _ms_summary(speak_ms), "deadline_misses": misses,
            "holds_cadence": misses == 0, "speak_ms_per_tick": [round(x, 3) for x in speak_ms]}


def simulate(mode: str, factory: Callable[[], Any], make_prompt: Callable[[int], tuple], n_sessions: int,
             cfg: SimConfig, device) -> dict[str, Any]:
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
    feeds = [TokenFeed(cfg.seed, i) for i in range(n_sessions)]
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
              "peak_memory_bytes": _peak_memory(device), "rss_bytes": rss_bytes(),
              "pcm_sha256": [h.hexdigest() for h in hashes], **(streams.report() if status == "ok" else {})}
    streams.close()
    del streams
    _memory_reset(device)
    return report


def sweep(mode: str, factory: Callable[[], Any], make_prompt: Callable[[int], tuple], cfg: SimConfig, device,
          max_sessions: int, say=None) -> list[dict[str, Any]]:
    """N = 1, 2, ... until a tick misses its deadline, memory runs out, or ``max_sessions``.

    Sessions persist from one N to the next (N + 1 opens one more), as conversations
    join a live server; each N runs ``cfg.seconds`` timed ticks after its warm-up ticks.
    """
    import torch
    streams = factory()
    _memory_reset(device)
    feeds: list[TokenFeed] = []
    hashes: list[Any] = []
    points = []
    try:
        for n in range(1, max_sessions + 1):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                streams.open(n - 1, make_prompt(n - 1))
                feeds.append(TokenFeed(cfg.seed, n - 1))
                hashes.append(hashlib.sha256())
                point = run_ticks(streams, feeds, n, cfg, device, hashes)
                point.pop("speak_ms_per_tick")
                point.update(sessions=n, status="ok" if point["holds_cadence"] else "miss")
            except torch.OutOfMemoryError as e:
                point = {"sessions": n, "status": f"out of memory: {str(e).splitlines()[0]}", "holds_cadence": False}
            point["peak_memory_bytes"] = _peak_memory(device)
            point["rss_bytes"] = rss_bytes()
            points.append(point)
            if say:
                p99 = (point.get("speak_ms") or {}).get("p99")
                say(f"{mode}: N={n} {point['status']}, SPEAK p99 {p99} ms, peak {point['peak_memory_bytes']}")
            if point["status"] != "ok":
                break
    finally:
        streams.close()
        del streams
        _memory_reset(device)
    return points


def largest_holding(points: Iterable[dict[str, Any]]) -> int:
    """The largest N with every N' <= N holding the cadence (0 if none)."""
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


# --------------------------------------------------------------------------- soak
def load_stock_state(tail, state, spk, prompt_frames: int) -> None:
    """Give a stock tail a stream: copies of ``state`` (the seven carried tensors).

    Upstream's stream loop reads only the live state: the first ``n_timesteps`` step
    slots and the first ``T`` frames of its buffers, which a copy holds exactly.
    """
    tail.prompt_frames, tail.spk = prompt_frames, spk
    tail.stream_state = {k: v.clone() for k, v in state.items()}


def check_chunk_against_stock(tail, session, tokens: list[int], seed: int) -> dict[str, Any]:
    """Run one chunk on ``session`` and on ``tail`` loaded with a copy of the session's
    state, from the same generator state; compare waveform, PCM and every next state."""
    import torch
    from .integrations.stepaudio2 import pcm_bytes
    from .verify import live_extent
    load_stock_state(tail, session.state(), session.spk, session.prompt_frames)
    torch.manual_seed(seed)
    wave_s = tail.stream(tokens, return_waveform=True)
    torch.manual_seed(seed)
    wave_o = session.stream(tokens, return_waveform=True)
    mine = session.state()
    mismatched = [k for k, t in tail.state().items() if k not in mine or not torch.equal(live_extent(t, mine[k]), mine[k])]
    wave_equal = torch.equal(tail.last_speech, session.last_speech)
    ps, po = pcm_bytes(wave_s), pcm_bytes(wave_o)
    tail.stream_state = None  # the stock side keeps nothing between checkpoints
    return {"exact": wave_equal and ps == po and not mismatched, "wave_equal": wave_equal, "pcm_equal": ps == po,
            "mismatched": mismatched, "pcm_sha256": hashlib.sha256(po).hexdigest(), "pcm": po}


def soak(model, tail, prompt, chunks: int, check_every: int, seed: int = 0, warmup_chunks: int = 3,
         say=None) -> dict[str, Any]:
    """One optimized session streams ``chunks`` chunks; a checkpoint every ``check_every``.

    At chunk ``c`` with ``c % check_every == 0`` (and at the last chunk) the chunk
    runs on the session and on the stock ``tail`` loaded with a copy of the session's
    state, from the same generator state (``check_chunk_against_stock``); then the
    memory allocated is recorded (CUDA: ``memory_allocated``; CPU: None, RSS for
    information).  Recording after the check counts the checker's own one-time
    allocations (e.g. its first chunk at the steady extent) at the checkpoint that
    makes them, so a later difference is growth.  Other chunks run on the session
    only.  ``memory_flat_bytes``: max - min of the allocated bytes over the
    checkpoints at chunk >= ``warmup_chunks`` (the caches reach their steady extent
    after the catalog's width of chunks).
    """
    import torch
    if chunks < 1 or check_every < 1:
        raise InputError(f"soak needs chunks >= 1 and check_every >= 1; got {chunks}, {check_every}")
    device = model.device
    session = model.open_session(*prompt)
    feed = TokenFeed(seed, 0)
    checkpoints, chunk_ms = [], []
    pcm_hash = hashlib.sha256()
    t_start = time.perf_counter()
    try:
        for c in range(chunks):
            k, tokens = feed.take()
            if c % check_every == 0 or c == chunks - 1:
                row = {"chunk": c, **check_chunk_against_stock(tail, session, tokens, chunk_seed(seed, 0, k))}
                _sync(device)
                row.update(allocated_bytes=_allocated(device), rss_bytes=rss_bytes())
                pcm_hash.update(row.pop("pcm"))
                checkpoints.append(row)
                if say:
                    say(f"soak chunk {c + 1}/{chunks}: exact {row['exact']}, allocated {row['allocated_bytes']}")
                continue
            torch.manual_seed(chunk_seed(seed, 0, k))
            _sync(device)
            t0 = time.perf_counter()
            pcm = session.stream(tokens)
            _sync(device)
            chunk_ms.append((time.perf_counter() - t0) * 1e3)
            pcm_hash.update(pcm)
        stats = session.stats()
        arena = session.arena_bytes
    finally:
        session.close()
    steady = [r["allocated_bytes"] for r in checkpoints if r["chunk"] >= warmup_chunks and r["allocated_bytes"] is not None]
    return {
        "chunks": chunks, "check_every": check_every, "device": str(device), "rules": model.rules,
        "all_exact": all(r["exact"] for r in checkpoints), "checkpoints": checkpoints,
        "memory_flat_bytes": (max(steady) - min(steady)) if steady else None,
        "memory_flat": (max(steady) == min(steady)) if steady else None,
        "arena_bytes": arena, "chunk_ms": _ms_summary(chunk_ms), "fallbacks": stats["fallbacks"],
        "stats": stats, "pcm_sha256": pcm_hash.hexdigest(), "wall_s": round(time.perf_counter() - t_start, 2),
    }


# -------------------------------------------------------------------- placement
class SessionPool:
    """Sessions spread over local devices: one optimized model (one copy of the
    weights) per device; each new session goes to the device with the fewest open
    sessions (ties: the first listed).  ``max_per_device`` (e.g. the largest N that
    ``serve-sim --sweep`` found holding the cadence) makes ``open`` raise
    ``PoolFull`` instead of overloading a device: admission control.
    """

    def __init__(self, models: Sequence[Any], max_per_device: int | None = None):
        if not models:
            raise InputError("a SessionPool needs at least one model")
        self.models = list(models)
        self.max_per_device = max_per_device
        self._open: list[list[Any]] = [[] for _ in self.models]

    @classmethod
    def on_devices(cls, make_model: Callable[[Any], Any], devices: Sequence[str], **kw) -> "SessionPool":
        """``make_model(device)`` per device, e.g. ``lambda d: optimize(tail_on(d), rules)``."""
        import torch
        return cls([make_model(torch.device(d)) for d in devices], **kw)

    def load(self) -> list[int]:
        """Open sessions per model (closed ones are forgotten here)."""
        self._open = [[s for s in group if not s.closed] for group in self._open]
        return [len(group) for group in self._open]

    def warm(self, prompt_tokens: Iterable[int], spk_dim: int = 192) -> None:
        """Trace every model for these prompt lengths now, not on a conversation's first chunk."""
        import torch
        for model in self.models:
            for p in prompt_tokens:
                model.executable(2 * p, torch.zeros(1, spk_dim, device=model.device))

    def open(self, prompt_tokens, prompt_mels, spk, **kw):
        """A session on the least-loaded model; the prompt is moved to its device."""
        load = self.load()
        idx = min(range(len(load)), key=lambda i: load[i])
        if self.max_per_device is not None and load[idx] >= self.max_per_device:
            raise PoolFull(f"every device holds {self.max_per_device} sessions (load {load}); close one, add a "
                           f"device, or raise max_per_device if serve-sim shows it holds the cadence")
        model = self.models[idx]
        dev = model.device
        session = model.open_session(prompt_tokens.to(dev), prompt_mels.to(dev), spk.to(dev), **kw)
        session.device_index = idx
        self._open[idx].append(session)
        return session


# --------------------------------------------------------------------------- CLI
def _build_tail(args, device):
    from .integrations import stepaudio2 as s2
    flow, hift = s2.build_modules(args.seed, args.checkpoint)
    return s2.Token2WavTail(flow.to(device), hift.to(device), n_timesteps=args.n_timesteps,
                            float16=args.dtype == "float16")


def _resolve(args):
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    if args.prompt_tokens < 1:
        raise SystemExit("--prompt-tokens must be >= 1")
    if args.rules == "auto":
        args.rules = "SRc" if device.type == "cuda" else "S"
    if device.type == "cuda":
        from .verify import deterministic_protocol
        deterministic_protocol()  # stock eager is bit-reproducible on a GPU only with it
    return device


def _prompt_maker(args, device):
    """Session ``i``'s prompt: P tokens, its mel and a speaker vector, seeded by ``seed + i``."""
    from .integrations import stepaudio2 as s2
    return lambda i: s2.synthetic_prompt(args.prompt_tokens, args.seed + i, device=device)


def serve_sim_report(*, make_optimized: Callable[[], Any], make_stock: Callable[[int], Any],
                     make_prompt: Callable[[int], tuple], device, cfg: SimConfig, sessions: int,
                     modes: Sequence[str] = MODES, sweep_to: int | None = None, overlap: bool = False,
                     meta: dict[str, Any] | None = None, say=None) -> dict[str, Any]:
    """The serve-sim report: a fixed-N run of each mode, or (``sweep_to``) a sweep of each.

    Optimized runs first, stock second (each mode's memory freed before the next).
    ``exact``: every session's PCM SHA-256 equal between the modes (fixed-N runs with
    both modes; None otherwise).
    """
    factories = {"optimized": lambda: OptimizedStreams(make_optimized(), overlap),
                 "stock": lambda: StockStreams(make_stock)}
    report: dict[str, Any] = {**(meta or {}), "device": str(device), "mix": cfg.mix, "seconds": cfg.seconds,
                              "warmup_ticks": cfg.warmup_ticks, "budget_ms": cfg.budget_ms, "seed": cfg.seed,
                              "overlap": overlap}
    order = [m for m in ("optimized", "stock") if m in modes]
    if sweep_to:
        report["sweep"] = {m: sweep(m, factories[m], make_prompt, cfg, device, sweep_to, say) for m in order}
        report["max_sessions_holding_cadence"] = {m: largest_holding(p) for m, p in report["sweep"].items()}
        report["exact"] = None
        return report
    report["sessions"] = sessions
    report["modes"] = {}
    for m in order:
        if say:
            say(f"{m}: {sessions} sessions, {cfg.warmup_ticks} + {cfg.seconds} ticks")
        report["modes"][m] = simulate(m, factories[m], make_prompt, sessions, cfg, device)
    if len(order) == 2:
        a, b = (report["modes"][m]["pcm_sha256"] for m in order)
        report["exact_sessions"] = [x == y for x, y in zip(a, b)]
        report["exact"] = all(report["exact_sessions"]) and len(a) == len(b) == sessions
    else:
        report["exact"] = None
    return report


def cmd_serve_sim(args) -> int:
    import cadence_fx
    import torch
    say = None if args.json else (lambda msg: print(f"[serve-sim] {msg}", file=sys.stderr, flush=True))
    device = _resolve(args)
    if args.sessions < 1 or args.seconds < 1:
        raise SystemExit("--sessions and --seconds must be >= 1")
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(MODES) or not modes:
        raise SystemExit(f"--modes: choose from {','.join(MODES)}")
    if args.overlap and device.type != "cuda":
        raise SystemExit("--overlap launches sessions on their own CUDA streams: it needs --device cuda")

    def make_optimized():
        return cadence_fx.optimize(_build_tail(args, device), rules=args.rules, progress=say)

    def make_stock(i):  # its own weights and buffers, as one upstream Token2wav per stream
        return _build_tail(args, device)

    meta = {"model": args.model, "rules": args.rules, "dtype": args.dtype, "n_timesteps": args.n_timesteps,
            "prompt_tokens": args.prompt_tokens, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "stock_layout": "one Token2WavTail per session: its own weights and fixed state buffers"}
    cfg = SimConfig(args.seconds, args.mix, args.seed, args.warmup_ticks)
    report = serve_sim_report(make_optimized=make_optimized, make_stock=make_stock,
                              make_prompt=_prompt_maker(args, device), device=device, cfg=cfg,
                              sessions=args.sessions, modes=modes,
                              sweep_to=args.max_sessions if args.sweep else None, overlap=args.overlap,
                              meta=meta, say=say)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        if args.sweep:
            png = plot_sweep(report, os.path.join(args.out, "serve-sim.png"))
            report["png"] = png
            if png is None:
                print("[serve-sim] matplotlib is not importable: no PNG (the JSON has every number)", file=sys.stderr)
        with open(os.path.join(args.out, "serve-sim.json"), "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        print(json.dumps(report))
    else:
        print(_format_serve(report))
    return 0 if report["exact"] in (True, None) else 1


def _format_serve(report: dict[str, Any]) -> str:
    mib = lambda b: "n/a" if b is None else f"{b / 2 ** 20:,.0f} MiB"  # noqa: E731
    lines = [f"serve-sim {report['model']} on {report['device']}, rules {report['rules']}, {report['mix']}, "
             f"budget {report['budget_ms']:.0f} ms per tick"]
    if "sweep" in report:
        for mode, points in report["sweep"].items():
            for p in points:
                sp = p.get("speak_ms") or {}
                lines.append(f"  {mode:>9} N={p['sessions']:>3}: {p['status']:<5} SPEAK mean {sp.get('mean')} "
                             f"p99 {sp.get('p99')} ms, misses {p.get('deadline_misses')}, "
                             f"peak {mib(p.get('peak_memory_bytes'))}")
        lines.append(f"largest N holding the cadence: {report['max_sessions_holding_cadence']}")
        return "\n".join(lines)
    for mode, r in report["modes"].items():
        sp = r.get("speak_ms") or {}
        lines.append(f"  {mode:>9}: {r['sessions']} sessions, {r['status']}, SPEAK mean {sp.get('mean')} "
                     f"p99 {sp.get('p99')} ms, misses {r.get('deadline_misses')}/{r.get('speaking_ticks')}, "
                     f"peak {mib(r['peak_memory_bytes'])}")
    lines.append(f"every session's PCM identical between modes: {report['exact']}")
    return "\n".join(lines)


def cmd_soak(args) -> int:
    import cadence_fx
    say = None if args.json else (lambda msg: print(f"[soak] {msg}", file=sys.stderr, flush=True))
    device = _resolve(args)
    tail = _build_tail(args, device)
    model = cadence_fx.optimize(tail, rules=args.rules, progress=say)
    prompt = _prompt_maker(args, device)(0)
    model.executable(prompt[1].shape[1], prompt[2])  # trace before the clock starts
    report = soak(model, tail, prompt, args.chunks, args.check_every, args.seed, say=say)
    report.update(model=args.model, n_timesteps=args.n_timesteps, dtype=args.dtype, prompt_tokens=args.prompt_tokens)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "soak.json"), "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        print(json.dumps(report))
    else:
        for r in report["checkpoints"]:
            print(f"chunk {r['chunk']:>6}: exact {r['exact']}  allocated {r['allocated_bytes']}  rss {r['rss_bytes']}")
        print(f"all checkpoints exact: {report['all_exact']}; memory flat after warm-up: {report['memory_flat']} "
              f"(max - min {report['memory_flat_bytes']} bytes); chunk p50 {report['chunk_ms']['p50']} ms")
    return 0 if report["all_exact"] and report["memory_flat"] in (True, None) else 1


def add_serve_args(p: argparse.ArgumentParser, *, soak_cmd: bool = False) -> None:
    p.add_argument("--model", choices=("token2wav",), default="token2wav")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--rules", default="auto", help="optimized rules; auto: SRc on CUDA, S on CPU")
    p.add_argument("--prompt-tokens", type=int, default=50)
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="directory with upstream flow.pt and hift.pt")
    p.add_argument("--out", default=None, help="write the JSON (and, sweeping, the PNG) here")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    if soak_cmd:
        p.add_argument("--chunks", type=int, default=3600, help="chunks to stream (1 s each)")
        p.add_argument("--check-every", type=int, default=100, help="chunks between checkpoints")
        return
    p.add_argument("--sessions", type=int, default=4, help="concurrent sessions N (fixed-N run)")
    p.add_argument("--seconds", type=int, default=10, help="timed ticks (1 s of audio each) per run or per N")
    p.add_argument("--warmup-ticks", type=int, default=1, help="untimed ticks first (first-call costs)")
    p.add_argument("--mix", choices=MIXES, default="speak-heavy",
                   help="speak-heavy: every session speaks every tick; mixed: each speaks with p = 0.5 (seeded)")
    p.add_argument("--modes", default="stock,optimized")
    p.add_argument("--sweep", action="store_true", help="grow N from 1 until a miss, out of memory or --max-sessions")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--overlap", action="store_true",
                   help="CUDA: each optimized session on its own stream, a tick's chunks launched before any is read")
