"""Serving many streams: sessions placed over local devices (``SessionPool``), a tick
of them launched together (``run_tick``), and conversations by id on a replica with
sticky routing over several (``Replica``, ``Router``)."""

from .pool import PoolFull, SessionPool
from .replica import Replica, ReplicaFull, ReplicaLost, Router, UnknownConversation
from .tick import TickError, run_tick

__all__ = ["PoolFull", "Replica", "ReplicaFull", "ReplicaLost", "Router", "SessionPool", "TickError",
           "UnknownConversation", "run_tick"]
