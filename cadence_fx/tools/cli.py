"""``cadence-fx`` / ``python -m cadence_fx``: explain, verify, demo, bench, serve-sim, soak, traffic.

The models are built from the upstream PyPI packages at their released
configuration with seeded random weights (``--checkpoint DIR`` loads real ones).
"""

from __future__ import annotations

import argparse
import sys

from . import demo, explain, traffic, verify
from .bench import cmd as bench
from .serve import cmd as serve

#: name, help, the command's options, the command
COMMANDS = (
    ("explain", "print the plan: clocks, regions, catalog, arena, verdicts", explain.add_args, explain.run),
    ("verify", "stock vs optimized, every chunk, bit for bit", verify.add_args, verify.run),
    ("demo", "the main job: ~10 s through stock and optimized, two WAVs, the verdict", demo.add_args, demo.run),
    ("bench", "variants side by side (--model token2wav|mimi): one long-lived process per variant, matched blocks "
              "interleaved, exactness vs stock", bench.add_bench_args, bench.cmd_bench),
    ("serve-sim", "N sessions on a virtual 1 s cadence: SPEAK time, deadline misses, peak memory, stock vs "
                  "optimized (--sweep: the largest N that holds)", serve.add_serve_args, serve.cmd_serve_sim),
    ("soak", "one optimized session for many chunks: flat memory, exact checkpoints", serve.add_soak_args,
     serve.cmd_soak),
    ("traffic", "MiniCPM-o-shaped conversations (new voices, turns, windows, flushes, resets) interleaved on one "
                "optimized model, each against stock", traffic.add_args, traffic.run),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadence-fx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, help_, add_args, fn in COMMANDS:
        p = sub.add_parser(name, help=help_)
        add_args(p)
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    if getattr(args, "chunks", None) is not None and args.chunks < 1:  # bench: None is the model's default
        parser.error("--chunks must be >= 1")
    try:
        return args.fn(args)
    except Exception as e:  # noqa: BLE001 - one clear line for known errors
        from ..errors import CadenceError
        if isinstance(e, CadenceError):
            print(f"cadence-fx: {type(e).__name__}: {e}", file=sys.stderr)
            if getattr(args, "json", False):  # --json's promise holds on an error too: its last stdout line
                import json
                print(json.dumps({"command": args.cmd, "error": str(e), "error_type": type(e).__name__,
                                  "exit_code": 2}), flush=True)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
