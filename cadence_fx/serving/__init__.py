"""Serving many streams: sessions placed over local devices (``SessionPool``), and a
tick of them launched together (``run_tick``)."""

from .pool import PoolFull, SessionPool
from .tick import TickError, run_tick

__all__ = ["PoolFull", "SessionPool", "TickError", "run_tick"]
