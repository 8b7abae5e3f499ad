"""One capacity graph, built or loaded from the program cache on disk (architecture item 4).

``capacity_graph`` makes the rule-S graph of one symbolic step at a capacity (a catalog
entry's, or an off-catalog window's or flush's with its chunk length bound): ``bind_dims``,
``check_guards``, ``capacity_form`` and its postcondition, ``check_dims``, then the
compiler's rule-S passes (``rewrite_pipeline``).  On an H100 host that is 2.5-15 s a shape,
and a server prepares about fifty shapes a capacity; so with the model's ``DiskCache``
(``ProgramStore.disk``) the result is stored, and a new process loads it instead.

What is stored (``serialize.encode_graph``): the rule-S graph's nodes with the meta the
later passes read (tags, scopes, the capacity modes, each node's recorded value as sizes
and strides: a fake tensor again on load), its constants (the model's tensors by path,
bound to the live model on load), its ``CapacityPlan`` and its bound symbolic step.  Folded
constants (``FoldHostConstants``: made of the model's buffers and tables, e.g. a noise
table) are not stored: their recipe is (the folded nodes, ``keep_recipe``), and a load
computes them again from its own model's tensors, by the same ops on the same device, as
a build would.  The lowering for replay (``lowered_copy``) and the hazard-walk plan are
made again on load, as after a build.

The key (``graph_parts``) is everything else the graph is a function of: the program
cache's key parts of the model (versions, adapter, declaration, parameter shapes), a
digest of the symbolic step's content (``step_digest``: its nodes, guards and constants'
paths), the capacity, the chunk's bound length, the example inputs' specs, the arena's
slot layout, the attention setting, the device (model, CUDA and cuDNN versions; on the
CPU its instruction set and thread count: the attention probe's verdicts and the folded
constants' bits are the eager path's on that kind of device) and a digest of cadence_fx's
own sources.  Any change is another file: a miss, and the graph is built again.  A file
that does not load (damaged, another format, a model tensor path it names missing or at
another shape) is rejected with its reason (``DiskCache.counts``, the progress line) and
built again, never used.
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.fx as fx

from . import step as meta
from .compiler import rewrite_pipeline
from .foreground import in_background
from .passes.capacity import at_dims, attention_probe, capacity_form, check_dims
from .passes.capacity_plan import _MODE, _OF, CapacityPlan
from .passes.fold_host_constants import FOLDS
from .passes.specialize import bind_dims, check_guards
from .passes.trace_symbolic import SymbolicStep
from .programs.disk import key_parts
from .runtime import collector
from .programs.serialize import (Rejected, Unserializable, decode_graph, decode_step, encode_graph, encode_step,
                                 step_digest, tensor_paths)

#: the stored record's layout (a change is another key: every older file a miss)
GRAPH_FORMAT = 1
_KEYS = (meta.TAG, meta.SCOPE, meta.SYM, _MODE, _OF, "val")


def attention_for(sym: SymbolicStep, dims: Mapping[str, int], masked_attention, device):
    """``capacity_form``'s ``masked_attention`` for ``sym`` at the capacity ``dims``: as given,
    or for ``"probe"`` the device's probe (``capacity.attention_probe``) over every length
    1..capacity of a one-dim step (a step of several dims: exact attention).  On a background
    build's thread the probe does not run (its attention calls are random ops to the build's
    fence, which keeps the streams' generators untouched): the graph's attention runs exact."""
    if masked_attention != "probe":
        return masked_attention
    if not _probes(len(sym.dims)):
        return False
    (d,) = sym.dims
    return attention_probe(sym, dims, {d: list(range(1, int(dims[d]) + 1))}, device)


def _probes(free_dims: int) -> bool:
    """Whether ``"probe"`` runs the device's probe for a step of ``free_dims`` symbolic dims here
    (``attention_for``'s, and the key's, one reading)."""
    return free_dims == 1 and not in_background()


def _attention_key(masked_attention, free_dims: int) -> "str | None":
    """What decides the graph's attention, as the key holds it (None: a caller's own probe,
    not stored)."""
    if masked_attention == "probe":
        return "probe" if _probes(free_dims) else "exact"
    return repr(masked_attention) if isinstance(masked_attention, bool) else None


def capacity_graph(adapter, sym: SymbolicStep, dims: Mapping[str, int], chunk: Mapping[str, int], by_region: dict,
                   masked_attention, device: torch.device, example: list, bindings: Callable, programs=None,
                   label: str = "", say: Callable[[str], None] | None = None, run: bool = True) -> tuple:
    """``(gm, cplan, bound, how)``: ``sym``'s rule-S capacity graph at ``dims`` with ``chunk``
    (the off-catalog chunk's own lengths) bound, its plan, the bound step, and "built" or
    "loaded from disk".  ``example``: the step's input tensors (the passes' check runs the
    graph on them); ``bindings(gm)``: the regions' bindings of the capacity-form graph (the
    rule-S passes'); ``programs``: the model's ``ProgramStore`` (its ``disk``, where it has one,
    is looked in first and written after a build).  ``SpecializationRefused`` where ``sym``
    does not serve ``dims`` (never stored).  ``run``: whether the graph itself will be called
    (rules that do not replay); else (a replay lowers a copy of it, interpreters walk it) a
    loaded graph's Python code is not generated: calling it raises (``module_without_code``)."""
    with collector.held():  # a build or a load makes a few hundred thousand objects and keeps a graph of them
        return _graph(adapter, sym, dims, chunk, by_region, masked_attention, device, example, bindings, programs,
                      label, say or (lambda msg: None), run)


