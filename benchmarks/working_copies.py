"""What a working arena's graphs hold for their static inputs, paired: one copy buffer for all
of them (``GraphPool(every_input=True)``, since session fifty-one) against a clone of its own
per graph (before).

Runs ``cadence-fx traffic`` (shared captures on a capacity, its window and flush shapes
prepared and captured, every chunk against its own stock tail) and at the end reports, per
working arena: the graphs captured, their static inputs' bytes summed graph by graph, the
bytes of the storages those inputs lie in (what is held), the largest graph's, and the copy
buffer's bytes and growths; with the traffic's verdict (``exact``, ``program_share``) and the
process's peak RSS.  ``--clones`` runs the earlier behaviour (each graph's own clones): run
both, in separate processes, on the same arguments.

On the CPU capture is faked (``tests/helpers/fake_capture.py``: a "graph" re-runs its piece
on the tensors it was captured on, so a replay reading memory another graph overwrote would
be a wrong chunk), which is how the bytes are counted here; on CUDA the captures are real.

    python3 benchmarks/working_copies.py [--clones] -- --device cpu --rules SRc --n-timesteps 2 \\
        --conversations 2 --turns 1 --seed 0 --capacity 500 --prepare --shared-captures \\
        --window-range 8,9 --flush-range 1,2 --steady-range 2,2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def arena_report(working) -> dict:
    """A working arena's captured graphs and what their static inputs hold, in MiB."""
    got, copies, mib = working.static_inputs(), working.pool.copies if working.pool is not None else None, 2 ** 20
    return {"graphs": working.held(), "static_inputs_summed_mib": round(got["summed"] / mib, 1),
            "largest_graph_mib": round(got["largest"] / mib, 1), "held_mib": round(got["held"] / mib, 1),
            "storages": got["storages"],
            "copy_buffers_mib": round(copies.held_bytes / mib, 1) if copies is not None else None,
            "copy_buffer_grown": copies.grown if copies is not None else None}


def fake_capture_unless_cuda(argv: list) -> None:
    """On the CPU (no ``cuda`` in the traffic's arguments) fake CUDA-graph capture for this
    process and let rules SR/SRc through, as the tests do (``tests/helpers/fake_capture.py``)."""
    if "cuda" in " ".join(argv):
        return
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from _pytest.monkeypatch import MonkeyPatch
    from helpers.fake_capture import fake_capture
    from cadence_fx import capacity_executable, compiler
    from cadence_fx.integrations import dropin
    mp = MonkeyPatch()
    fake_capture(mp)
    for module in (compiler, dropin, capacity_executable):  # SRc on the CPU: captures faked
        mp.setattr(module, "check_rules", lambda rules, device: rules)


def run_traffic(argv: list) -> tuple[int, dict]:
    """``cadence-fx traffic`` with ``argv`` (``--json`` added to it, so the caller's report
    shows the arguments run) in this process, its printout swallowed: its exit status and its
    JSON report ({} if it printed none)."""
    import contextlib
    import io
    from cadence_fx.tools.cli import main as cli
    if "--json" not in argv:
        argv.append("--json")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli(["traffic", *argv])
    return rc, next((json.loads(line) for line in buf.getvalue().splitlines()[::-1] if line.startswith("{")), {})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clones", action="store_true", help="each graph's static inputs as clones of its own (before)")
    ap.add_argument("traffic", nargs=argparse.REMAINDER, help="-- then cadence-fx traffic's arguments")
    args = ap.parse_args()
    argv = [a for a in args.traffic if a != "--"]
    from cadence_fx.runtime import working
    from cadence_fx.tools import traffic
    fake_capture_unless_cuda(argv)
    if args.clones:  # every_input off for every pool: a clone per graph, as before
        from cadence_fx.runtime import pools
        real_init = pools.GraphPool.__init__
        pools.GraphPool.__init__ = lambda self, parent=None, every_input=False: real_init(self, parent, False)
    arenas: list = []
    real_drive = traffic._drive

    def drive(*a, **k):
        out = real_drive(*a, **k)
        gc.collect()
        arenas.extend(o for o in gc.get_objects() if isinstance(o, working.WorkingArena))
        return out
    traffic._drive = drive
    rc, out_json = run_traffic(argv)
    report = {"variant": "clones" if args.clones else "one copy buffer", "traffic_rc": rc,
              **{k: out_json.get(k) for k in ("exact", "program_share", "replayed_share", "chunks")},
              "arenas": [arena_report(w) for w in arenas],
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
              "torch": torch.__version__, "argv": argv}
    if torch.cuda.is_available() and "cuda" in " ".join(argv):
        report["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2 ** 20)
    print(json.dumps(report))
    return 0 if report["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
