"""``cadence-fx traffic``: MiniCPM-o-shaped conversations on one optimized model, each against stock.

What OpenBMB's duplex demo sends a Token2Wav tail, per conversation (all drawn from
``--seed``): a voice prompt of P tokens (``--prompt-range``, default 75-250, a different
length per conversation), 1..``--turns`` turns; each turn K steady chunks of 25 + 3
tokens (``--steady-range``, 2-12), then a shorter window of W + 3 tokens at the turn's
end (``--window-range``, 8-27) and a flush of F tokens (``--flush-range``, 1-28,
``last_chunk=True``); between turns the post-prompt state comes back (the optimized
session's ``reset()``; stock sets the same prompt up again, which gives the same state).

The conversations are interleaved on ONE optimized model (a session each, opened when
the conversation starts); each has its own stock tail (a deep copy of the stock model)
stepped in lockstep: before every chunk both start from the same generator state
(``lockstep.chunk_seed``), and the waveform (``torch.equal``), the PCM bytes and every
carried state tensor (at the arena's live extent) must match.

Reported per conversation and overall: ``exact``; ``program_share`` (chunks the
optimized program ran, graph or replay, of all chunks) and ``replayed_share`` (chunks
replayed); fallbacks by reason; time to first audio for the new voice (prompt set-up,
including any specialization and capture, plus its first chunk) against stock's;
chunk milliseconds p50/p99 (each conversation's first chunk, which follows a set-up,
left out), peak device memory (CUDA: the process's, stock tails included) and Python's
collector (``runtime.collector.stats()``).

``--pace``: the events arrive on a clock instead of back to back.  Conversation ``c``'s
voice arrives at ``c x --stagger-s``, with its first chunk; each later chunk arrives as
the audio before it would have played (a chunk of N new tokens is N/25 s: 25 Hz speech
tokens), a turn's reset with the turn's first chunk.  Between arrivals the sessions get
idle time (``--idle``) and the driver sleeps.  Each chunk's latency is from its arrival
to its PCM; a player that starts a turn at its first chunk's PCM and plays each chunk
after the one before *stalls* when a chunk is not ready when the audio before it ends
(``player``).  Stock is not run on the timed path: after it, each conversation is
replayed on the stock tail with the same seeds, and every chunk's waveform and PCM, and
the whole state at every turn's end, must match (until then the run keeps a device copy
of each conversation's state per turn: at 5 steps a few hundred MiB each).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import random
import sys
import time
from typing import Any

from .. import foreground
from ..runtime import collector
from ..step import Rules
from . import registry
from .options import add_model_args, model_of, progress
from .traffic_prepare import emit_prepared, parse_shard, prepare_for
from .traffic_report import chunk_work, gc_counts, markdown, plot, specializations, working_arenas

DEFAULTS = {"prompt": (75, 250), "steady": (2, 12), "window": (8, 27), "flush": (1, 28)}
TOKEN_SECONDS = 1 / 25  # a speech token's audio (Token2Wav: 25 Hz tokens, 50 mel frames a second)


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range LO,HI of ints (e.g. 8,27)") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= LO <= HI")
    return lo, hi


def _frames(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: prompt lengths in mel frames, e.g. 500 or 256,512") from None


def _share(text: str) -> float:
    try:
        return foreground.check_build_share(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_args(p) -> None:
    add_model_args(p, rules="auto")
    p.set_defaults(prompt_tokens=None)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4, help="each conversation has 1..TURNS turns")
    for name, (lo, hi) in DEFAULTS.items():
        p.add_argument(f"--{name}-range", type=_range, default=(lo, hi), metavar="LO,HI",
                       help={"prompt": "voice prompt tokens per conversation", "steady": "steady chunks per turn",
                             "window": "new tokens of the shorter window at a turn's end (+ lookahead)",
                             "flush": "tokens of the flush chunk (last_chunk=True)"}[name] + f" (default {lo},{hi})")
    p.add_argument("--off-catalog", choices=("specialize", "repeat", "eager"), default="specialize",
                   help="windows, flushes and the steps after them: their own programs, built on first use "
                        "(default) or the second time a shape comes (repeat), or the exact eager path")
    p.add_argument("--capacity", type=_frames, default=None, metavar="FRAMES[,FRAMES]",
                   help="rules with S: every voice up to FRAMES prompt mel frames on one set of graphs (optimize(..., "
                        "capacity=...)); a longer voice, or one no capacity serves, is built for its own length")
    p.add_argument("--prepare", action="store_true",
                   help="--capacity: before the first conversation, build the shared graphs of every window and "
                        "flush length the ranges allow (opt.prepare_capacity; timed apart: report prepare)")
    p.add_argument("--prepare-only", action="store_true",
                   help="--prepare, then stop: no conversation (the graphs land in the program cache on disk, for "
                        "a later run, or a server, to load; prints the prepare report)")
    p.add_argument("--prepare-shard", type=parse_shard, default=None, metavar="I/N",
                   help="--prepare-only: only every N-th window and flush length from the I-th (processes that "
                        "share the program cache each build one shard; the capacities' own graphs are built once)")
    p.add_argument("--shared-captures", action="store_true",
                   help="--capacity, rules SR/SRc: each capacity's graphs captured once for every voice, on a working "
                        "arena its voices' states are copied onto chunk by chunk (optimize(..., shared_captures=True))")
    p.add_argument("--background", action="store_true",
                   help="build each new voice's graphs on a worker thread while its chunks run the exact eager "
                        "path (optimize(..., background=True)); the first voice still builds at its set-up")
    p.add_argument("--build-share", type=_share, default=None, metavar="S",
                   help="--background: the share of the host's time a build takes while a chunk or set-up runs, "
                        "in (0, 1] (default 0.1; 1: a build never steps aside)")
    p.add_argument("--idle", action="store_true",
                   help="after each event (--pace: while waiting for the next arrival), give every live session "
                        "idle time (session.idle(): a background build's landed entries are captured there, not on "
                        "a chunk), as a server has between a conversation's chunks; timed apart from the chunks "
                        "(report: idle_s, captured_idle)")
    p.add_argument("--pace", action="store_true",
                   help="chunks arrive at the audio rate, not back to back (a chunk of N new tokens N/25 s after "
                        "the one before; conversation c's voice at c x --stagger-s): latency from arrival, and "
                        "the stalls a player would hear; stock is checked after the timed run, on the same seeds")
    p.add_argument("--stagger-s", type=float, default=1.0, help="--pace: seconds between voices' arrivals")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="--pace: start the clock on a cold model (by default two voices of adjacent lengths no "
                        "conversation has are set up and closed first, as a service does before it takes traffic, "
                        "so the symbolic traces are not in any conversation's way and every voice is a new length)")
    p.add_argument("--out", default=None, help="write traffic.json, traffic.md and traffic.png here")
    p.add_argument("--quiet", action="store_true")


@dataclasses.dataclass
class Conversation:
    index: int
    prompt_tokens: int
    turns: list[list[tuple[list[int], bool]]]  # per turn: (tokens, last_chunk) chunks


def plan(seed: int, conversations: int, turns: int, ranges: dict[str, tuple[int, int]], vocab: int, new: int,
         lookahead: int) -> list[Conversation]:
    """The seeded conversations (pure: the same arguments give the same traffic)."""
    rng = random.Random(seed)
    lo, hi = ranges["prompt"]
    pool = list(range(lo, hi + 1))
    lengths = rng.sample(pool, conversations) if conversations <= len(pool) else \
        [rng.choice(pool) for _ in range(conversations)]
    out = []
    for c, prompt in enumerate(lengths):
        convo = []
        for _ in range(rng.randint(1, turns)):
            chunks = [([rng.randrange(vocab) for _ in range(new + lookahead)], False)
                      for _ in range(rng.randint(*ranges["steady"]))]
            window = rng.randint(*ranges["window"])
            chunks.append(([rng.randrange(vocab) for _ in range(window + lookahead)], False))
            chunks.append(([rng.randrange(vocab) for _ in range(rng.randint(*ranges["flush"]))], True))
            convo.append(chunks)
        out.append(Conversation(c, prompt, convo))
    return out


def run(args) -> int:
    import torch
    from ..lockstep import deterministic_protocol
    from .bench.stats import percentile
    if args.conversations < 1 or args.turns < 1:
        raise SystemExit("--conversations and --turns must be >= 1")
    if args.prepare and args.capacity is None:
        raise SystemExit("--prepare builds the shared graphs of a capacity: give --capacity too")
    if (args.prepare_only or args.prepare_shard is not None) and not args.prepare:
        raise SystemExit("--prepare-only and --prepare-shard are --prepare's: give --prepare too")
    if args.prepare_shard is not None and not args.prepare_only:
        raise SystemExit("--prepare-shard builds one part of the graphs for a later run to load: give --prepare-only")
    if args.shared_captures and args.capacity is None:
        raise SystemExit("--shared-captures shares a capacity's captures among its voices: give --capacity too")
    if not (args.stagger_s >= 0):  # also NaN
        raise SystemExit(f"--stagger-s must be a number of seconds >= 0; got {args.stagger_s}")
    spec = model_of(args)
    if spec.prompt is None or not spec.flush or spec.serve is None:
        raise SystemExit(f"--model {spec.name}: traffic drives a prompted model with a flush chunk (token2wav)")
    device = torch.device(args.device)
    if device.type == "cuda":
        deterministic_protocol()
    rules = args.rules if args.rules != "auto" else ("SRc" if device.type == "cuda" else "S")
    if args.shared_captures and not Rules.parse(rules).replays:
        raise SystemExit(f"--shared-captures shares captured CUDA graphs: rules SR or SRc (here rules {rules})")
    say = progress(args.quiet)
    chunk = spec.serve.tokens(args)
    ranges = {k: getattr(args, f"{k}_range") for k in DEFAULTS}
    convos = plan(args.seed, args.conversations, args.turns, ranges, chunk.vocab, chunk.new, chunk.lookahead)
    args.prompt_tokens = convos[0].prompt_tokens
    stock, _ = registry.build(spec, args)
    opt = registry.optimize(spec, stock, rules, say)
    opt.set_off_catalog(args.off_catalog)
    was_capacity, was_background = getattr(opt, "capacity", None), getattr(opt, "background", False)
    was_shared, old_share = getattr(opt, "shared_captures", False), foreground.build_share()
    live: dict[int, dict[str, Any]] = {}
    try:  # the model is kept for later commands in this process: its settings come back whatever happens
        if args.capacity is not None:
            if not hasattr(opt, "set_capacity"):
                raise SystemExit(f"--capacity: the optimized {spec.name} has no capacity graphs")
            opt.set_capacity(args.capacity, args.shared_captures)
        prepared = prepare_for(args, opt, ranges, chunk.lookahead, say) if args.prepare else None
        if args.prepare_only:
            emit_prepared(args, prepared)
            return 0
        if args.background:
            if not hasattr(opt, "set_background"):
                raise SystemExit(f"--background: the optimized {spec.name} does not build in the background")
            opt.set_background(True)
        if args.build_share is not None:
            foreground.set_build_share(args.build_share)  # process-wide
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rows, idle = _drive(args, spec, convos, stock, opt, device, say, chunk, live)
        report = _report(args, rules, convos, live, rows, device, percentile, idle)
        report["prepare"] = prepared
    finally:
        for c in live.values():
            c["session"].close()
        if args.background:
            opt.set_background(was_background)
        if args.capacity is not None:
            opt.set_capacity(was_capacity, was_shared)
        foreground.set_build_share(old_share)
    _emit(args, report)
    return 0 if report["exact"] else 1


def _drive(args, spec, convos, stock, opt, device, say, chunk, live: dict) -> tuple[list, list]:
    """The conversations' events (``--pace``: at the audio rate), each live conversation in
    ``live``: ``(rows, idle)``, a row per chunk and under ``--idle`` (seconds, entries
    captured) per event."""
    rows: list[dict] = []
    idle: list[tuple[float, int]] = []
    if args.pace:
        _paced(args, spec, convos, stock, opt, device, say, chunk, live, rows, idle)
        return rows, idle
    # round robin: every live conversation takes one event per tick (open, a chunk, or a reset)
    events = {c.index: [("open", None, None)] + [ev for t, turn in enumerate(c.turns)
                                                  for ev in ([("reset", t, None)] if t else []) +
                                                  [("chunk", t, ch) for ch in turn]] for c in convos}
    while any(events.values()):
        for c in convos:
            if not events[c.index]:
                continue
            kind, turn, ch = events[c.index].pop(0)
            if kind == "open":
                live[c.index] = _open(spec, args, c, stock, opt, device, say)
            elif kind == "reset":
                _reset(live[c.index])
            else:
                rows.append(_chunk(live[c.index], c, turn, ch, args.seed, device))
            if args.idle:  # every other conversation is between two of its chunks now
                idle.append(_idle(live, device))
    return rows, idle


def _open(spec, args, c: Conversation, stock, opt, device, say) -> dict:
    from ..lockstep import sync
    if say:  # on CUDA with the device memory held so far (what ran a card out of memory: session 51)
        say(f"conversation {c.index + 1}: a voice of {c.prompt_tokens} tokens, {len(c.turns)} turn(s)"
            + (_memory(device) if device.type == "cuda" else ""))
    prompt = _prompt(spec, args, c.prompt_tokens, args.seed + c.index)
    # a stock stream of its own, sharing the weights (read only): 8 copies of them took ~7 GB of a card
    mine = stock if c.index == 0 else copy.deepcopy(stock, _weights(stock))
    sync(device)
    t0 = time.perf_counter()
    session = opt.open_session(*prompt)
    sync(device)
    t1 = time.perf_counter()
    mine.set_stream_cache(*prompt)
    sync(device)
    t2 = time.perf_counter()
    return {"prompt": prompt, "stock": mine, "session": session, "setup_s": (t1 - t0, t2 - t1),
            "setup": session.stats().get("setup_s"), "chunks": 0, "ttfa_ms": None}


def _weights(stock) -> dict:
    """``copy.deepcopy``'s memo sharing ``stock``'s parameters (or its modules': the Token2Wav tail's flow, HiFT)."""
    import torch
    mods = [stock] if isinstance(stock, torch.nn.Module) else [m for m in vars(stock).values()
                                                               if isinstance(m, torch.nn.Module)]
    return {id(p): p for m in mods for p in m.parameters()}


def _memory(device) -> str:
    """This process's device memory allocated, reserved and its peak, in MiB, for a progress line."""
    from torch.cuda import max_memory_allocated as peak, memory_allocated as held, memory_reserved as kept
    return f" (device MiB: {held(device) >> 20:,} allocated, {kept(device) >> 20:,} reserved, peak {peak(device) >> 20:,})"


