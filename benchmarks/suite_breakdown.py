"""Where the CPU suite's time goes: each test file's seconds split by what the library ran.

A pytest plugin and its report.  As a plugin (``-p suite_breakdown``, this folder on
``PYTHONPATH``) it wraps a few of the library's entry points and adds up, per test file,
the *exclusive* seconds (a call inside another is counted once, in the inner one) of:
``build`` (the models' seeded construction), ``trace`` (symbolic and concrete traces),
``specialize``, ``passes``, ``stock`` (the stock Token2Wav tail's set-up and chunks) and
``opt`` (an optimized session's steps); on a thread other than the main one (a background
build) under ``thread:<name>``.  Each xdist worker writes ``worker-<id>.json`` into
``$SUITE_BREAKDOWN_DIR``.  What is not wrapped (Mimi and VibeVoice chunks, processes the
tests start, Ray) is the rest of each file's wall time.

    mkdir -p /tmp/sb && SUITE_BREAKDOWN_DIR=/tmp/sb PYTHONPATH=benchmarks \\
        python -m pytest tests -q -n 2 --dist loadfile -p suite_breakdown -p no:cacheprovider
    python benchmarks/suite_breakdown.py /tmp/sb          # the table, then one JSON line

Timing only: every check runs as without it.
"""

from __future__ import annotations

import collections
import functools
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path

_TOTALS: dict = collections.defaultdict(float)
_FILE = {"now": "?"}
_LOCAL = threading.local()
WRAPPED = (  # (module, class or None, attribute, category): where the callers look the name up
    ("cadence_fx.integrations.stepaudio2", None, "build_modules", "build"),
    ("cadence_fx.programs.entry", None, "trace_symbolic", "trace"),
    ("cadence_fx.compiler", None, "trace_step", "trace"),
    ("cadence_fx.programs.entry", None, "specialize", "specialize"),
    ("cadence_fx.passes.base", "PassManager", "__call__", "passes"),
    ("cadence_fx.integrations.stepaudio2.stock", "Token2WavTail", "stream", "stock"),
    ("cadence_fx.integrations.stepaudio2.stock", "Token2WavTail", "set_stream_cache", "stock"),
    ("cadence_fx.runtime.session", "Session", "step", "opt"),
)


def _wrap(module: str, owner: str | None, name: str, category: str) -> None:
    mod = importlib.import_module(module)
    obj = getattr(mod, owner) if owner else mod
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        key = category if threading.current_thread() is threading.main_thread() else f"thread:{category}"
        stack = getattr(_LOCAL, "stack", None)
        if stack is None:
            stack = _LOCAL.stack = []
        stack.append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            inner = stack.pop()
            _TOTALS[(_FILE["now"], key)] += dt - inner
            if stack:
                stack[-1] += dt

    setattr(obj, name, timed)


def pytest_configure(config):
    for spec in WRAPPED:
        _wrap(*spec)


def pytest_runtest_setup(item):
    _FILE["now"] = item.nodeid.split("::")[0]


def pytest_runtest_logreport(report):
    _TOTALS[(report.nodeid.split("::")[0], f"wall:{report.when}")] += report.duration


def pytest_sessionfinish(session):
    out = os.environ.get("SUITE_BREAKDOWN_DIR")
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(out, f"worker-{worker}.json").write_text(json.dumps([[f, c, v] for (f, c), v in _TOTALS.items()]))


def report(folder: str) -> dict:
    files: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    for path in sorted(Path(folder).glob("worker-*.json")):
        for f, c, v in json.loads(path.read_text()):
            files[f][c] += v
    total = collections.Counter()
    for parts in files.values():
        for c, v in parts.items():
            total["wall" if c.startswith("wall:") else c] += v
    return {"total_s": {k: round(v, 1) for k, v in total.most_common()},
            "files": {f: {"wall_s": round(sum(v for c, v in p.items() if c.startswith("wall:")), 1),
                          **{c: round(v, 1) for c, v in sorted(p.items()) if not c.startswith("wall:")}}
                      for f, p in sorted(files.items(), key=lambda fp: -sum(v for c, v in fp[1].items()
                                                                            if c.startswith("wall:")))}}


if __name__ == "__main__":
    r = report(sys.argv[1])
    for f, p in r["files"].items():
        print(f"{p['wall_s']:7.1f}  {f}  " + ", ".join(f"{c} {v}" for c, v in p.items() if c != "wall_s" and v >= 1))
    print(json.dumps(r))
