"""Traced programs kept across stream configurations (and, with ``disk``, across processes).

``ProgramStore`` holds one optimized model's symbolic steps (``passes.trace_symbolic``)
by key, so that every prompt length after the first is a specialization, and records
how each catalog entry got its graph; with a ``disk.DiskCache`` it also reads and
writes them in a directory (``serialize``: a step as plain data).  ``shapes``
derives the affine sizes a symbolic trace needs from the pure plan.
"""

from .disk import DiskCache, default_cache_dir, open_disk_cache
from .store import ProgramStore, setup_section, symbolic_key
from .shapes import symbolic_shapes, NotAffine

__all__ = ["ProgramStore", "setup_section", "symbolic_key", "symbolic_shapes", "NotAffine", "DiskCache",
           "default_cache_dir", "open_disk_cache"]