def _prompt(spec, args, tokens: int, seed: int):
    """The seeded voice prompt of ``tokens`` tokens (the model's own prompt builder)."""
    return spec.prompt(argparse.Namespace(**{**vars(args), "prompt_tokens": tokens, "seed": seed}))


def _state_copy(session) -> dict:
    """A device copy of a session's carried state (its live views), for a later check."""
    return {r: t.clone() for r, t in session.state().items()}


def _reset(c: dict) -> None:
    c["session"].reset()
    c["stock"].set_stream_cache(*c["prompt"])  # stock's post-prompt state: set up again


def _idle(live: dict, device, seconds: float | None = None) -> tuple[float, int]:
    """Idle time for every live session (``session.idle()``, ``seconds`` in all): seconds, entries captured."""
    from ..lockstep import sync
    from ..runtime.session import time_left
    t0 = time.perf_counter()
    captured = 0
    for c in live.values():
        left = time_left(seconds, t0)
        if left is not None and left <= 0:
            break
        captured += len(c["session"].idle(left))
    sync(device)
    return time.perf_counter() - t0, captured


def _chunk(c: dict, convo: Conversation, turn: int, ch, seed: int, device) -> dict:
    import torch
    from ..lockstep import chunk_route, chunk_seed, rng_state, set_rng_state, state_mismatches, sync
    from ..pcm import pcm_bytes
    tokens, last = ch
    i = c["chunks"]
    torch.manual_seed(chunk_seed(seed * 100 + convo.index, i))
    rng = rng_state(device)
    sync(device)
    t0 = time.perf_counter()
    c["stock"].stream(tokens, last_chunk=last, return_waveform=True)
    sync(device)
    t1 = time.perf_counter()
    set_rng_state(rng, device)
    before, gc_before = c["session"].stats(), gc_counts()
    t2 = time.perf_counter()
    c["session"].stream(tokens, last_chunk=last, return_waveform=True)
    sync(device)
    t3 = time.perf_counter()
    after, gc_after = c["session"].stats(), gc_counts()
    stock_wave, wave = c["stock"].last_speech, c["session"].last_speech
    bad = state_mismatches(c["stock"].state(), c["session"].state())
    route = chunk_route(before, after)
    if i == 0:
        c["ttfa_ms"] = ((c["setup_s"][0] + t3 - t2) * 1e3, (c["setup_s"][1] + t1 - t0) * 1e3)
    c["chunks"] += 1
    return {"conversation": convo.index, "turn": turn, "chunk": i, "tokens": len(tokens), "last": last,
            "route": route, "wave_equal": bool(torch.equal(wave, stock_wave)),
            "pcm_equal": pcm_bytes(wave.float().cpu().numpy()) == pcm_bytes(stock_wave.float().cpu().numpy()),
            "state_equal": not bad, "mismatched": bad, "ms": (t3 - t2) * 1e3, "stock_ms": (t1 - t0) * 1e3,
            "work": chunk_work(before, after, gc_before, gc_after)}