def _graph(adapter, sym, dims, chunk, by_region, masked_attention, device, example, bindings, programs, label, say,
           run) -> tuple:
    disk = getattr(programs, "disk", None)
    parts = None
    if disk is not None:
        try:
            parts = graph_parts(adapter, sym, dims, chunk, by_region, masked_attention, device, example, label)
        except Unserializable as e:
            say(f"capacity graph {label}: not stored on disk ({e})")
    if parts is None:
        return _build(sym, dims, chunk, by_region, masked_attention, device, example, bindings, run) + ("built",)
    got = _load(disk, parts, adapter, sym, dims, example, label, say, run)
    if got is not None:
        return got
    with disk.claim(parts, f"capacity graph {label}") as waited:
        if waited:  # another process built it meanwhile
            got = _load(disk, parts, adapter, sym, dims, example, label, say, run)
            if got is not None:
                return got
        gm, cplan, bound = _build(sym, dims, chunk, by_region, masked_attention, device, example, bindings, run, True)
        _save(disk, parts, gm, cplan, bound, sym, adapter, by_region)
    return gm, cplan, bound, "built"


def _build(sym, dims, chunk, by_region, masked_attention, device, example, bindings, run,
           keep_folds=False) -> tuple:
    # The graph's Python code is generated once, by the passes, and only where it will run
    # (``run``: a replay's graph is lowered from a copy, and interpreters walk it): ~0.5 s a
    # generation for a released model's capacity graph on a CPU
    bound = bind_dims(sym, chunk) if chunk else sym
    check_guards(bound, dims)
    gm, cplan = capacity_form(bound, dims, attention_for(bound, dims, masked_attention, device), buffers=by_region,
                              keep_values=True, code=False)  # keep_values: what the passes read of each node
    check_dims(cplan, bound, dims)  # the capacity itself meets the step's guards
    _example(gm, example, bound, dims, device)
    with at_dims(dims):  # EarlyWriteback's check runs the graph, at the capacity
        gm, _ = rewrite_pipeline(bindings(gm), "S", device.type, keep_folds=keep_folds, code=run)(gm)
    return gm, cplan, bound


def _example(gm: fx.GraphModule, example: list, bound: SymbolicStep, dims: Mapping[str, int], device) -> None:
    gm.meta[meta.EXAMPLE_INPUTS] = list(example) + [torch.tensor(int(dims[d]), device=device) for d in bound.dims]


