"""Integer ids from a caller (Token2Wav's speech tokens, Mimi's codes), checked on the host.

An out-of-range id is an out-of-range embedding index: on CUDA a device-side assert
that kills the process and every other stream on it.  So ids are read out to Python
ints and checked before anything launches, and every malformed value (None, a string,
a float or bool tensor, a sparse or meta tensor, an id too large for any dtype) is an
``InputError`` naming the argument, never an exception from deep inside torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

import numpy as np
import torch

from ..errors import InputError

#: tensor dtypes whose values are ids (bool is not: True is not a token)
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.uint16, torch.uint32, torch.uint64)


def host_ids(value: Any, what: str, vocab: int, send: str) -> tuple[list[int], tuple[int, ...]]:
    """``value`` as Python ints in [0, ``vocab``) and the shape it came in.

    ``value``: a tensor of an integer dtype (any device with data, strided, any
    strides), a numpy integer array, or a flat sequence of ints (numpy ints too).  Its
    values are copied out, so the caller may reuse it.  ``what`` names the argument and
    ``send`` says what to send instead; the caller checks the shape.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise InputError(f"{what} must be integers; got a numpy {value.dtype} array. Send {send}")
        value = torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, torch.Tensor):
        if value.dtype not in INTEGER_DTYPES:
            raise InputError(f"{what} must be integers; got a {value.dtype} tensor. Send {send}")
        if value.layout != torch.strided:
            raise InputError(f"{what} is a {value.layout} tensor; send a dense (strided) one: {send}")
        if value.device.type == "meta":
            raise InputError(f"{what} is on the meta device (it has no values); send {send}")
        shape = tuple(value.shape)
        ids = value.reshape(-1).tolist()
    else:
        if value is None or isinstance(value, (str, bytes, Mapping, Set)) or not hasattr(value, "__iter__"):
            raise InputError(f"{what} must be a sequence of ints or an integer tensor; "
                             f"got {type(value).__name__}. Send {send}")
        ids = list(value)
        shape = (len(ids),)
        nested = [t for t in ids if not isinstance(t, (int, np.integer)) or isinstance(t, (bool, np.bool_))]
        if nested:
            raise InputError(f"{what} must be ints; got {type(nested[0]).__name__} {nested[0]!r}. Send {send}")
    bad = [t for t in ids if not 0 <= int(t) < vocab]
    if bad:
        raise InputError(f"{what} must be ints in [0, {vocab}); got {bad[:5]}")
    return [int(t) for t in ids], shape
