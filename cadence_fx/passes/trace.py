"""trace: one streaming step -> a pre-dispatch aten ``GraphModule`` at exact shapes.

``make_fx(..., pre_dispatch=True)`` on real tensors, under ``no_grad``.  Pre-dispatch
keeps composite ops whole (``aten.linear`` stays one op: the default decomposition
into ``t`` + ``addmm`` is exact on CPU but selects other CUDA kernels).  Upstream's
``inference_mode`` decorators, in-place writes into module buffers and host-built
tensors are all recorded as they run; later passes fold or rewrite them.

The traced function is ``step(inputs: dict, state: dict) -> (outputs: dict,
new_state: dict)``.  Placeholders are renamed ``in_<name>`` / ``state_<name>`` and
tagged in ``node.meta["cadence"]``; ``get_attr`` nodes whose tensor is a module buffer
bound to a region are tagged ``{"role": "buffer", "region": ...}``.  The graph returns
``(*outputs, *new_state)`` in signature order (``gm.meta["cadence_signature"]``).
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ..errors import TraceError
from ..step import StepSignature


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identity, or the same view of the same memory."""
    if a is b:
        return True
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())


def trace_step(fn: Callable, signature: StepSignature, inputs: Mapping[str, torch.Tensor],
               state: Mapping[str, torch.Tensor],
               bound_buffers: Mapping[str, torch.Tensor] | None = None) -> fx.GraphModule:
    """Trace ``fn`` at the shapes of ``inputs``/``state`` (executes it once for real).

    ``bound_buffers`` maps region name -> the module buffer tensor bound to it in the
    module instance ``fn`` runs on; matching ``get_attr`` nodes get tagged.
    """
    missing = [n for n in signature.inputs if n not in inputs] + [n for n in signature.regions if n not in state]
    if missing:
        raise TraceError(f"trace: no example tensor for {missing}")
    ni = len(signature.inputs)

    def flat(*args):
        out, new = fn(dict(zip(signature.inputs, args[:ni])), dict(zip(signature.regions, args[ni:])))
        unknown = set(new) - set(signature.regions)
        if unknown:
            raise TraceError(f"step returned undeclared state {sorted(unknown)}; declare a Region for each")
        return tuple(out[k] for k in signature.outputs) + tuple(new[k] for k in signature.regions)

    args = [inputs[n] for n in signature.inputs] + [state[n] for n in signature.regions]
    try:
        with torch.no_grad():
            gm = make_fx(flat, pre_dispatch=True)(*args)
    except TraceError:
        raise
    except Exception as e:  # pragma: no cover - message carries the upstream failure
        raise TraceError(f"make_fx(pre_dispatch=True) failed on the step at shapes "
                         f"{[tuple(a.shape) for a in args]}: {type(e).__name__}: {e}") from e

    names = [f"in_{n}" for n in signature.inputs] + [f"state_{n}" for n in signature.regions]
    roles = [("input", n) for n in signature.inputs] + [("state", n) for n in signature.regions]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name, (role, rname) in zip(placeholders, names, roles):
        node.name = node.target = name
        node.meta["cadence"] = {"role": role, "name": rname}

    bound = dict(bound_buffers or {})
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        for region, buf in bound.items():
            if isinstance(value, torch.Tensor) and same_tensor(value, buf):
                node.meta["cadence"] = {"role": "buffer", "region": region}
    gm.meta["cadence_signature"] = signature
    # small non-state inputs, kept so later passes can check themselves by running
    gm.meta["cadence_example_inputs"] = [inputs[n].clone() for n in signature.inputs]
    gm.meta["cadence_device"] = args[0].device if args else torch.device("cpu")
    gm.graph.lint()
    gm.recompile()
    return gm
