"""``DiskCache``: symbolic steps kept on disk, so a new process specializes instead of tracing
(and, through ``save_record``/``fetch_record``, any record: ``capacity_build``'s capacity
graphs, in the same files, keyed apart).

An entry is one file, ``<key>.cfx``, where ``key`` is the SHA-256 of a canonical JSON
of everything the symbolic step depends on except the weights' values
(``key_parts``): this file's format version, the cadence_fx and torch versions, the
adapter's class and ``cache_identity()`` (upstream package and version), its
declaration (``Declaration.to_json``), the paths, shapes and dtypes of its
``modules()``' parameters and buffers, and the ``symbolic_key`` (catalog entry,
steps, input specs, fixed dims, dtype, device, placement).  A change to any of them
is a different file: a miss.

The file is a header line (the key parts, the payload's length and SHA-256) and the
payload (``serialize.encode_step``, pickled).  ``load`` rejects, with a one-line
reason (``last_rejection``, ``counts``, and the progress callback), an entry it cannot
trust: unreadable, a format or key-part mismatch, a payload whose hash differs
(corrupt or truncated), a parameter path the model lacks or holds at another shape
or dtype.  It never raises: the compiler traces again and ``save`` overwrites the
entry (written to a temporary file and renamed, so a reader never sees half a file).
The directory is trusted like torch's own compile caches: the payload is a pickle.

Processes sharing a directory (replicas starting together, test workers) trace a key
once: ``claim`` holds ``<key>.lock`` (an advisory ``flock``, released by the OS if the
holder dies) while the compiler looks again and traces; a second process waits, says
so through the progress callback, then loads what the first wrote.  It waits at most
``wait_s`` (``$CADENCE_FX_CACHE_WAIT_S``, default 900 s): a holder that hangs makes the
waiter trace on its own, never wait forever.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from ..errors import NeedsForeground
from ..passes.trace_symbolic import SymbolicStep
from .serialize import ModuleTensorDiffers, Rejected, decode_step, encode_step

FORMAT = 2  # 2: symbolic steps traced with trace_memo (and its stats stored)
MAGIC = b"cadence_fx symbolic step\n"
ENV = "CADENCE_FX_CACHE_DIR"
WAIT_ENV = "CADENCE_FX_CACHE_WAIT_S"
DEFAULT_WAIT_S = 900.0  # a released model's first trace takes minutes on a small CPU


def default_cache_dir() -> Path:
    """``$CADENCE_FX_CACHE_DIR``, else ``$XDG_CACHE_HOME/cadence_fx``, else ``~/.cache/cadence_fx``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "cadence_fx"


def open_disk_cache(cache: "bool | str | os.PathLike | DiskCache | None",
                    progress: Callable[[str], None] | None = None) -> "DiskCache | None":
    """``optimize``'s ``cache`` argument as a ``DiskCache``: True (default directory),
    False/None (none), a directory, or a ``DiskCache``."""
    if cache is None or cache is False:
        return None
    if isinstance(cache, DiskCache):
        return cache
    return DiskCache(default_cache_dir() if cache is True else cache, progress)


def parameter_signature(modules: Mapping[str, torch.nn.Module]) -> dict[str, Any]:
    """Paths, shapes and dtypes (not values) of the modules' parameters and buffers: their count and digest.

    (Plain tensor attributes are not in it: a model may build or move one on first use;
    ``load`` checks those the step reads.)"""
    rows = []
    for prefix, module in modules.items():
        for kind, named in (("p", module.named_parameters(remove_duplicate=False)),
                            ("b", module.named_buffers(remove_duplicate=False))):
            rows += [[kind, f"{prefix}.{path}", list(t.shape), str(t.dtype)] for path, t in named]
    return {"count": len(rows), "sha256": hashlib.sha256(_canonical(rows).encode()).hexdigest()}


