"""Declare: clocks, retention policies, regions and ``@native_clock``.

The first stage of cadence_fx.  A model says how fast each piece of its streaming
state advances (a ``Clock``) and how much of it stays live (a retention policy on a
``Region``); ``cadence_fx.plan`` turns that into a shape catalog and an arena layout.
"""

from .clocks import Clock
from .declare import DECLARATION_ATTR, Declaration, get_declaration, native_clock
from .regions import DTYPE_ITEMSIZE, MODEL_DTYPE, Region, dtype_name
from .retention import ChunkPad, Fixed, Retention, Ring, Unbounded, Window

__all__ = [
    "Clock",
    "Retention", "Fixed", "Ring", "Window", "ChunkPad", "Unbounded",
    "Region", "DTYPE_ITEMSIZE", "MODEL_DTYPE", "dtype_name",
    "Declaration", "native_clock", "get_declaration", "DECLARATION_ATTR",
]
