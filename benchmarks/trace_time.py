"""Trace time before and after the two tracing speed-ups, with the graphs compared.

"before" is how tracing ran until now: make_fx builds a new ``FakeTensorMode`` for
every value it records (``trace.one_fake_mode`` off) and the pass pipeline
regenerates the module's code after every pass (``PassManager.recompile_every_pass``).
"after" is the default.  Both compile the same executable (rule S, every catalog
entry); the script checks that each entry's code and recorded metadata are the same
and prints the wall time of each.

    python benchmarks/trace_time.py                      # the toy model (seconds)
    python benchmarks/trace_time.py --model token2wav    # released Token2Wav, 2 flow steps, 10-token prompt

CPU only; run it on an otherwise idle machine (it times one compile per variant).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from cadence_fx import step as meta
from cadence_fx.compiler import _compile
from cadence_fx.passes import trace
from cadence_fx.passes.base import PassManager


@contextlib.contextmanager
def before():
    with mock.patch.object(trace, "one_fake_mode", contextlib.nullcontext), \
            mock.patch.object(PassManager, "recompile_every_pass", True):
        yield


def adapter_for(model: str):
    if model == "toy":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from helpers.toy_models import ToyAdapter, make_toy
        return lambda: ToyAdapter(make_toy(), 2)
    from cadence_fx.integrations import stepaudio2 as s2
    import cadence_fx
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow, hift, n_timesteps=2)
    _, mels, spk = s2.synthetic_prompt(10)
    # a fresh drop-in per compile: its adapter is the one cadence_fx.optimize compiles
    return lambda: cadence_fx.optimize(tail)._adapter(int(mels.shape[1]), spk)


def fingerprint(exe) -> list:
    """Per entry: the code, and every node's recorded value layout and cadence tags."""
    out = []
    for idx, program in sorted(exe.programs.items()):
        gm = program.run
        vals = []
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            vals.append((n.name, (tuple(v.shape), v.dtype, v.stride(), str(v.device))
                         if isinstance(v, torch.Tensor) else repr(type(v)), meta.tag_of(n), meta.scopes(n)))
        out.append((idx, gm.code, vals, meta.arena_inputs(gm)))
    return out


def timed(make_adapter) -> tuple[float, object]:
    adapter = make_adapter()
    t0 = time.perf_counter()
    exe = _compile(adapter, "S")
    return time.perf_counter() - t0, exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("toy", "token2wav"), default="toy")
    ap.add_argument("--repeat", type=int, default=1, help="compiles per variant (the best is reported)")
    args = ap.parse_args()
    make_adapter = adapter_for(args.model)
    if args.model == "toy":
        timed(make_adapter)  # warm-up: first-call costs (imports, op registration) off both numbers
    times = {"before": [], "after": []}
    prints = {}
    for _ in range(args.repeat):
        with before():
            t, exe = timed(make_adapter)
        times["before"].append(t)
        prints["before"] = fingerprint(exe)
        del exe
        t, exe = timed(make_adapter)
        times["after"].append(t)
        prints["after"] = fingerprint(exe)
        del exe
    entries = len(prints["after"])
    same = prints["before"] == prints["after"]
    b, a = min(times["before"]), min(times["after"])
    print(f"{args.model}: {entries} catalog entries, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"  before (a fake mode per value, code regenerated after every pass): {b:.2f} s")
    print(f"  after  (one fake mode, code regenerated once per pipeline):       {a:.2f} s  ({1 - a / b:.0%} less)")
    print(f"  graphs and recorded metadata identical: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