def key_parts(adapter, key: tuple) -> dict[str, Any]:
    """What the entry for ``key`` (a ``symbolic_key``) of ``adapter``'s model depends on."""
    from .. import __version__
    cls = type(adapter)
    return {"format": FORMAT, "cadence_fx": __version__, "torch": str(torch.__version__),
            "adapter": f"{cls.__module__}.{cls.__qualname__}", "identity": adapter.cache_identity(),
            "declaration": adapter.declaration.to_json(), "parameters": parameter_signature(adapter.modules()),
            "symbolic_key": list(key)}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


class DiskCache:
    """Symbolic steps by ``key_parts`` in ``directory`` (created on the first ``save``).

    ``counts``: ``hits``, ``misses``, ``rejected``, ``writes``, ``unsaved``, ``waits``
    (claims that found another process tracing the key); ``last_rejection``: the last
    entry ``load`` rejected and why (``None``: none yet).  ``wait_s``: the longest a claim
    waits for another holder (default ``$CADENCE_FX_CACHE_WAIT_S``, else 900 s).
    """

    def __init__(self, directory: "str | os.PathLike", progress: Callable[[str], None] | None = None,
                 wait_s: float | None = None):
        self.directory = Path(directory).expanduser()
        self.progress = progress
        if wait_s is None:
            try:
                wait_s = float(os.environ.get(WAIT_ENV) or DEFAULT_WAIT_S)
            except ValueError:
                raise ValueError(f"${WAIT_ENV} must be a number of seconds, not {os.environ[WAIT_ENV]!r}") from None
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0 seconds, not {wait_s!r}")
        self.wait_s = float(wait_s)
        self.counts = {"hits": 0, "misses": 0, "rejected": 0, "writes": 0, "unsaved": 0, "waits": 0}
        self.last_rejection: str | None = None

    def __repr__(self) -> str:
        return f"DiskCache({str(self.directory)!r})"

    def path_for(self, parts: Mapping[str, Any]) -> Path:
        return self.directory / f"{hashlib.sha256(_canonical(parts).encode()).hexdigest()}.cfx"

    def exists(self, parts: Mapping[str, Any]) -> bool:
        return self.path_for(parts).is_file()

    @contextlib.contextmanager
    def claim(self, parts: Mapping[str, Any], what: str = "") -> Iterator[bool]:
        """Hold the entry's lock while the caller looks again and traces it; yields whether
        it had to wait for another holder (who may have written the entry meanwhile).
        After ``wait_s`` it stops waiting and yields ``True`` without the lock (the caller
        looks again, then traces on its own; ``save`` replaces files atomically).

        Without ``fcntl`` (Windows) or a writable directory it holds nothing (each process
        traces on its own, as before).  Threads of one process exclude each other too
        (each claim opens its own file description)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield False
            return
        path = self.path_for(parts).with_suffix(".lock")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self._say(f"program cache: no lock for {path.name} ({_line(e)}); tracing without it")
            yield False
            return
        try:
            name = what or path.stem[:16]
            waited = not _try_lock(fcntl, fd)
            if waited:
                self.counts["waits"] += 1
                self._say(f"program cache: another process is tracing {name}; waiting for it "
                          f"(at most {self.wait_s:g} s)")
                t0, pause = time.perf_counter(), 0.02
                while not _try_lock(fcntl, fd):
                    left = self.wait_s - (time.perf_counter() - t0)
                    if left <= 0:
                        self._say(f"program cache: gave up waiting for {name} after {self.wait_s:g} s; "
                                  "tracing it here")
                        break
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, 0.5)
                else:
                    self._say(f"program cache: waited {time.perf_counter() - t0:.1f} s for {name}")
            yield waited
        finally:
            os.close(fd)  # releases the lock (the file stays: removing it would race a waiter)

    def _say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(msg)

    def save(self, parts: Mapping[str, Any], step: SymbolicStep, modules: Mapping[str, torch.nn.Module]) -> Path | None:
        """Write ``step`` under ``parts`` (replacing any entry there); ``None`` if it cannot be stored."""
        return self.save_record(parts, lambda: encode_step(step, modules))

    def save_record(self, parts: Mapping[str, Any], record: Callable[[], Any]) -> Path | None:
        """Write what ``record()`` returns (plain picklable data) under ``parts``, replacing
        any entry there; ``None`` if it cannot be stored (said through the progress callback)."""
        path = self.path_for(parts)
        try:
            payload = pickle.dumps(record(), protocol=pickle.HIGHEST_PROTOCOL)
            header = {"format": FORMAT, "parts": json.loads(_canonical(parts)), "payload_bytes": len(payload),
                      "payload_sha256": hashlib.sha256(payload).hexdigest()}
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}-", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except Exception as e:  # noqa: BLE001 - an entry not written is only a trace next time
            self.counts["unsaved"] += 1
            self._say(f"program cache: not saving {path.name}: {type(e).__name__}: {_line(e)}")
            return None
        self.counts["writes"] += 1
        return path

    def load(self, parts: Mapping[str, Any], modules: Mapping[str, torch.nn.Module]) -> SymbolicStep | None:
        """The step stored under ``parts``, bound to ``modules``; ``None`` on a miss or a rejection."""
        return self.fetch(parts, modules)[0]

    def fetch(self, parts: Mapping[str, Any], modules: Mapping[str, torch.nn.Module],
              prepare: Callable[[], None] | None = None) -> tuple[SymbolicStep | None, str | None]:
        """``(step, None)``, ``(None, None)`` on a miss, or ``(None, reason)`` on a rejection.

        ``prepare``: where a module tensor the step reads is at another shape, dtype or
        device (a table the model moves to its device on first use), run it (the step
        once, for real) and bind again; the entry is rejected if that does not settle it.
        """
        def decode(record):
            try:
                return decode_step(record, modules)
            except ModuleTensorDiffers as e:
                if prepare is None:
                    raise
                self._say(f"program cache: {self.path_for(parts).name}: {e}; running the step once")
                prepare()
                return decode_step(record, modules)
        return self.fetch_record(parts, decode)

    def fetch_record(self, parts: Mapping[str, Any], decode: Callable[[Any], Any],
                     again: str = "tracing again") -> tuple[Any, str | None]:
        """``(decode(record), None)`` for the entry stored under ``parts``, ``(None, None)`` on a
        miss, or ``(None, reason)`` where the file or ``decode`` rejects it (``Rejected``, or any
        damage: counted, and said with ``again``, what the caller does instead)."""
        path = self.path_for(parts)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.counts["misses"] += 1
            return None, None
        except OSError as e:
            return None, self._reject(path, f"unreadable: {_line(e)}", again)
        try:
            value = decode(self._payload(data, parts))
        except Rejected as e:
            return None, self._reject(path, str(e), again)
        except NeedsForeground:  # ``prepare`` in a background build: not the file's fault
            raise
        except Exception as e:  # noqa: BLE001 - any damage is a rejection, never the user's error
            return None, self._reject(path, f"unreadable: {type(e).__name__}: {_line(e)}", again)
        self.counts["hits"] += 1
        return value, None

    def _payload(self, data: bytes, parts: Mapping[str, Any]) -> dict:
        if not data.startswith(MAGIC):
            raise Rejected("not a cadence_fx program file")
        head, sep, payload = data[len(MAGIC):].partition(b"\n")
        if not sep:
            raise Rejected("truncated header")
        header = json.loads(head)
        if header.get("format") != FORMAT:
            raise Rejected(f"format {header.get('format')}; this cadence_fx reads format {FORMAT}")
        stored, want = header.get("parts", {}), json.loads(_canonical(parts))
        differ = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
        if differ:
            raise Rejected(f"written for other {', '.join(differ)}")
        if len(payload) != header.get("payload_bytes") or \
                hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
            raise Rejected(f"payload SHA-256 mismatch ({len(payload)} bytes, {header.get('payload_bytes')} "
                           "written): corrupt or truncated")
        return pickle.loads(payload)

    def _reject(self, path: Path, reason: str, again: str = "tracing again") -> str:
        self.counts["rejected"] += 1
        self.last_rejection = f"{path.name}: {reason}"
        self._say(f"program cache: rejected {path.name}: {reason}; {again}")
        return reason


def _try_lock(fcntl, fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__
