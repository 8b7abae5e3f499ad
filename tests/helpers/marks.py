"""Shared test marks.

``cuda``: a test that needs a CUDA device. It carries the ``cuda`` marker (the GPU
suite is ``pytest -m cuda tests``) and is skipped cleanly on a machine without one.

``keep_report``: with ``CADENCE_RESULTS_DIR`` set, a verify test writes the JSON line
it checked there (``docs/results/`` holds the H200 ones).
"""

import os

import pytest
import torch


def cuda(fn):
    """CUDA only: selected by ``-m cuda``, skipped cleanly without a device."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(fn))


def keep_report(name: str, line: str) -> None:
    """Write ``line`` (one verify report) to ``$CADENCE_RESULTS_DIR/name`` when that is set."""
    where = os.environ.get("CADENCE_RESULTS_DIR")
    if where:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, name), "w") as f:
            f.write(line + "\n")