def audio_s(tokens: list, last: bool, lookahead: int) -> float:
    """Seconds of audio a chunk adds: its new tokens (a flush's all), 25 a second."""
    return (len(tokens) if last else len(tokens) - lookahead) * TOKEN_SECONDS


def player(rows: list[dict]) -> None:
    """One conversation's chunks in order, each with ``ready_s`` and ``audio_s``, and
    ``turn_start`` on a turn's first: sets ``stall_ms`` on each.  A turn plays from its
    first chunk's PCM on; each later chunk plays when the one before has ended, and the
    listener hears a gap (a stall) if it is not ready by then."""
    end = None
    for r in rows:
        if r["turn_start"] or end is None:
            r["stall_ms"], end = 0.0, r["ready_s"] + r["audio_s"]
        else:
            r["stall_ms"] = max(0.0, r["ready_s"] - end) * 1e3
            end = max(end, r["ready_s"]) + r["audio_s"]


def warm_up_lengths(used: set, lo: int, hi: int) -> list[int]:
    """Two adjacent free prompt lengths from the middle of ``[lo, hi]`` outward (else past
    ``hi``): a symbolic trace serves one class of lengths, and Token2Wav's rare class
    (``2P + 49`` frames divisible by 25) never holds two adjacent ones (docs/serving.md)."""
    mid = (lo + hi) // 2
    for n in sorted(range(lo, hi), key=lambda n: (abs(n - mid), n)):
        if n not in used and n + 1 not in used:
            return [n, n + 1]
    return [hi + 1, hi + 2]


