"""Tensors as JSON, for the HTTP and WebSocket API of ``cadence_fx.serving.ray``.

A tensor travels as ``{"dtype": "int32", "data": [[...]]}`` (nested lists) or as
``{"dtype": "float32", "shape": [1, 80, 80], "b64": "..."}`` (its little-endian bytes,
base64).  Both are exact: a float32 written as a JSON number and read back is the same
float32 (Python prints the shortest repr that round-trips), and the bytes are the bytes.
A malformed value is an ``InputError`` naming what is wrong; nothing is guessed.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import torch

from ..errors import InputError

#: the dtypes a chunk or a prompt may travel in (token ids, codes, mels, latents)
DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def encode(t: torch.Tensor, raw: bool = True) -> dict[str, Any]:
    """``t`` as JSON: its bytes in base64 (``raw``) or nested lists."""
    name = next((n for n, d in DTYPES.items() if d == t.dtype), None)
    if name is None:
        raise InputError(f"a {t.dtype} tensor cannot travel; dtypes: {', '.join(DTYPES)}")
    t = t.detach().cpu().contiguous()
    if not raw:
        return {"dtype": name, "data": t.tolist()}
    data = t.view(torch.int16) if t.dtype == torch.bfloat16 else t  # numpy has no bfloat16
    return {"dtype": name, "shape": list(t.shape), "b64": base64.b64encode(data.numpy().astype(
        data.numpy().dtype.newbyteorder("<")).tobytes()).decode()}


def decode(value: Any, what: str = "tensor") -> torch.Tensor:
    """The tensor ``encode`` wrote (either form); ``what`` names it in errors."""
    if not isinstance(value, dict) or "dtype" not in value or ("data" in value) == ("b64" in value):
        raise InputError(f"{what}: expected {{'dtype': ..., 'data': nested lists}} or {{'dtype': ..., 'shape': "
                         f"[...], 'b64': ...}}; got {_short(value)}")
    dtype = DTYPES.get(value["dtype"])
    if dtype is None:
        raise InputError(f"{what}: dtype {value['dtype']!r} is not one of {', '.join(DTYPES)}")
    if "data" in value:
        try:
            return torch.tensor(value["data"], dtype=dtype)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"{what}: 'data' is not a rectangular array of numbers ({e})") from None
    shape = value.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in shape):
        raise InputError(f"{what}: 'shape' must be a list of sizes >= 0; got {_short(shape)}")
    try:
        raw = base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise InputError(f"{what}: 'b64' is not base64") from None
    np_dtype = np.dtype("<i2") if dtype == torch.bfloat16 else np.dtype(str(dtype).split(".")[1]).newbyteorder("<")
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) != count * np_dtype.itemsize:
        raise InputError(f"{what}: {len(raw)} bytes do not hold shape {shape} of {value['dtype']} "
                         f"({count * np_dtype.itemsize} bytes)")
    t = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("=")).copy()).reshape(shape)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
