"""The contract between an upstream model family and the cadence_fx core.

An integration (``cadence_fx.integrations.<family>``) subclasses ``StreamingAdapter``
once: it says which declared step to trace, with which inputs, and how to run the
upstream code on modules whose region-bound buffers are arena views.  The plan,
passes and runtime only ever see this interface; none of them names a model.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .annotations import Declaration
from .step import StepSignature
from .plan import TensorSpec

StepFn = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]],
                  tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]


class StreamingAdapter:
    """Override every method; the docstrings give the contract."""

    declaration: Declaration
    signature: StepSignature

    def dims(self) -> dict[str, int]:
        """Values of the symbols in the declaration (e.g. prompt_frames, n_timesteps)."""
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def input_specs(self) -> dict[str, TensorSpec]:
        """Specs of the per-step inputs of the catalog's steps."""
        raise NotImplementedError

    def example_inputs(self) -> dict[str, torch.Tensor]:
        """Valid per-step inputs to trace with (values are not baked into graphs)."""
        raise NotImplementedError

    def bind(self, buffers: Mapping[str, torch.Tensor], dims: Mapping[str, Any] | None = None) -> StepFn:
        """The upstream step on modules whose region-bound buffers are replaced.

        ``buffers`` maps a module buffer path (as declared in ``Region.buffers``,
        e.g. ``"flow.decoder.att_cache_buffer"``) to the tensor that replaces it.
        ``dims``, when given, overrides some of ``dims()`` for this step: a symbolic
        trace passes ``torch.SymInt`` values for ``symbolic_dims()`` (the step must use
        them as it uses the ints, never ``int()`` them).
        """
        raise NotImplementedError

    def symbolic_inputs(self) -> dict[str, dict[int, str]]:
        """Input axes whose size varies between off-catalog chunks (input -> {axis: dim
        name}; Token2Wav: ``{"token": {1: "chunk_tokens"}}``): a chunk the catalog does not
        hold is traced once with those sizes symbolic too, and each length is a
        specialization (``runtime.variants``).  Default: none (one trace per input shape).
        ``bind`` receives these dims as well and may ignore them."""
        return {}

    def symbolic_dims(self) -> tuple[str, ...]:
        """Dims (of ``dims()``) that vary between streams of one model and that ``bind``
        accepts symbolically: the compiler traces each catalog entry once for every value
        of them (``passes.trace_symbolic``) and specializes per stream configuration.
        ``()``: one concrete trace per configuration."""
        return ()

    def memo_methods(self) -> tuple[str, ...]:
        """Methods of ``modules()``' classes whose repeated calls a symbolic trace copies
        instead of tracing again (``passes.trace_memo``: same key, same recorded ops)."""
        return ("forward",)

    def modules(self) -> dict[str, torch.nn.Module]:
        """The model's modules by name, whose tensors (parameters, buffers, plain tensor
        attributes) the step reads, shared with ``bind``'s modules by identity.  A
        symbolic trace checks it leaves their tensors as they were.  The program cache
        on disk stores a traced constant that is one of them as its path
        (``"flow.decoder..."``) and binds it to the live tensor on load; their paths,
        shapes and dtypes are part of its key.  ``{}``: every constant is stored by value."""
        return {}

    def cache_identity(self) -> dict[str, Any]:
        """Plain data naming the code the step runs beyond cadence_fx and torch (e.g.
        ``{"upstream": "<package>", "version": "<version>"}``): part of the program
        cache's key, so another upstream release is a miss, never a stale program."""
        return {}

    def stock_buffers(self) -> dict[str, torch.Tensor]:
        """The model's own tensors for every declared buffer path (rules R/Rc, which keep
        stock-managed state, trace and replay over them)."""
        raise NotImplementedError

    def setup(self, buffers: Mapping[str, torch.Tensor], *args: Any) -> dict[str, torch.Tensor]:
        """The stream's initial state (e.g. from a prompt), on modules whose declared
        buffers are ``buffers`` (arena views, or ``stock_buffers()``); ``None``: zeros
        at catalog entry 0's extents."""
        raise NotImplementedError

    def fallback(self, inputs: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
                 **flags: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Run one step eagerly on any signature (private scratch buffers, sized per call)."""
        raise NotImplementedError

    def step_boundary(self):
        """For per-step capture (rules R/SR): ``key(node) -> hashable``; a new graph
        starts wherever the key changes (e.g. entering or leaving the estimator)."""
        return None

    def repeated_calls(self):
        """``inside(node) -> bool`` marking the nodes of a call the step makes several
        times with the same ops (a flow decoder's estimator, once per flow step), or
        None.  Every rule specializes, rewrites and captures one copy of such a call and
        calls it (``passes.step_share``); the unrolled graph computes the same, op for op."""
        return None

    def callable_verdicts(self) -> tuple:
        """``ScopeVerdict``s for the model's callables (what is traced, what stays eager and why)."""
        return ()

    def stock_state_bytes(self) -> int:
        """Bytes the stock runtime holds for the declared state (buffers + carried state)."""
        raise NotImplementedError