def _save(disk, parts: dict, gm: fx.GraphModule, cplan: CapacityPlan, bound: SymbolicStep, sym: SymbolicStep,
          adapter, by_region: dict) -> None:
    arena = {t.untyped_storage().data_ptr() for t in by_region.values()}
    recipe, folded = gm.meta.pop(FOLDS, (None, ()))  # (not held past the save)

    def record() -> dict:
        for node in gm.graph.nodes:  # a constant on the scratch arena would be stored by value: never
            v = getattr(gm, node.target) if node.op == "get_attr" else None
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in arena:
                raise Unserializable(f"constant {node.target} is the scratch arena's memory")
        used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
        if used & set(folded) and recipe is None:
            raise Unserializable("the graph's folded constants have no recipe")
        return {"graph": encode_graph(gm, adapter.modules(), _KEYS, given=tuple(folded)), "plan": cplan,
                "folds": None if recipe is None else (encode_graph(recipe, adapter.modules(), ()), tuple(folded)),
                "step": None if bound is sym else encode_step(bound, adapter.modules(), digest=False),
                "meta": {k: gm.meta[k] for k in (meta.SIGNATURE, meta.DEVICE, meta.ARENA_INPUTS)}}
    disk.save_record(parts, record)


def _load(disk, parts: dict, adapter, sym: SymbolicStep, dims, example: list, label: str, say,
          run: bool) -> "tuple | None":
    t0 = time.perf_counter()

    def decode(record) -> tuple:
        if not isinstance(record, dict) or not isinstance(record.get("plan"), CapacityPlan):
            raise Rejected("not a capacity graph record")
        modules = adapter.modules()
        live, given = tensor_paths(modules), {}
        if record.get("folds") is not None:  # the folded constants, computed again from this model's tensors
            recipe, names = record["folds"]
            with torch.no_grad():
                given = dict(zip(names, decode_graph(recipe, modules, runnable=True, live=live)()))
        gm = decode_graph(record["graph"], modules, runnable=run, given=given, live=live)
        gm.meta.update(record["meta"])
        bound = sym if record["step"] is None else decode_step(record["step"], modules)  # (None: no chunk bound)
        return gm, record["plan"], bound
    got, _ = disk.fetch_record(parts, decode, "building it again")
    if got is None:
        return None
    gm, cplan, bound = got
    check_guards(bound, dims)  # (the key holds the step and the dims: these hold, as at its build)
    check_dims(cplan, bound, dims)
    _example(gm, example, bound, dims, torch.device(adapter.device))
    say(f"capacity graph {label}: loaded from disk in {time.perf_counter() - t0:.1f} s")
    return gm, cplan, bound, "loaded from disk"


def graph_parts(adapter, sym: SymbolicStep, dims, chunk, by_region: dict, masked_attention, device, example: list,
                label: str) -> dict:
    """The disk cache's key parts of one capacity graph (see the module doc);
    ``Unserializable`` where one cannot be stored (a probe of the caller's own)."""
    attention = _attention_key(masked_attention, len(sym.dims) - len(chunk))
    if attention is None:
        raise Unserializable(f"masked_attention={masked_attention!r} is a probe of the caller's own")
    key = ("capacity graph", GRAPH_FORMAT, label, sources_digest(), device_identity(device),
           step_digest(sym, adapter.modules()),
           sorted((d, int(v)) for d, v in dims.items()), sorted((d, int(v)) for d, v in chunk.items()),
           [(tuple(t.shape), str(t.dtype), tuple(t.stride())) for t in example],
           sorted((r, tuple(t.shape), str(t.dtype)) for r, t in by_region.items()), attention)
    return key_parts(adapter, key)


def device_identity(device: torch.device) -> str:
    """The device the graph's folded constants and attention probe ran on, as far as bits go."""
    device = torch.device(device)
    det = torch.are_deterministic_algorithms_enabled()
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return (f"cuda {torch.cuda.get_device_name(index)} sm{'.'.join(map(str, torch.cuda.get_device_capability(index)))}"
                f" cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()} deterministic {det}")
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
    return f"{device.type} {capability} threads {torch.get_num_threads()} deterministic {det}"


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """SHA-256 of cadence_fx's own Python sources (a pass that changes makes another graph)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


__all__ = ["GRAPH_FORMAT", "attention_for", "capacity_graph", "device_identity", "graph_parts", "sources_digest",
           "step_digest"]
