"""The bench's worker processes: started together, then spoken to one at a time."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Mapping

#: the module each worker runs (``python -m``)
WORKER_MODULE = "cadence_fx.tools.bench.worker"


def worker_cmd(python: str, variant: str, opts: dict[str, Any]) -> list[str]:
    cmd = [python, "-m", WORKER_MODULE, "--variant", variant]
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


def worker_env() -> dict[str, str]:
    """The driver's environment, with this cadence_fx first on the path and cuBLAS made deterministic."""
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env

