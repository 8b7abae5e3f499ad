"""What a voice's OWN graphs hold for their static inputs (a session of its own, no working
arena): summed entry by entry, the largest entry's, and the storages they lie in.

Since session fifty-one a working arena's graphs share one copy buffer
(``GraphPool(every_input=True)``, ``runtime/pools.py``); a session's own pool still gives each
graph clones of its own of what it reads from the eager islands (only its shared calls' reads
lie in its copy buffer).  A session runs one chunk at a time, as a working arena does, so the
same buffer would hold its largest entry's copies instead of every entry's: this measures
what that would save per voice before it is built (``held`` minus ``largest``).

Runs ``cadence-fx traffic`` with ONE conversation (every graph found is that voice's), rules
SRc without shared captures, every chunk against its own stock tail; on the CPU capture is
faked (``tests/helpers/fake_capture.py``), which is how the bytes are counted here.  With
``--shared-captures`` the graphs found are the working arena's instead: the control, which
must show the copies ``benchmarks/working_copies.py`` counts there.

    python3 benchmarks/session_copies.py -- --device cpu --rules SRc --n-timesteps 2 \\
        --conversations 1 --turns 1 --seed 0 --window-range 8,9 --flush-range 1,2 --steady-range 2,2
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys

import torch


def captured_parents() -> list:
    """Every live graph module with a captured region: one per captured entry or specialization."""
    from cadence_fx.runtime.graphs import CapturedRegion
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, torch.fx.GraphModule)
            and any(isinstance(m, CapturedRegion) and m.graph is not None for m in o.children())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traffic", nargs=argparse.REMAINDER, help="-- then cadence-fx traffic's arguments")
    argv = [a for a in ap.parse_args().traffic if a != "--"]
    if "--conversations" not in argv or argv[argv.index("--conversations") + 1] != "1":
        ap.error("one conversation (--conversations 1): every graph found must be that voice's")
    from cadence_fx.runtime.working import static_inputs
    from cadence_fx.tools import traffic
    from working_copies import fake_capture_unless_cuda, run_traffic  # (this folder)
    fake_capture_unless_cuda(argv)
    found: dict = {}
    real_drive = traffic._drive

    def drive(*a, **k):  # the voice's graphs, before the driver lets its session go
        out = real_drive(*a, **k)
        parents = captured_parents()
        found.update(static_inputs(parents), entries=len(parents))
        return out
    traffic._drive = drive
    rc, out = run_traffic(argv)
    mib = 2 ** 20
    report = {"traffic_rc": rc, **{k: out.get(k) for k in ("exact", "program_share", "replayed_share", "chunks")},
              "captured_entries": found.get("entries"),
              **{f"{k}_mib": round(found.get(k, 0) / mib, 1) for k in ("summed", "largest", "held")},
              **{f"{k}_bytes": found.get(k) for k in ("summed", "largest", "held")},
              "storages": found.get("storages"),
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
              "torch": torch.__version__, "argv": argv}
    print(json.dumps(report))
    return 0 if report["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
