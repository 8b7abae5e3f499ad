"""What an executable's graphs would leave for the garbage collector as compact step lists
(CPU, released Token2Wav, rule S): the measurement behind docs/architecture.md's "Fewer
objects for the collector to walk".

A full collection walks every tracked object, and a new prompt length's executable is
~105k of them at 10 flow steps (fx nodes, ~5.8 tracked objects a node: the node, its
users and inputs dicts, its meta dict, its args tuple...).  The runtime runs a captured
piece through ``runtime/interpret.py``'s compiled step list, never its generated code; a
step list made of atoms alone (tuples of ints, strings, dtypes; every node reference a
``("r", slot)`` pair; the targets in one list per graph) is untracked by CPython at its
next collection.  This sets up ``--prompt-tokens`` on one optimized model, then for the
last length's executable:

* ``fx_nodes``: the nodes of its entries' graphs (and the shared step each calls), and
  ``tracked_per_length``: what the last length added to the heap (``gc.get_objects()``
  after a collection, against the length before);
* ``compact_tracked``: the tracked objects the compact step lists of the same graphs hold
  after a collection (measured: built, collected, counted); ``interpret_tracked``: the same
  for the runtime's own step lists today (``interpret._program``, kept for every piece a
  capture walks, beside the graph);
* ``exact``: each entry run through its compact list (a call of the shared step through
  that step's list) against the graph's own generated code, from the same arena and
  seed: ``torch.equal`` on every output and on the whole arena after; and the same through
  the runtime's own walk (``interpret.run_graph_module``).

    OMP_NUM_THREADS=1 python benchmarks/compact_programs.py --n-timesteps 10 --prompt-tokens 23,41

Prints one JSON line.  A prototype for measuring: the runtime does not use it.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch
import torch.fx as fx

from cadence_fx.step import attr

_OPS = {"call_function": 0, "get_attr": 1, "call_method": 2, "call_module": 3}


def _encode(a, slot: dict):
    """``a`` as atoms: every container a tuple tagged with its kind, a node ``("r", slot)``."""
    if isinstance(a, fx.Node):
        return ("r", slot[a])
    if isinstance(a, tuple) and not hasattr(a, "_fields"):
        return ("t",) + tuple(_encode(x, slot) for x in a)
    if isinstance(a, list):
        return ("l",) + tuple(_encode(x, slot) for x in a)
    if isinstance(a, dict):
        return ("d",) + tuple((k, _encode(v, slot)) for k, v in a.items())
    if isinstance(a, slice):
        return ("s", _encode(a.start, slot), _encode(a.stop, slot), _encode(a.step, slot))
    if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format)):
        return a
    raise TypeError(f"not an atom: {type(a).__name__}")


def _decode(a, env: list):
    if type(a) is not tuple:
        return a
    kind = a[0]
    if kind == "r":
        return env[a[1]]
    if kind == "t":
        return tuple(_decode(x, env) for x in a[1:])
    if kind == "l":
        return [_decode(x, env) for x in a[1:]]
    if kind == "d":
        return {k: _decode(v, env) for k, v in a[1:]}
    return slice(*(_decode(x, env) for x in a[1:]))


def compact(gm: fx.GraphModule) -> tuple:
    """``(targets, inputs, steps, output, size)``: the graph as interpret.py runs it (the same
    calls in the same order, each value freed after its last use), in atoms but ``targets``."""
    nodes = list(gm.graph.nodes)
    slot = {n: i for i, n in enumerate(nodes)}
    seen, frees = set(), [[] for _ in nodes]
    for i in range(len(nodes) - 1, -1, -1):
        for a in nodes[i].all_input_nodes:
            if a not in seen:
                seen.add(a)
                frees[i].append(slot[a])
    targets, index, inputs, steps, output = [], {}, [], [], None
    for i, n in enumerate(nodes):
        if n.op == "placeholder":
            inputs.append(i)
        elif n.op == "output":
            output = _encode(n.args[0], slot)
            break
        else:
            if n.op == "call_function":
                key = id(n.target)
                if key not in index:
                    index[key] = len(targets)
                    targets.append(n.target)
                target = index[key]
            else:
                target = n.target  # a string
            free = tuple(frees[i]) + (() if n.users else (i,))
            steps.append((i, _OPS[n.op], target, _encode(tuple(n.args), slot), _encode(dict(n.kwargs), slot), free))
    return targets, tuple(inputs), tuple(steps), output, len(nodes)


def run_compact(prog: tuple, gm: fx.GraphModule, args, subprograms: dict):
    targets, inputs, steps, output, size = prog
    env: list = [None] * size
    for i, a in zip(inputs, args):
        env[i] = a
    for i, op, target, a, kw, free in steps:
        a, kw = _decode(a, env), _decode(kw, env)
        if op == 0:
            env[i] = targets[target](*a, **kw)
        elif op == 1:
            env[i] = attr(gm, target)
        elif op == 2:
            env[i] = getattr(a[0], target)(*a[1:], **kw)
        else:
            sub = gm.get_submodule(target)
            env[i] = run_compact(subprograms[id(sub)], sub, a, subprograms) if id(sub) in subprograms \
                else sub(*a, **kw)
        for j in free:
            env[j] = None
    return _decode(output, env)


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def _flat(out) -> list:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-timesteps", type=int, default=10)
    p.add_argument("--prompt-tokens", default="23,41")
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
    programs = {id(g): compact(g) for g in graphs}
    build_s = time.perf_counter() - t0
    held = _tracked() - before
    # what the runtime's own compiled step lists (runtime/interpret.py, built for every piece a
    # capture walks) hold for the same graphs today
    from cadence_fx.runtime import interpret
    before = _tracked()
    kept = [interpret._program(g) for g in graphs]
    interpret_held = _tracked() - before
    del kept
    # exact: each entry through its compact list against its generated code, same arena and seed
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
            got = _flat(run_compact(programs[id(program.run)], program.run, call, programs))
            compact_s = time.perf_counter() - t0
            same = len(want) == len(got) and all(torch.equal(w, g) for w, g in zip(want, got)) \
                and torch.equal(arena, want_arena)
            arena.copy_(start)  # and the runtime's own walk (runtime/interpret.py)
            torch.manual_seed(idx)
            walked = _flat(interpret.run_graph_module(program.run, call))
            same &= len(want) == len(walked) and all(torch.equal(w, g) for w, g in zip(want, walked)) \
                and torch.equal(arena, want_arena)
            exact &= same
            runs[idx] = {"exact": same, "code_s": round(code_s, 3), "compact_s": round(compact_s, 3)}
        arena.copy_(start)
    print(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0], "n_timesteps": args.n_timesteps,
                      "prompt_tokens": args.prompt_tokens, "graphs": len(graphs), "fx_nodes": nodes,
                      "tracked_per_length": counts[-1] - counts[-2] if len(counts) > 1 else None,
                      "compact_tracked": held, "compact_build_s": round(build_s, 3),
                      "interpret_tracked": interpret_held,
                      "exact": exact, "entries": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
