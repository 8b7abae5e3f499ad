"""The optimized tail on Ray Serve: one replica per GPU, many conversations each, routed
sticky by id; over a Python handle and over HTTP/WebSocket.  ``pip install
'cadence_fx[ray]'``.

``app(build, replicas=N, max_conversations=M)`` is a Serve application of N tail
deployments (``tail-0`` ... ``tail-{N-1}``, one replica each, ``num_gpus=1`` on CUDA)
and one ``TailRouter`` in front (the ingress, CPU only):

- A **tail replica** (``TailReplica``) calls ``build()`` once (its optimized model: one
  set of weights) and serves up to M conversations on it (``Replica``).  Concurrent
  ``send`` calls are batched (``serve.batch``) into one ``run_tick``: every session's
  chunk is launched on its own CUDA stream before any is read, as ``serve-sim
  --overlap`` measures.  All model work runs on one thread of the replica, one batch or
  call at a time.  When that thread has nothing queued, the replica gives its
  conversations idle time (``Replica.idle``): with a model that builds a new voice's
  programs in the background (``set_background(True)``; ``registry.build_optimized``'s
  ``background`` option), the entries a build handed over are captured there, not on a
  chunk, in slices of about one capture; a call that arrives meanwhile waits for at
  most the capture under way
  (``idle=False`` turns this off; ``load()`` reports it); while a build still runs it
  looks again every ``IDLE_REARM_S``, so what lands is captured even if no call comes.  Each replica process has an *incarnation* id; a conversation is
  bound to the incarnation that opened it, so a replica that died and came back never
  serves a conversation whose state went with the old process.
- The **router** places a new conversation by rendezvous hashing of its id (the first
  replica with room in the id's own order: ``replica.rank``) and sends every later call
  to that replica and incarnation.  A full replica refuses before any set-up
  (``ReplicaFull``); every replica full refuses the conversation: never a late chunk.
  A replica that died fails its own conversations with ``ReplicaLost``; the others do
  not notice.  The placement table lives in the router; a router that restarts asks
  the replicas which conversations they hold.

Errors are the library's own (``InputError``, ``UnknownConversation``, ``ReplicaFull``,
``ReplicaLost``...), raised at the handle's caller as they would be in-process; over
HTTP they are status codes with ``{"error": class, "message": ...}``.

HTTP (under the app's route prefix; tensors as ``cadence_fx.serving.wire`` JSON):
``POST /conversations/{id}`` ``{"prompt": [tensor, ...]}`` -> ``{"replica": name}``;
``POST /conversations/{id}/chunk`` ``{"chunk": tensor, "last": false, "seed": null}``
-> ``audio/L16`` PCM bytes; ``POST /conversations/{id}/reset``; ``DELETE
/conversations/{id}`` -> the session's counters; ``GET /load``.  WebSocket
``/conversations/{id}/stream``: JSON messages ``{"op": "open", "prompt": [...]}``,
``{"op": "chunk", "chunk": tensor, "last": bool, "seed": int|null}`` (answered with a
binary message: PCM bytes), ``{"op": "reset"}``, ``{"op": "close"}``; every other answer
is JSON, an error ``{"error": ..., "message": ...}`` keeps the socket (and the
conversation) open.
"""


import asyncio
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable, Sequence

try:
    import ray
    from ray import serve
except ImportError as e:  # pragma: no cover - exercised only where ray is missing
    raise ImportError("cadence_fx.serving.ray needs Ray Serve: pip install 'cadence_fx[ray]'") from e
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response

from ..errors import CadenceError, InputError
from ..pcm import pcm_bytes
from . import wire
from .replica import Replica, ReplicaFull, ReplicaLost, TickError, UnknownConversation, _known, rank

#: seconds of idle time per ``Replica.idle`` call in a replica's quiet time: about one
#: capture (0.5-0.8 s on the H200 at 5 steps) runs past it, then a queued call goes first
IDLE_SLICE_S = 0.05
#: seconds after a quiet time that ended with a background build still running before the
#: replica looks again (what lands meanwhile is captured then, not on the next chunk)
IDLE_REARM_S = 0.5

#: HTTP status of each refusal (anything else the library raises on bad input: 400)
STATUS = {UnknownConversation: 404, ReplicaFull: 503, ReplicaLost: 410}


