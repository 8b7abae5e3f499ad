"""Shared test marks.

``cuda``: a test that needs a CUDA device. It carries the ``cuda`` marker (the GPU
suite is ``pytest -m cuda tests``) and is skipped cleanly on a machine without one.

``deterministic_protocol_restored``: the deterministic protocol (what stock eager needs
to be bit-reproducible on a GPU) for a block, the caller's algorithm settings restored after.

``keep_report``: with ``CADENCE_RESULTS_DIR`` set, a verify test writes the JSON line
it checked there (``docs/results/`` holds the H200 ones).
"""

import contextlib
import os

import pytest
import torch


def cuda(fn):
    """CUDA only: selected by ``-m cuda``, skipped cleanly without a device."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(fn))


@contextlib.contextmanager
def deterministic_protocol_restored():
    """``lockstep.deterministic_protocol()`` for the block; the algorithm settings restored after."""
    from cadence_fx.lockstep import deterministic_protocol
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    deterministic_protocol()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def keep_report(name: str, line: str) -> None:
    """Write ``line`` (one verify report) to ``$CADENCE_RESULTS_DIR/name`` when that is set."""
    where = os.environ.get("CADENCE_RESULTS_DIR")
    if where:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, name), "w") as f:
            f.write(line + "\n")
