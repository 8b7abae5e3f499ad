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
  ``call_module`` (a submodule that is a GraphModule without code, such as the shared
  step a call piece calls, walked the same way: ``run_piece``); so the same kernels,
  with the same arguments;
- every value released right after its last use, and a value nobody uses right after
  it is made, as the generated code's ``x = None`` lines do (``delete_unused_values``
  in ``torch.fx.graph``): tensors are freed in the same order, so a capture allocates
  from its memory pool as it does under the generated code.

A piece whose code is already generated is called as is (``run_piece``).  The step list
a walk follows is built once per piece and kept as bytes (below): a kept executable's
step lists leave the garbage collector almost nothing to walk.
``tests/runtime/test_interpret.py`` checks both against the generated code on graphs
of every kind of node, and the GPU suite checks captured entries against stock.
"""

from __future__ import annotations

import marshal
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


# A step list is kept as one ``marshal`` blob (bytes, which the garbage collector never
# tracks) beside two lists, the call targets and the constants marshal cannot hold
# (dtypes, devices...), so that a kept executable adds a few objects a piece for the
# collector to walk, not several a node (docs/architecture.md, "Fewer objects for the
# collector to walk"; benchmarks/compact_programs.py).  In the blob a node's value is
# ``("r", slot)``, a constant ``("c", index)``, and a tuple, list, dict or slice literal a
# tuple tagged with its kind.
_REF, _CONST, _TUPLE, _LIST, _DICT, _SLICE = "r", "c", "t", "l", "d", "s"
_ATOMS = (int, float, complex, str, bytes, type(None))  # what marshal keeps as it is (bool: an int)


def _encode(a: Any, slot: dict, consts: list) -> Any:
    """``a`` with every node replaced by its slot, every container by a tagged tuple and
    every other object by its index in ``consts``."""
    if isinstance(a, fx.Node):
        return (_REF, slot[a])
    if isinstance(a, tuple) and not hasattr(a, "_fields"):  # torch.Size too: built as a plain tuple
        return (_TUPLE,) + tuple(_encode(x, slot, consts) for x in a)
    if isinstance(a, list):
        return (_LIST,) + tuple(_encode(x, slot, consts) for x in a)
    if isinstance(a, dict):
        return (_DICT,) + tuple((_encode(k, slot, consts), _encode(v, slot, consts)) for k, v in a.items())
    if isinstance(a, slice):
        return (_SLICE, _encode(a.start, slot, consts), _encode(a.stop, slot, consts), _encode(a.step, slot, consts))
    if type(a) in _ATOMS or type(a) is bool:
        return a
    consts.append(a)  # a dtype, a device, a named tuple...: passed as the very object
    return (_CONST, len(consts) - 1)


def _load(t: Any, env: list, consts: list) -> Any:
    """What the generated code's literal builds: plain tuples, lists, dicts and slices."""
    if type(t) is not tuple:
        return t
    kind = t[0]
    if kind == _REF:
        return env[t[1]]
    if kind == _CONST:
        return consts[t[1]]
    if kind == _TUPLE:
        return tuple([_load(x, env, consts) for x in t[1:]])
    if kind == _LIST:
        return [_load(x, env, consts) for x in t[1:]]
    if kind == _DICT:
        return {_load(k, env, consts): _load(v, env, consts) for k, v in t[1:]}
    return slice(_load(t[1], env, consts), _load(t[2], env, consts), _load(t[3], env, consts))


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
    targets: list = []  # call_function targets, by index
    consts: list = []
    index: dict[int, int] = {}
    inputs: list[int] = []
    output = None
    for i, n in enumerate(nodes):
        if n.op == "placeholder":
            if n.args or n.kwargs:
                raise RuntimeError(f"placeholder {n.name} has a default value: not supported here")
            inputs.append(i)
            continue
        if n.op == "output":
            output = _encode(n.args[0], slot, consts)
            break
        free = list(frees[i])
        if not n.users:
            free.append(i)
        target = n.target
        if n.op == "call_function":
            target = index.setdefault(id(n.target), len(targets))
            if target == len(targets):
                targets.append(n.target)
        steps.append((i, n.op, target, _encode(tuple(n.args), slot, consts), _encode(dict(n.kwargs), slot, consts),
                      tuple(free)))
    prog = (marshal.dumps((tuple(inputs), tuple(steps), output)), len(nodes), targets, consts)
    _PROGRAMS[gm] = prog
    return prog