class TailReplica:
    """One optimized model (``build()``) serving conversations by id; one per GPU."""

    def __init__(self, build: Callable[[], Any], max_conversations: int, name: str,
                 torch_threads: int | None = None, batch_wait_s: float = 0.002, idle: bool = True):
        import torch
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.name = name
        self.incarnation = f"{name}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._work = ThreadPoolExecutor(1, thread_name_prefix=name)  # the model's one thread
        self.replica = Replica(build(), max_conversations, name)
        self.ticks = {"ticks": 0, "chunks": 0, "largest": 0}  # the batches run_tick launched together
        self.idle = bool(idle)
        # idle time the model thread gave the conversations (``_idle``), for ``load()``
        self.idle_time = {"idle_runs": 0, "idle_captured": 0, "idle_s": 0.0, "idle_errors": 0,
                          "idle_last_error": None}
        self._queued = 0  # model-thread calls queued or running (counted on the event loop)
        self._rearmed = threading.Event()  # a timer will look again (``_idle``)
        self._batch.set_max_batch_size(max_conversations)
        self._batch.set_batch_wait_timeout_s(batch_wait_s)

    async def _run(self, fn: Callable, *args):
        self._queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._work, fn, *args)
        finally:
            self._queued -= 1
            if self._queued == 0 and self.idle:
                self._work.submit(self._idle)  # the thread's next job, unless a call comes first

    def _idle(self) -> None:
        """Idle time on the model thread (``Replica.idle``): entries a background build
        handed over are captured here, not on a conversation's next chunk.  In slices of
        ``IDLE_SLICE_S`` (about one capture each: the budget is checked between entries),
        for as long as nothing is queued and a slice captured something, so a call that
        arrives meanwhile waits for at most the capture under way.  Never raises (a
        failure is counted in ``load()``, and the session it concerns reports it at its
        next call)."""
        if self._queued:
            return
        t0 = time.perf_counter()
        while not self._queued:
            try:
                captured = self.replica.idle(IDLE_SLICE_S)
            except Exception as e:  # noqa: BLE001 - a housekeeping job: counted, never lost silently
                self.idle_time["idle_errors"] += 1
                self.idle_time["idle_last_error"] = f"{type(e).__name__}: {e}"
                break
            self.idle_time["idle_captured"] += sum(len(v) for v in captured.values())
            if not captured:
                break
        self.idle_time["idle_runs"] += 1
        self.idle_time["idle_s"] = round(self.idle_time["idle_s"] + time.perf_counter() - t0, 6)
        # a build still running lands later: look again then, even if no call comes meanwhile
        builds_done = getattr(self.replica.model, "wait_for_builds", None)
        if builds_done is not None and not self._rearmed.is_set() and not builds_done(0):
            self._rearmed.set()
            timer = threading.Timer(IDLE_REARM_S, self._rearm)
            timer.daemon = True
            timer.start()

    def _rearm(self) -> None:
        """The timer ``_idle`` set while a build ran: more idle time, unless a call is queued
        (its completion starts idle time anyway)."""
        self._rearmed.clear()
        if not self._queued:
            self._work.submit(self._idle)

    def _check(self, incarnation: str, conversation: Hashable) -> None:
        if incarnation != self.incarnation:
            raise ReplicaLost(f"conversation {conversation!r} was opened on {incarnation}, a process of "
                              f"{self.name} that ended (now {self.incarnation}): its state is gone; open it "
                              f"again (a new voice set-up)")

    async def open(self, conversation: Hashable, prompt: Sequence = ()) -> str:
        """Set the conversation up here (prompt tensors come over the wire on the CPU: moved
        to the model's device); the incarnation every later call must name."""
        await self._run(lambda: self.replica.open(conversation, *[self._here(p) for p in prompt]))
        return self.incarnation

    def _here(self, value):
        import torch
        return value.to(self.replica.model.device) if isinstance(value, torch.Tensor) else value

    async def send(self, incarnation: str, conversation: Hashable, chunk, last_chunk: bool = False,
                   seed: int | None = None, return_waveform: bool = False):
        """One chunk: PCM bytes (or the float waveform), batched with the concurrent others."""
        self._check(incarnation, conversation)
        out = await self._batch((conversation, chunk, bool(last_chunk), seed, bool(return_waveform)))
        if isinstance(out, BaseException):
            raise out
        return out

    async def tick(self, items: list[tuple]) -> list:
        """Many conversations' chunks in one request (``TailRouter.tick``): ``items`` of
        ``(incarnation, conversation, chunk, last_chunk, seed, return_waveform)``; per item
        its PCM (or waveform) or the exception that refused it, while the others ran."""
        out: list[Any] = [None] * len(items)
        todo = []
        for n, (incarnation, conversation, *rest) in enumerate(items):
            try:
                self._check(incarnation, conversation)
                todo.append(n)
            except ReplicaLost as e:
                out[n] = e
        got = await self._run(self._tick, [(items[n][1], *items[n][2:]) for n in todo])
        for n, value in zip(todo, got):
            out[n] = value
        return out

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
    async def _batch(self, items: list[tuple]) -> list:
        return await self._run(self._tick, items)

    def _tick(self, items: list[tuple]) -> list:
        """``items`` of ``(conversation, chunk, last_chunk, seed, return_waveform)`` as ticks:
        each conversation once per tick, in arrival order.  An unknown id, or a chunk that
        cannot go to the model's device, is refused alone; the others run."""
        import torch
        out: list[Any] = [None] * len(items)
        chunks: dict[int, Any] = {}
        for i, (c, chunk, *_) in enumerate(items):
            try:
                self.replica.require(c)
                chunks[i] = self._here(chunk)
            except CadenceError as e:
                out[i] = e
            except (RuntimeError, TypeError, ValueError) as e:
                out[i] = InputError(f"chunk of conversation {c!r} cannot go to {self.replica.model.device}: {e}")
        todo = list(chunks)
        while todo:
            tick, later, seen = [], [], set()
            for i in todo:
                (later if items[i][0] in seen else tick).append(i)
                seen.add(items[i][0])
            work = {items[i][0]: chunks[i] for i in tick}
            seeds = {items[i][0]: items[i][3] for i in tick}
            self.ticks["ticks"] += 1
            self.ticks["chunks"] += len(work)
            self.ticks["largest"] = max(self.ticks["largest"], len(work))
            try:
                got = self.replica.tick(work, {items[i][0] for i in tick if items[i][2]},
                                        lambda c: seeds[c] is not None and torch.manual_seed(seeds[c]),
                                        return_waveform=True)
                errors = {}
            except TickError as e:
                got, errors = dict(zip(work, e.results)), {list(work)[n]: err for n, err in e.errors.items()}
            for i in tick:
                c = items[i][0]
                out[i] = errors[c] if c in errors else got[c] if items[i][4] else pcm_bytes(got[c])
            todo = later
        return out

    async def reset(self, incarnation: str, conversation: Hashable) -> None:
        self._check(incarnation, conversation)
        await self._run(self.replica.reset, conversation)

    async def close(self, incarnation: str, conversation: Hashable) -> dict:
        self._check(incarnation, conversation)
        return await self._run(self.replica.close, conversation)

    async def state(self, incarnation: str, conversation: Hashable) -> dict:
        """A CPU copy of the conversation's carried state (for checks against stock)."""
        self._check(incarnation, conversation)
        return await self._run(lambda: {k: v.detach().cpu().clone()
                                        for k, v in self.replica.state(conversation).items()})

    async def holds(self) -> tuple[str, list]:
        """This process's incarnation and the conversations open here."""
        return self.incarnation, self.replica.conversations()

    async def load(self, reset_peak: bool = False) -> dict:
        """Counts, batch sizes and (CUDA) this replica's peak device memory since the last
        ``reset_peak`` reading (``torch.cuda.max_memory_allocated``; None on the CPU)."""
        import torch
        device = self.replica.model.device
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        if reset_peak and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        return {**self.replica.load(), "incarnation": self.incarnation, "pid": os.getpid(), **self.ticks,
                **self.idle_time, "peak_memory_bytes": peak}


