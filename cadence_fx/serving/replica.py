"""Conversations by id on one optimized model (``Replica``), and sticky routing over
several (``Router``): the in-process core of a multi-GPU deployment.

A ``Replica`` owns one set of weights (one GPU) and many conversations, each a session on
its own CUDA stream.  It admits at most ``max_conversations`` (take it from ``serve-sim
--sweep``'s ``max_sessions_holding_cadence``, with headroom) and refuses the next with
``ReplicaFull``, before anything is set up: a conversation is refused, never served
late.  A ``Router`` places each new conversation on a replica chosen by rendezvous
hashing of its id (the first live replica with room, in the id's own order), and sends
every later call to the replica that holds it (sticky).  A replica marked lost fails its
own conversations with ``ReplicaLost``; the other conversations do not notice.

An RPC layer (Ray Serve, a WebSocket server) wraps these calls one for one; the errors
are the library's own, so a client sees the same message either way.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable, Collection, Hashable, Sequence

from ..errors import CadenceError, InputError
from ..runtime.session import check_idle_seconds, time_left
from .tick import TickError, run_tick


class ReplicaFull(CadenceError, RuntimeError):
    """The replica (or every live replica) holds as many conversations as it admits."""


class UnknownConversation(CadenceError, KeyError):
    """No conversation of this id is open here (never opened, or closed)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class ReplicaLost(CadenceError, RuntimeError):
    """The replica that held this conversation is gone; its state went with it."""


class Replica:
    """One optimized model serving conversations by id (``open``, ``send``, ``tick``,
    ``reset``, ``close``).  ``name`` labels it in errors and in ``load()``."""

    def __init__(self, model, max_conversations: int, name: str = "replica"):
        if not isinstance(max_conversations, int) or max_conversations < 1:
            raise InputError(f"max_conversations must be an int >= 1; got {max_conversations!r}")
        self.model, self.max_conversations, self.name = model, max_conversations, name
        self._sessions: dict[Hashable, Any] = {}

    def open(self, conversation: Hashable, *prompt) -> None:
        """A new conversation: its session (on a CUDA stream of its own) set up from
        ``prompt`` (Token2Wav: prompt tokens, mels, speaker vector; a frame codec: none)."""
        if _known(conversation, self._sessions):
            raise InputError(f"conversation {conversation!r} is already open on {self.name}; close it first or "
                             f"use another id")
        if len(self._sessions) >= self.max_conversations:
            raise ReplicaFull(f"{self.name} holds {len(self._sessions)} conversations, its maximum "
                              f"(max_conversations={self.max_conversations}): refused rather than served late")
        import torch
        device = self.model.device
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._sessions[conversation] = self.model.open_session(*prompt, stream=stream)

    def send(self, conversation: Hashable, chunk, last_chunk: bool = False, return_waveform: bool = False):
        """One chunk of ``conversation``: its PCM bytes (or waveform)."""
        return self._session(conversation).stream(chunk, last_chunk=last_chunk, return_waveform=return_waveform)

    def tick(self, work: dict[Hashable, Any], last: Collection[Hashable] = (),
             before_submit: Callable[[Hashable], None] | None = None,
             return_waveform: bool = False) -> dict[Hashable, Any]:
        """One chunk of each conversation in ``work`` (id -> chunk; the ids in ``last`` send
        their flush), all launched before any is read (``run_tick``; ``before_submit(id)``
        right before each launch); id -> PCM bytes (or float waveforms).  A chunk refused
        at submit raises ``TickError`` after the others ran (``results`` in ``work``'s order)."""
        sessions = [self._session(c) for c in work]  # an unknown id launches nothing
        ids = list(work)
        items = [(s, chunk, c in last) for s, (c, chunk) in zip(sessions, work.items())]
        hook = None if before_submit is None else lambda i: before_submit(ids[i])
        return dict(zip(ids, run_tick(items, hook, return_waveform)))

    def reset(self, conversation: Hashable) -> None:
        """A new turn of the conversation: its state right after its prompt's set-up."""
        self._session(conversation).reset()

    def idle(self, seconds: float | None = None) -> dict[Hashable, list[int]]:
        """Time between ticks for the conversations' sessions (``StreamSession.idle``): a
        new voice's entries that a background build handed over are captured here rather
        than on its next chunk.  Never waits for a build; ``seconds`` bounds the whole call
        (checked between entries).  Returns id -> the entries captured (only ids with some).
        A conversation whose session refuses (busy in another thread, or broken by a failed
        step until it is restored) is left for its own next call to report."""
        from ..errors import SessionBroken, SessionBusy
        check_idle_seconds(seconds)
        t0, out = time.perf_counter(), {}
        for conversation, session in list(self._sessions.items()):
            left = time_left(seconds, t0)
            if left is not None and left <= 0:
                break
            try:
                captured = session.idle(left)
            except (SessionBusy, SessionBroken):
                continue
            if captured:
                out[conversation] = captured
        return out

    def close(self, conversation: Hashable) -> dict:
        """End the conversation (its memory is freed); returns its final counters."""
        session = self._session(conversation)
        del self._sessions[conversation]
        session.close()
        return session.stats()

    def state(self, conversation: Hashable) -> dict:
        """The conversation's carried state tensors (its session's ``state()``)."""
        return self._session(conversation).state()

    def conversations(self) -> list[Hashable]:
        return list(self._sessions)

    def load(self) -> dict[str, Any]:
        return {"replica": self.name, "conversations": len(self._sessions), "max": self.max_conversations}

    def require(self, conversation: Hashable) -> None:
        """Raise ``UnknownConversation`` unless ``conversation`` is open here (an id that
        cannot key a table: ``InputError``)."""
        self._session(conversation)

    def _session(self, conversation: Hashable):
        if not _known(conversation, self._sessions):
            raise UnknownConversation(f"no conversation {conversation!r} is open on {self.name}; open it first "
                                      f"(or it was closed)")
        return self._sessions[conversation]


