"""``cadence-fx bench``: every variant in its own long-lived worker process, matched
blocks in rotating order, one worker timing at a time, exactness against stock (B0).

Modules: ``cmd`` (options, the driver), ``fleet`` (the worker processes), ``worker``
(one variant, its stdin/stdout protocol), ``models`` (what differs per model),
``controls`` (Token2Wav's non-cadence_fx baselines), ``stats`` and ``report``.
"""

from ...errors import CadenceError


class BenchError(CadenceError, ValueError):
    """A bench request that cannot run as asked (unknown variant, CUDA-only on CPU, ...)."""
