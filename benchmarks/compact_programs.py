"""What an executable's graphs leave for the garbage collector, and what the runtime's
step lists for them add (CPU, released Token2Wav, rule S): the measurement behind
docs/architecture.md's "Fewer objects for the collector to walk".

A full collection walks every tracked object, and a new prompt length's executable is
~105k of them at 10 flow steps (fx nodes, ~5.8 tracked objects a node: the node, its
users and inputs dicts, its meta dict, its args tuple...).  The runtime runs a captured
piece through ``runtime/interpret.py``'s step list, never its generated code, and keeps
that list as bytes beside its targets and constants (``graphs.compact_entry`` then lets
a replayed piece's graph go).  This sets up ``--prompt-tokens`` on one optimized model,
then for the last length's executable:

* ``fx_nodes``: the nodes of its entries' graphs (and the shared step each calls), and
  ``tracked_per_length``: what the last length added to the heap (``gc.get_objects()``
  after a collection, against the length before);
* ``interpret_tracked``: the tracked objects the runtime's step lists of the same graphs
  hold after a collection (built, collected, counted), and ``interpret_build_s``;
* ``exact``: each entry walked by ``interpret.run_graph_module`` against the graph's own
  generated code, from the same arena and seed: ``torch.equal`` on every output and on
  the whole arena after;
* ``replay_tracked_per_length``: the model's executables for ``--replay-tokens``
  compiled for replay (rules SRc, lowered and compacted as on CUDA; the CPU cannot
  capture, so the compile alone), what each added to the heap after a collection, and
  ``replay_fx_nodes_left``: the fx nodes the last one's graphs still hold (its parents',
  and whatever ``graphs.compact_entry`` kept).

    OMP_NUM_THREADS=1 python benchmarks/compact_programs.py --n-timesteps 10 --prompt-tokens 23,41

Prints one JSON line.  (Session twenty-eight's first version measured a prototype of
the step lists before interpret.py kept them so: ``docs/results/cpu-2026-12-03-compact/``.)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch
import torch.fx as fx

from cadence_fx.runtime import interpret


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def _flat(out) -> list:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-timesteps", type=int, default=10)
    p.add_argument("--prompt-tokens", default="23,41")
    p.add_argument("--replay-tokens", default="59,77", help="further lengths compiled for replay (SRc, no capture)")
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2

    flow, hift = s2.build_modules(0)
    opt = cadence_fx.optimize(s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps), rules="S", cache=False)
    counts = []
    for tokens in (int(x) for x in args.prompt_tokens.split(",")):
        prompt = s2.synthetic_prompt(tokens, seed=tokens)
        opt.set_stream_cache(*prompt)
        counts.append(_tracked())
    session = opt.session.session if hasattr(opt.session, "session") else opt.session
    exe = session.executable
    graphs = []
    for program in exe.programs.values():
        graphs.append(program.run)
        graphs += [m for m in program.run.modules() if m is not program.run and isinstance(m, fx.GraphModule)]
    nodes = sum(len(g.graph.nodes) for g in graphs)
    before = _tracked()
    t0 = time.perf_counter()
    kept = [interpret._program(g) for g in graphs]  # what a capture's walk builds and keeps
    build_s = time.perf_counter() - t0
    held = _tracked() - before
    # exact: each entry walked against its generated code, same arena and seed
    arena = session.arena.storage
    start = arena.clone()
    inputs = opt.adapter_for(int(prompt[1].shape[1]), prompt[2]).example_inputs()
    exact, runs = True, {}
    with torch.inference_mode():
        for idx, program in sorted(exe.programs.items()):
            call = [inputs[n] for n in exe.inputs] + session._state_args(program)
            arena.copy_(start)
            torch.manual_seed(idx)
            t0 = time.perf_counter()
            want = [t.clone() for t in _flat(program.run(*call))]
            code_s = time.perf_counter() - t0
            want_arena = arena.clone()
            arena.copy_(start)
            torch.manual_seed(idx)
            t0 = time.perf_counter()
            got = _flat(interpret.run_graph_module(program.run, call))
            walk_s = time.perf_counter() - t0
            same = len(want) == len(got) and all(torch.equal(w, g) for w, g in zip(want, got)) \
                and torch.equal(arena, want_arena)
            exact &= same
            runs[idx] = {"exact": same, "code_s": round(code_s, 3), "walk_s": round(walk_s, 3)}
        arena.copy_(start)
    del kept
    # the same model lowered for replay (rules SRc, as on CUDA; the CPU cannot capture, so
    # the compile alone): what each further length's executable leaves for the collector
    from cadence_fx import compiler
    replay, replay_counts = [], [_tracked()]
    for tokens in (int(x) for x in args.replay_tokens.split(",")):
        p = s2.synthetic_prompt(tokens, seed=tokens)
        replay.append(compiler._compile(opt.adapter_for(int(p[1].shape[1]), p[2]), "SRc", programs=opt.programs))
        replay_counts.append(_tracked())
    left = [m for program in replay[-1].programs.values() for m in program.run.modules() if isinstance(m, fx.GraphModule)]
    print(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0], "n_timesteps": args.n_timesteps,
                      "prompt_tokens": args.prompt_tokens, "graphs": len(graphs), "fx_nodes": nodes,
                      "tracked_per_length": counts[-1] - counts[-2] if len(counts) > 1 else None,
                      "interpret_tracked": held, "interpret_build_s": round(build_s, 3),
                      "exact": exact, "entries": runs,
                      "replay_tracked_per_length": [b - a for a, b in zip(replay_counts, replay_counts[1:])],
                      "replay_fx_nodes_left": sum(len(m.graph.nodes) for m in left)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