def warm_up(opt, prompts: list) -> None:
    """Set up and close a voice per prompt, each built at its set-up (a background build
    waits for a first chunk, which a warm-up never sends: background is off meanwhile)."""
    background = bool(getattr(opt, "background", False))
    if background:
        opt.set_background(False)
    try:
        for prompt in prompts:
            opt.open_session(*prompt).close()
    finally:
        if background:
            opt.set_background(True)


def _paced(args, spec, convos, stock, opt, device, say, chunk, live, rows, idle) -> None:
    """``--pace``: the timed run (optimized only), then stock on the same seeds."""
    import torch
    from ..lockstep import chunk_route, chunk_seed, sync
    queue = []  # (due s, conversation, order, event)
    for c in convos:
        due = c.index * args.stagger_s
        queue.append((due, c.index, 0, ("open", None, None)))
        for t, turn in enumerate(c.turns):
            if t:
                queue.append((due, c.index, len(queue), ("reset", t, None)))
            for n, ch in enumerate(turn):
                queue.append((due, c.index, len(queue), ("chunk", t, ch, n == 0)))
                due += audio_s(ch[0], ch[1], chunk.lookahead)
    saved: dict[int, list] = {c.index: [] for c in convos}  # the state at every turn's end
    args.warm_up_tokens, args.warm_up_s = None, None
    if args.warm_up:  # what a service does before it takes traffic: trace (or load) the symbolic steps
        args.warm_up_tokens = warm_up_lengths({c.prompt_tokens for c in convos}, *args.prompt_range)
        if say:
            say(f"warm-up: voices of {args.warm_up_tokens} tokens, set up and closed before the clock starts")
        t_warm = time.perf_counter()
        warm_up(opt, [_prompt(spec, args, n, args.seed + 10_000 + i) for i, n in enumerate(args.warm_up_tokens)])
        sync(device)
        args.warm_up_s = round(time.perf_counter() - t_warm, 3)
    t0 = time.perf_counter()
    for due, ci, _, event in sorted(queue, key=lambda q: q[:3]):
        wait = due - (time.perf_counter() - t0)
        if wait > 0 and args.idle and live:
            idle.append(_idle(live, device, wait))
            wait = due - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
        c = convos[ci]
        if event[0] == "open":
            prompt = _prompt(spec, args, c.prompt_tokens, args.seed + ci)
            if say:
                say(f"conversation {ci + 1}: a voice of {c.prompt_tokens} tokens at {due:.1f} s")
            live[ci] = {"prompt": prompt, "session": opt.open_session(*prompt), "chunks": 0, "due0": due}
            continue
        session = live[ci]["session"]
        if event[0] == "reset":
            saved[ci].append(_state_copy(session))
            session.reset()
            continue
        _, turn, (tokens, last), first = event
        i = live[ci]["chunks"]
        torch.manual_seed(chunk_seed(args.seed * 100 + ci, i))
        before = session.stats()
        t_start = time.perf_counter()
        session.stream(tokens, last_chunk=last, return_waveform=True)
        sync(device)
        ready = time.perf_counter() - t0
        rows.append({"conversation": ci, "turn": turn, "chunk": i, "tokens": len(tokens), "last": last,
                     "route": chunk_route(before, session.stats()), "ms": (ready + t0 - t_start) * 1e3,
                     "due_s": round(due, 4), "ready_s": ready, "latency_ms": (ready - due) * 1e3,
                     "audio_s": audio_s(tokens, last, chunk.lookahead), "turn_start": first,
                     "wave": session.last_speech.detach().cpu().clone()})
        if i == 0:
            live[ci]["ttfa_ms"] = (ready - live[ci]["due0"]) * 1e3
        live[ci]["chunks"] += 1
    for ci, c in live.items():
        saved[ci].append(_state_copy(c["session"]))
    for ci in live:
        player([r for r in rows if r["conversation"] == ci])
    _check_after(args, convos, stock, device, live, rows, saved)


