"""The generic path: a model whose declared step takes its inputs and then one tensor per
carried region needs no adapter (``form``: the step form; ``adapter``: its
``StreamingAdapter``; ``probe``: the checks that fail closed on a wrong declaration;
``dropin``: ``OptimizedModule`` and its sessions)."""

from .dropin import OptimizedModule

__all__ = ["OptimizedModule"]