def _known(conversation: Hashable, table: dict) -> bool:
    """Whether ``table`` holds the id; an id that cannot key a table is an ``InputError``."""
    try:
        return conversation in table
    except TypeError:
        raise InputError(f"a conversation id must be hashable; got {type(conversation).__name__}") from None


def rank(conversation: Hashable, names: Sequence[str]) -> list[int]:
    """Replica indices in the conversation's own order (rendezvous hashing: each id
    prefers replicas by hash(id, replica), so adding or losing a replica moves only
    the conversations that were on it)."""
    key = repr(conversation).encode()
    score = [hashlib.sha256(key + b"\0" + n.encode()).digest() for n in names]
    return sorted(range(len(names)), key=lambda i: score[i], reverse=True)


class Router:
    """Conversations spread over ``replicas`` and kept on the one that opened them."""

    def __init__(self, replicas: Sequence[Replica]):
        if not replicas:
            raise InputError("a Router needs at least one replica")
        names = [r.name for r in replicas]
        if len(set(names)) != len(names):
            raise InputError(f"replica names must be distinct (they key the routing); got {names}")
        self.replicas = list(replicas)
        self._home: dict[Hashable, int] = {}
        self._lost: dict[int, str] = {}

    def open(self, conversation: Hashable, *prompt) -> str:
        """Open on the first live replica with room in the id's order; its name."""
        if _known(conversation, self._home):
            raise InputError(f"conversation {conversation!r} is already open (on "
                             f"{self.replicas[self._home[conversation]].name})")
        full = []
        for i in rank(conversation, [r.name for r in self.replicas]):
            if i in self._lost:
                continue
            try:
                self.replicas[i].open(conversation, *prompt)
            except ReplicaFull:
                full.append(self.replicas[i].name)
                continue
            self._home[conversation] = i
            return self.replicas[i].name
        raise ReplicaFull(f"every live replica is full ({', '.join(full) or 'none live'}): conversation "
                          f"{conversation!r} refused rather than served late")

    def send(self, conversation: Hashable, chunk, last_chunk: bool = False, return_waveform: bool = False):
        return self._replica(conversation).send(conversation, chunk, last_chunk, return_waveform)

    def reset(self, conversation: Hashable) -> None:
        self._replica(conversation).reset(conversation)

    def idle(self, seconds: float | None = None) -> dict[Hashable, list[int]]:
        """``Replica.idle`` on every live replica in turn (``seconds`` bounds the whole call)."""
        check_idle_seconds(seconds)
        t0, out = time.perf_counter(), {}
        for i, replica in enumerate(self.replicas):
            left = time_left(seconds, t0)
            if left is not None and left <= 0:
                break
            if i not in self._lost:
                out.update(replica.idle(left))
        return out

    def close(self, conversation: Hashable) -> dict:
        stats = self._replica(conversation).close(conversation)
        del self._home[conversation]
        return stats

    def tick(self, work: dict[Hashable, Any], last: Collection[Hashable] = (),
             before_submit: Callable[[Hashable], None] | None = None) -> dict[Hashable, Any]:
        """One chunk per conversation (``last``: the ids sending their flush), every
        replica's share launched before any is read (``before_submit`` as ``Replica.tick``);
        id -> PCM bytes, or the exception for a conversation that failed (a lost replica's,
        an unknown id, a refused chunk) while the others ran."""
        out: dict[Hashable, Any] = {}
        by_replica: dict[int, dict[Hashable, Any]] = {}
        for c, w in work.items():
            try:
                by_replica.setdefault(self._index(c), {})[c] = w
            except CadenceError as e:
                out[c] = e
        for i, share in by_replica.items():
            try:
                out.update(self.replicas[i].tick(share, last, before_submit))
            except TickError as e:
                for c, r in zip(share, e.results):
                    out[c] = r
                for n, err in e.errors.items():
                    out[list(share)[n]] = err
        return {c: out[c] for c in work}

    def mark_lost(self, name: str, why: str = "lost") -> list[Hashable]:
        """The replica ``name`` is gone (its process died): its conversations fail with
        ``ReplicaLost`` from now on; returns their ids.  New ones go elsewhere."""
        i = next((k for k, r in enumerate(self.replicas) if r.name == name), None)
        if i is None:
            raise InputError(f"no replica named {name!r}; replicas: {[r.name for r in self.replicas]}")
        self._lost[i] = why
        return [c for c, k in self._home.items() if k == i]

    def placement(self) -> dict[Hashable, str]:
        return {c: self.replicas[i].name for c, i in self._home.items()}

    def _index(self, conversation: Hashable) -> int:
        if not _known(conversation, self._home):
            raise UnknownConversation(f"no conversation {conversation!r} is open; open it first (or it was closed)")
        i = self._home[conversation]
        if i in self._lost:
            raise ReplicaLost(f"conversation {conversation!r} was on {self.replicas[i].name}, which is "
                              f"{self._lost[i]}: its state is gone; open it again (a new voice set-up)")
        return i

    def _replica(self, conversation: Hashable) -> Replica:
        return self.replicas[self._index(conversation)]