def _check_after(args, convos, stock, device, live, rows, saved) -> None:
    """Stock on each conversation's events after the timed run (one stock tail, set up
    again per voice and turn): each chunk's waveform and PCM, and the state at each turn's
    end, against what the optimized session gave; stock's own timings, uncontended."""
    import torch
    from ..lockstep import chunk_seed, state_mismatches, sync
    from ..pcm import pcm_bytes
    for c in convos:
        prompt, mine = live[c.index]["prompt"], [r for r in rows if r["conversation"] == c.index]
        ends = iter(saved[c.index])
        sync(device)
        t_setup = time.perf_counter()
        stock.set_stream_cache(*prompt)
        sync(device)
        setup_s, chunks = time.perf_counter() - t_setup, iter(mine)
        for t, turn in enumerate(c.turns):
            if t:
                stock.set_stream_cache(*prompt)
            for tokens, last in turn:
                r = next(chunks)
                torch.manual_seed(chunk_seed(args.seed * 100 + c.index, r["chunk"]))
                sync(device)
                t1 = time.perf_counter()
                stock.stream(tokens, last_chunk=last, return_waveform=True)
                sync(device)
                r["stock_ms"] = (time.perf_counter() - t1) * 1e3
                stock_wave = stock.last_speech.detach().cpu()
                r["wave_equal"] = bool(torch.equal(r["wave"], stock_wave))
                r["pcm_equal"] = pcm_bytes(r["wave"].float().numpy()) == pcm_bytes(stock_wave.float().numpy())
                r["state_equal"], r["mismatched"], r["state_checked"] = True, [], False
                del r["wave"]
                if r["chunk"] == 0:
                    live[c.index]["ttfa_ms"] = (live[c.index]["ttfa_ms"], (setup_s + r["stock_ms"] / 1e3) * 1e3)
            r["mismatched"] = state_mismatches(stock.state(), next(ends))  # the turn's end: every carried tensor
            r["state_equal"], r["state_checked"] = not r["mismatched"], True