def _unpack(w) -> tuple:
    """A tick's value: a chunk, or ``{"chunk": ..., "last": bool, "seed": int | None}``."""
    if not isinstance(w, dict):
        return w, False, None
    extra = set(w) - {"chunk", "last", "seed"}
    if "chunk" not in w or extra:
        raise InputError(f"a tick value is a chunk or {{'chunk': ..., 'last': bool, 'seed': int | None}}; got keys "
                         f"{sorted(map(str, w))}")
    return w["chunk"], bool(w.get("last", False)), w.get("seed")


def _error_body(e: BaseException) -> dict:
    return {"error": type(e).__name__, "message": str(e)}


async def _http(fn, request: Request | None):
    """Run ``fn(body)``; bytes as ``audio/L16``, a dict as JSON, the library's errors as status codes."""
    try:
        body = None
        if request is not None:
            try:
                body = await request.json()
            except ValueError:
                raise InputError("the request body is not JSON") from None
        out = await fn(body)
    except CadenceError as e:
        return JSONResponse(_error_body(e), status_code=next((s for k, s in STATUS.items() if isinstance(e, k)), 400))
    if isinstance(out, bytes):
        return Response(out, media_type="audio/L16")
    return out


# serve.ingress pickles the app when the class is defined: what its routes call is defined above
http = FastAPI(title="cadence_fx")