def drop_graph(gm: torch.nn.Module) -> bool:
    """Keep ``gm``'s step list and let its graph go (``graphs.compact_entry``): ``run_piece``
    walks it from the list; calling it directly, or asking for its code, which would make
    code from the empty graph, raises instead.  Only a GraphModule without generated code
    and without hooks (what ``run_piece`` walks); returns whether it was dropped."""
    if not isinstance(gm, fx.GraphModule) or has_code(gm) or gm._forward_pre_hooks or gm._forward_hooks:
        return False
    _program(gm)
    cls = type(gm)  # its own class (one per GraphModule)
    for name in ("forward", "_lazy_forward", "recompile", "real_recompile", "_real_recompile", "force_recompile"):
        setattr(cls, name, _dropped)  # code from the empty graph would compute nothing: raise
    let_go_module(gm)
    return True


def let_go_module(gm: torch.nn.Module) -> None:
    """Unlink the graph of a module nothing will run or rewrite again (``PassManager``'s
    ``let_go``: the module partition replaced), so that its nodes are freed by reference
    count as the build drops it, not found by the collection that ends the build; the
    module is left with an empty graph.  Anything but a GraphModule is left alone."""
    if not isinstance(gm, fx.GraphModule):
        return
    graph, old = fx.Graph(), gm._graph
    graph.owning_module = gm
    gm._graph = graph  # the property's setter would generate code
    _let_go(old)


def _let_go(graph: fx.Graph) -> None:
    """Unlink a graph nothing uses any more (``let_go_module`` swapped it out), so that its
    nodes are freed by reference count as it goes rather than found by a collection.

    A node links to its neighbours, its users and its inputs, and the graph's name table
    and lookup table hold every node: the graph is one reference cycle, and a build's
    dropped pieces were about half the ~190k objects the young collection at its end
    walked (10 flow steps, a new prompt length; ``benchmarks/let_go_cost.py``).  Only
    those links go (``object.__setattr__``: fx's ``Node.__setattr__`` does more; no node
    is left pointing at another, so freeing one never frees a chain); the nodes' names,
    targets and ``meta`` stay as they were.  Best effort: an fx that keeps them under
    other names leaves the rest to the collector."""
    nodes = list(graph.nodes)
    put = object.__setattr__
    try:
        for node in nodes:
            node.users.clear()
            node._input_nodes.clear()
            put(node, "_args", ())
            put(node, "_kwargs", {})
            put(node, "_prev", None)
            put(node, "_next", None)
        put(graph._root, "_prev", None)
        put(graph._root, "_next", None)
        put(graph, "_graph_namespace", None)
        put(graph, "_find_nodes_lookup_table", None)
    except (AttributeError, TypeError):
        pass


def _dropped(self, *args, **kwargs):
    raise RuntimeError("this piece's graph was let go once its step list was built (runtime.graphs.compact_entry): "
                       "run it with runtime.interpret.run_piece")


def run_graph_module(gm: fx.GraphModule, args: Sequence[Any]) -> Any:
    """What ``gm(*args)`` computes, by walking its graph (see the module docstring)."""
    blob, size, targets, consts = _program(gm)
    inputs, steps, output = marshal.loads(blob)
    if len(args) != len(inputs):
        raise TypeError(f"{type(gm).__name__} takes {len(inputs)} arguments, got {len(args)}")
    env: list[Any] = [None] * size
    for i, a in zip(inputs, args):
        env[i] = a
    for i, op, target, a, kw, free in steps:
        a, kw = _load(a, env, consts), _load(kw, env, consts)
        if op == "call_function":
            env[i] = targets[target](*a, **kw)
        elif op == "get_attr":
            env[i] = attr(gm, target)
        elif op == "call_method":
            self_obj, *rest = a
            env[i] = getattr(self_obj, target)(*rest, **kw)
        elif op == "call_module":  # a GraphModule without code (a shared step) by its step list too
            sub = gm.get_submodule(target)
            env[i] = run_piece(sub, a) if not kw else sub(*a, **kw)
        else:
            raise RuntimeError(f"unexpected node op {op!r}")
        for j in free:
            env[j] = None
    return _load(output, env, consts)


def run_graph(gm: torch.fx.GraphModule, args: Sequence[Any], call_module) -> Any:
    """Execute ``gm``'s top-level graph node by node, routing ``call_module`` nodes."""
    env: dict[torch.fx.Node, Any] = {}
    it = iter(args)
    load = lambda a: torch.fx.node.map_arg(a, lambda n: env[n])  # noqa: E731
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "get_attr":
            env[node] = getattr(gm, node.target)
        elif node.op == "call_function":
            env[node] = node.target(*load(node.args), **load(node.kwargs))
        elif node.op == "call_module":
            env[node] = call_module(gm.get_submodule(node.target), load(node.args))
        elif node.op == "output":
            return load(node.args[0])
        else:
            raise RuntimeError(f"unexpected node {node.format_node()}")
