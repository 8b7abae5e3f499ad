"""Shared test marks.

``cuda``: a test that needs a CUDA device. It carries the ``cuda`` marker (the GPU
suite is ``pytest -m cuda tests``) and is skipped cleanly on a machine without one.
"""

import pytest
import torch


def cuda(fn):
    """CUDA only: selected by ``-m cuda``, skipped cleanly without a device."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(fn))