def _report(args, rules: str, convos, live, rows, device, percentile, idle=()) -> dict:
    import torch

    def shares(rs):
        n = len(rs) or 1
        return (round(sum(r["route"].startswith(("graph", "replay")) for r in rs) / n, 4),
                round(sum(r["route"].startswith("replay") for r in rs) / n, 4))

    def fallbacks(rs):
        out: dict[str, int] = {}
        for r in rs:
            if r["route"].startswith("fallback: "):
                out[r["route"][10:]] = out.get(r["route"][10:], 0) + 1
        return out

    def ms(rs, key):
        xs = [r[key] for r in rs if r["chunk"] > 0]
        return (round(percentile(xs, 50), 2), round(percentile(xs, 99), 2)) if xs else (None, None)

    per = []
    for c in convos:
        rs = [r for r in rows if r["conversation"] == c.index]
        prog, rep = shares(rs)
        p50, p99 = ms(rs, "ms")
        per.append({"conversation": c.index, "prompt_tokens": c.prompt_tokens, "turns": len(c.turns),
                    "chunks": len(rs), "exact": all(r["wave_equal"] and r["pcm_equal"] and r["state_equal"] for r in rs),
                    "program_share": prog, "replayed_share": rep, "fallbacks": fallbacks(rs),
                    "ttfa_ms": round(live[c.index]["ttfa_ms"][0], 1),
                    "stock_ttfa_ms": round(live[c.index]["ttfa_ms"][1], 1),
                    "setup_s": live[c.index]["session"].stats().get("setup_s"),
                    "background": live[c.index]["session"].stats().get("background"),
                    "chunk_ms_p50": p50, "chunk_ms_p99": p99})
    prog, rep = shares(rows)
    p50, p99 = ms(rows, "ms")
    s50, s99 = ms(rows, "stock_ms")
    ttfa = [p["ttfa_ms"] for p in per]
    stock_ttfa = [p["stock_ttfa_ms"] for p in per]
    return {
        "command": "cadence-fx traffic " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["traffic"] else None,
        "model": args.model, "rules": rules, "device": str(device), "dtype": args.dtype,
        "n_timesteps": args.n_timesteps, "seed": args.seed, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "date": time.strftime("%Y-%m-%d"), "ranges": {k: list(getattr(args, f"{k}_range")) for k in DEFAULTS},
        "conversations": len(convos), "chunks": len(rows),
        "exact": all(p["exact"] for p in per), "program_share": prog, "replayed_share": rep,
        "fallbacks": fallbacks(rows), "off_catalog": args.off_catalog, "background": args.background,
        "capacity": list(args.capacity) if args.capacity else None, "shared_captures": args.shared_captures,
        "working_arenas": working_arenas(live),
        "build_share": foreground.build_share(),
        "idle": args.idle, "idle_s": round(sum(s for s, _ in idle), 3), "captured_idle": sum(n for _, n in idle),
        "specializations": specializations(live),
        "collector": collector.stats(),
        "ttfa_ms_p50": round(percentile(ttfa, 50), 1), "stock_ttfa_ms_p50": round(percentile(stock_ttfa, 50), 1),
        "chunk_ms_p50": p50, "chunk_ms_p99": p99, "stock_chunk_ms_p50": s50, "stock_chunk_ms_p99": s99,
        "peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None,
        **(_paced_report(args, rows, per, percentile) if args.pace else {"pace": False}),
        "per_conversation": per, "per_chunk": rows,
    }


