"""Serving many streams: sessions placed over local devices (``SessionPool``)."""

from .pool import PoolFull, SessionPool

__all__ = ["PoolFull", "SessionPool"]
