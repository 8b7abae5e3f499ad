"""Run a captured piece's graph without generating its Python code.

A piece of a replayed entry runs as Python at most twice, both at capture
(``graphs.capture_entry``: the warm-up where the capture stream is not warm yet, then
inside ``torch.cuda.graph``); afterwards only its CUDA graph is launched (a refused
replay walks the piece too).  Generating its code (``GraphModule.recompile``:
source text, then ``compile``) costs more than those two runs: about a second per new
prompt length for a released decoder's pieces.  ``run_graph_module`` runs the graph as that
code would:

- the same calls in the same order: ``target(*args, **kwargs)`` for a
  ``call_function`` (what ``x[0]`` or ``a + b`` in the generated code calls too), the
  attribute for a ``get_attr``, the method or submodule for ``call_method`` and
  ``call_module``; so the same kernels, with the same arguments;
- every value released right after its last use, and a value nobody uses right after
  it is made, as the generated code's ``x = None`` lines do (``delete_unused_values``
  in ``torch.fx.graph``): tensors are freed in the same order, so a capture allocates
  from its memory pool as it does under the generated code.

A piece whose code is already generated is called as is (``run_piece``).
``tests/runtime/test_interpret.py`` checks both against the generated code on graphs
of every kind of node, and the GPU suite checks captured entries against stock.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch
import torch.fx as fx

from ..step import attr

#: piece -> its compiled node list (built once per piece, shared by every capture of it)
_PROGRAMS: "weakref.WeakKeyDictionary[fx.GraphModule, tuple]" = weakref.WeakKeyDictionary()


def has_code(gm: torch.nn.Module) -> bool:
    """Whether calling ``gm`` runs generated code that exists already (a lazy
    GraphModule's is generated on its first call)."""
    needs = getattr(type(gm), "_needs_recompile", None)
    return not (isinstance(gm, fx.GraphModule) and needs is not None and needs())


def run_piece(piece: torch.nn.Module, args: Sequence[Any]) -> Any:
    """``piece(*args)``: by its generated code where it has some, else by its graph."""
    if isinstance(piece, fx.GraphModule) and not has_code(piece) and not piece._forward_pre_hooks \
            and not piece._forward_hooks:
        return run_graph_module(piece, args)
    return piece(*args)


class _Ref:
    """A node's value in the walk's environment (slot ``i``)."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _template(a: Any, slot: dict) -> tuple[Any, bool]:
    """``a`` with every node replaced by its ``_Ref``, and whether it must be rebuilt per
    call (it holds a node, a list or a dict): built as plain tuples, lists, dicts and
    slices, which is what the generated code's literals build (fx stores immutable ones)."""
    if isinstance(a, fx.Node):
        return _Ref(slot[a]), True
    if isinstance(a, tuple) and not hasattr(a, "_fields"):
        items = [_template(x, slot) for x in a]
        return tuple(t for t, _ in items), any(d for _, d in items)
    if isinstance(a, list):
        return [_template(x, slot)[0] for x in a], True
    if isinstance(a, dict):
        return {k: _template(v, slot)[0] for k, v in a.items()}, True
    if isinstance(a, slice):
        items = [_template(x, slot) for x in (a.start, a.stop, a.step)]
        return (slice(*(t for t, _ in items)), True) if any(d for _, d in items) else (a, False)
    return a, False


def _load(t: Any, env: list) -> Any:
    tt = type(t)
    if tt is _Ref:
        return env[t.i]
    if tt is tuple:
        return tuple([_load(x, env) for x in t])
    if tt is list:
        return [_load(x, env) for x in t]
    if tt is dict:
        return {k: _load(v, env) for k, v in t.items()}
    if tt is slice:
        return slice(_load(t.start, env), _load(t.stop, env), _load(t.step, env))
    return t


def _program(gm: fx.GraphModule) -> tuple:
    prog = _PROGRAMS.get(gm)
    if prog is not None:
        return prog
    nodes = list(gm.graph.nodes)
    slot = {n: i for i, n in enumerate(nodes)}
    # what the generated code frees after each node: values whose last use it is
    # (walking backwards, as torch.fx.graph does), and the node itself if unused
    seen: set = set()
    frees: list[list[int]] = [[] for _ in nodes]
    for i in range(len(nodes) - 1, -1, -1):
        for a in nodes[i].all_input_nodes:
            if a not in seen:
                seen.add(a)
                frees[i].append(slot[a])
    steps = []
    inputs: list[int] = []
    output = None
    for i, n in enumerate(nodes):
        if n.op == "placeholder":
            if n.args or n.kwargs:
                raise RuntimeError(f"placeholder {n.name} has a default value: not supported here")
            inputs.append(i)
            continue
        if n.op == "output":
            output = _template(n.args[0], slot)[0]
            break
        free = list(frees[i])
        if not n.users:
            free.append(i)
        args, args_dynamic = _template(tuple(n.args), slot)
        kwargs, kwargs_dynamic = _template(dict(n.kwargs), slot)
        steps.append((i, n.op, n.target, args, args_dynamic, kwargs, bool(kwargs), tuple(free)))
    prog = (slot, tuple(inputs), tuple(steps), output, len(nodes))
    _PROGRAMS[gm] = prog
    return prog


def run_graph_module(gm: fx.GraphModule, args: Sequence[Any]) -> Any:
    """What ``gm(*args)`` computes, by walking its graph (see the module docstring)."""
    slot, inputs, steps, output, size = _program(gm)
    if len(args) != len(inputs):
        raise TypeError(f"{type(gm).__name__} takes {len(inputs)} arguments, got {len(args)}")
    env: list[Any] = [None] * size
    for i, a in zip(inputs, args):
        env[i] = a
    for i, op, target, a, a_dynamic, kw, has_kw, free in steps:
        if a_dynamic:
            a = _load(a, env)
        kw = _load(kw, env) if has_kw else {}
        if op == "call_function":
            env[i] = target(*a, **kw)
        elif op == "get_attr":
            env[i] = attr(gm, target)
        elif op == "call_method":
            self_obj, *rest = a
            env[i] = getattr(self_obj, target)(*rest, **kw)
        elif op == "call_module":
            env[i] = gm.get_submodule(target)(*a, **kw)
        else:
            raise RuntimeError(f"unexpected node op {op!r}")
        for j in free:
            env[j] = None
    return _load(output, env)