@serve.ingress(http)
class TailRouter:
    """The ingress: sticky placement of conversations over the tail replicas."""

    def __init__(self, *replicas, names: Sequence[str]):
        if not replicas or len(replicas) != len(names) or len(set(names)) != len(names):
            raise InputError(f"a TailRouter needs one distinct name per replica; got {list(names)}")
        self.replicas, self.names = list(replicas), list(names)
        self._home: dict[Hashable, tuple[int, str]] = {}  # id -> (replica index, incarnation)
        self._lost: dict[Hashable, str] = {}  # id -> why (until closed)
        self._opening: set = set()
        self._adopted = False

    # ----------------------------------------------------------------- the handle API
    async def open(self, conversation: Hashable, prompt: Sequence = ()) -> str:
        """Open on the first replica with room in the id's order; the replica's name."""
        await self._adopt()
        if _known(conversation, self._home) or conversation in self._lost or conversation in self._opening:
            raise InputError(f"conversation {conversation!r} is already open (or opening); close it first or use "
                             f"another id")
        self._opening.add(conversation)  # a second open of this id while this one awaits is refused
        try:
            full = []
            for i in rank(conversation, self.names):
                try:
                    incarnation = await self._call(self.replicas[i].open, None, conversation, list(prompt))
                except ReplicaFull:
                    full.append(self.names[i])
                    continue
                except ReplicaLost:
                    full.append(f"{self.names[i]} (unreachable)")
                    continue
                self._home[conversation] = (i, incarnation)
                return self.names[i]
        finally:
            self._opening.discard(conversation)
        raise ReplicaFull(f"every replica is full ({', '.join(full)}): conversation {conversation!r} refused "
                          f"rather than served late")

    async def send(self, conversation: Hashable, chunk, last_chunk: bool = False, seed: int | None = None,
                   return_waveform: bool = False):
        """One chunk of the conversation: PCM bytes (or the float waveform)."""
        return await self._on(conversation, "send", chunk, last_chunk, seed, return_waveform)

    async def tick(self, work: dict, return_waveform: bool = False) -> dict:
        """One chunk of each conversation in ``work`` (id -> chunk, or ``{"chunk": ...,
        "last": bool, "seed": int | None}``) in one request: each replica's share goes to it as one ``tick`` (all
        launched before any is read there), the replicas at once.  Id -> PCM bytes (or the
        waveform), or the exception that refused that conversation (unknown, lost, bad
        input) while the others ran.  Ray's per-request cost is paid once a tick, not once
        a conversation: for a gateway that advances many conversations on one clock."""
        await self._adopt()
        out: dict[Hashable, Any] = {}
        shares: dict[int, list] = {}
        for c, w in work.items():
            try:
                chunk, last, seed = _unpack(w)
                i, incarnation = self._where(c)
            except CadenceError as e:
                out[c] = e
                continue
            shares.setdefault(i, []).append((incarnation, c, chunk, bool(last), seed, return_waveform))

        async def one(i: int, items: list) -> None:
            try:
                got = await self._call(self.replicas[i].tick, None, items)
            except ReplicaLost as e:
                got = [e] * len(items)
            for item, value in zip(items, got):
                if isinstance(value, ReplicaLost):
                    self._mark_lost(item[1], value)
                out[item[1]] = value

        await asyncio.gather(*(one(i, items) for i, items in shares.items()))
        return {c: out[c] for c in work}

    async def reset(self, conversation: Hashable) -> None:
        await self._on(conversation, "reset")

    async def state(self, conversation: Hashable) -> dict:
        return await self._on(conversation, "state")

    async def close(self, conversation: Hashable) -> dict:
        """End the conversation; its counters (a lost one's: ``{"lost": why}``)."""
        await self._adopt()
        if _known(conversation, self._lost):
            return {"lost": self._lost.pop(conversation)}
        try:
            return await self._on(conversation, "close")
        finally:
            self._home.pop(conversation, None)
            self._lost.pop(conversation, None)

    async def placement(self) -> dict:
        await self._adopt()
        return {c: self.names[i] for c, (i, _) in self._home.items()}

    async def load(self, reset_peak: bool = False) -> list[dict]:
        """Each replica's ``load`` (``reset_peak``: start its peak-memory reading anew)."""
        out = []
        for i, r in enumerate(self.replicas):
            try:
                out.append(await self._call(r.load, None, reset_peak))
            except ReplicaLost as e:
                out.append({"replica": self.names[i], "error": str(e)})
        return out

    # ------------------------------------------------------------------------ internals
    async def _on(self, conversation: Hashable, method: str, *args):
        await self._adopt()
        i, incarnation = self._where(conversation)
        try:
            return await self._call(getattr(self.replicas[i], method), incarnation, conversation, *args)
        except ReplicaLost as e:
            self._mark_lost(conversation, e)
            raise

    def _where(self, conversation: Hashable) -> tuple[int, str]:
        """(replica index, incarnation) of an open conversation; ``ReplicaLost`` for one whose
        replica ended, ``UnknownConversation`` for an id not open (``InputError``: unhashable)."""
        if _known(conversation, self._lost):
            raise ReplicaLost(self._lost[conversation])
        if conversation not in self._home:
            raise UnknownConversation(f"no conversation {conversation!r} is open; open it first (or it was closed)")
        return self._home[conversation]

    def _mark_lost(self, conversation: Hashable, why: ReplicaLost) -> None:
        """Every later call of ``conversation`` gets ``why`` until it is closed."""
        self._home.pop(conversation, None)
        self._lost[conversation] = str(why)

    async def _call(self, method, incarnation: str | None, *args):
        """``method.remote(...)`` with the library's errors raised as themselves, and a
        dead replica as ``ReplicaLost``."""
        head = () if incarnation is None else (incarnation,)
        try:
            return await method.remote(*head, *args)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, CadenceError):
                raise cause from None
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            raise ReplicaLost(f"the replica holding this conversation ended ({type(e).__name__}): its state is "
                              f"gone; open it again (a new voice set-up)") from None

    async def _adopt(self) -> None:
        """Once per router process: the conversations the replicas already hold (a router
        that restarted keeps routing them)."""
        if self._adopted:
            return
        self._adopted = True
        for i, r in enumerate(self.replicas):
            try:
                incarnation, held = await self._call(r.holds, None)
            except ReplicaLost:
                continue
            for c in held:
                self._home.setdefault(c, (i, incarnation))

    # --------------------------------------------------------------------------- HTTP
    @http.post("/conversations/{conversation}")
    async def _http_open(self, conversation: str, request: Request):
        return await _http(lambda body: self._open_json(conversation, body), request)

    @http.post("/conversations/{conversation}/chunk")
    async def _http_chunk(self, conversation: str, request: Request):
        return await _http(lambda body: self._chunk_json(conversation, body), request)

    @http.post("/conversations/{conversation}/reset")
    async def _http_reset(self, conversation: str):
        return await _http(lambda body: self._reset_json(conversation), None)

    @http.delete("/conversations/{conversation}")
    async def _http_close(self, conversation: str):
        return await _http(lambda body: self.close(conversation), None)

    @http.get("/load")
    async def _http_load(self):
        return await _http(lambda body: self.load(), None)

    @http.websocket("/conversations/{conversation}/stream")
    async def _ws(self, ws: WebSocket, conversation: str):
        await ws.accept()
        ops = {"open": lambda m: self._open_json(conversation, m), "chunk": lambda m: self._chunk_json(conversation, m),
               "reset": lambda m: self._reset_json(conversation), "close": lambda m: self.close(conversation)}
        try:
            while True:
                message = await ws.receive_json()
                try:
                    op = ops.get(message.get("op")) if isinstance(message, dict) else None
                    if op is None:
                        raise InputError(f"a message is {{'op': one of {sorted(ops)}, ...}}; got {message!r:.80}")
                    out = await op(message)
                except CadenceError as e:
                    await ws.send_json(_error_body(e))
                    continue
                if isinstance(out, bytes):
                    await ws.send_bytes(out)
                else:
                    await ws.send_json(out)
        except WebSocketDisconnect:
            return

    async def _open_json(self, conversation: str, body) -> dict:
        prompt = body.get("prompt", []) if isinstance(body, dict) else None
        if not isinstance(prompt, list):
            raise InputError("'prompt' must be a list of tensors (as cadence_fx.serving.wire writes them)")
        tensors = [wire.decode(p, f"prompt[{k}]") for k, p in enumerate(prompt)]
        return {"replica": await self.open(conversation, tensors)}

    async def _chunk_json(self, conversation: str, body) -> bytes:
        if not isinstance(body, dict) or "chunk" not in body:
            raise InputError("a chunk message needs 'chunk' (a tensor as cadence_fx.serving.wire writes it)")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise InputError(f"'seed' must be an integer or null; got {seed!r}")
        last = body.get("last", False)
        if not isinstance(last, bool):
            raise InputError(f"'last' must be true or false; got {last!r}")
        return await self.send(conversation, wire.decode(body["chunk"], "chunk"), last, seed)

    async def _reset_json(self, conversation: str) -> dict:
        await self.reset(conversation)
        return {"reset": conversation}