def _paced_report(args, rows, per, percentile) -> dict:
    """``--pace``: latency from arrival (a turn's first chunk apart: it follows a set-up or
    a reset), and the player's stalls, overall and per conversation (added to ``per``)."""
    def lat(rs):
        xs = [r["latency_ms"] for r in rs]
        return (round(percentile(xs, 50), 1), round(percentile(xs, 99), 1)) if xs else (None, None)

    for p in per:
        rs = [r for r in rows if r["conversation"] == p["conversation"]]
        p["stalls"] = sum(r["stall_ms"] > 0 for r in rs)
        p["stall_ms"] = round(sum(r["stall_ms"] for r in rs), 1)
    inner = [r for r in rows if not r["turn_start"]]
    p50, p99 = lat(inner)
    t50, t99 = lat([r for r in rows if r["turn_start"]])
    return {"pace": True, "stagger_s": args.stagger_s, "warm_up_tokens": args.warm_up_tokens, "warm_up_s": args.warm_up_s,
            "latency_ms_p50": p50, "latency_ms_p99": p99,
            "turn_start_latency_ms_p50": t50, "turn_start_latency_ms_p99": t99,
            "stalls": sum(r["stall_ms"] > 0 for r in rows), "stall_ms": round(sum(r["stall_ms"] for r in rows), 1),
            "state_checked": "at every turn's end (after the timed run, on the same seeds)"}


def _emit(args, report: dict) -> None:
    out = sys.stderr if args.json else sys.stdout
    print(md := markdown(report), file=out)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for name, text in (("traffic.json", json.dumps(report, indent=1)), ("traffic.md", md)):
            with open(os.path.join(args.out, name), "w") as f:
                f.write(text)
        plot(report, os.path.join(args.out, "traffic.png"))
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "per_chunk"}))