def app(build: Callable[[], Any], *, replicas: int = 1, max_conversations: int, num_gpus: float | None = None,
        num_cpus: float = 1, torch_threads: int | None = None, batch_wait_s: float = 0.002,
        health_check_period_s: float = 2.0, idle: bool = True):
    """The Serve application: ``replicas`` tail deployments behind a ``TailRouter``.

    ``build``: a picklable zero-argument callable that returns the optimized model (it
    runs once in each replica process; e.g. ``functools.partial`` of a function of an
    importable module).  ``max_conversations``: per replica; take it from ``serve-sim
    --sweep``'s sessions that hold the cadence on that GPU, with headroom.
    ``num_gpus``: per replica (``1``: one replica per GPU; None: 0).  ``torch_threads``:
    each replica's ``torch.set_num_threads`` (on the CPU the bits depend on it).  ``idle``:
    give the conversations idle time whenever a replica's model thread has nothing queued
    (``TailReplica._idle``; it captures what background builds handed over).
    Deploy with ``serve.run(app(...), name=..., route_prefix=...)``."""
    if not isinstance(replicas, int) or replicas < 1:
        raise InputError(f"replicas must be an int >= 1; got {replicas!r}")
    if not isinstance(max_conversations, int) or max_conversations < 1:
        raise InputError(f"max_conversations must be an int >= 1; got {max_conversations!r}")
    if not callable(build):
        raise InputError(f"build must be a callable that returns the optimized model; got {build!r}")
    names = [f"tail-{k}" for k in range(replicas)]
    tails = [serve.deployment(TailReplica, name=n, num_replicas=1, max_ongoing_requests=2 * max_conversations + 8,
                              health_check_period_s=health_check_period_s,
                              ray_actor_options={"num_gpus": num_gpus or 0, "num_cpus": num_cpus}).bind(
        build, max_conversations, n, torch_threads, batch_wait_s, idle) for n in names]
    router = serve.deployment(TailRouter, name="router", num_replicas=1,
                              max_ongoing_requests=max(100, 4 * replicas * max_conversations),
                              ray_actor_options={"num_cpus": 0})
    return router.bind(*tails, names=names)
