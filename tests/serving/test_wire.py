"""Tensors as JSON (cadence_fx.serving.wire): both forms are exact for every dtype a
chunk or prompt travels in, and a malformed value is an InputError naming the problem."""

from __future__ import annotations

import json
import re

import pytest
import torch

from cadence_fx.errors import InputError
from cadence_fx.serving import wire


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()), ids=list(wire.DTYPES))
@pytest.mark.parametrize("raw", [True, False], ids=["b64", "lists"])
def test_every_dtype_round_trips_bit_for_bit_through_json(dtype, raw):
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        t = (torch.randn(2, 3, 5, generator=g) * 1e3).to(dtype)
        t[0, 0, :3] = torch.tensor([float("inf"), -0.0, 1e-30]).to(dtype)  # edge values keep their bits
    else:
        t = torch.randint(-2**31, 2**31 - 1, (2, 3, 5), generator=g).to(dtype)
    back = wire.decode(json.loads(json.dumps(wire.encode(t, raw=raw))))
    assert back.dtype == t.dtype and back.shape == t.shape
    assert back.view(torch.uint8).numpy().tobytes() == t.view(torch.uint8).numpy().tobytes()


def test_a_zero_size_and_a_strided_tensor_travel():
    assert wire.decode(wire.encode(torch.zeros(0, 4, dtype=torch.int32))).shape == (0, 4)
    t = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()
    assert torch.equal(wire.decode(wire.encode(t)), t)


@pytest.mark.parametrize("value, message", [
    ([1, 2], "expected {'dtype'"),
    ({"data": [1]}, "expected {'dtype'"),
    ({"dtype": "int64", "data": [1], "b64": ""}, "expected {'dtype'"),
    ({"dtype": "complex64", "data": [1]}, "dtype 'complex64' is not one of"),
    ({"dtype": "int64", "data": [[1, 2], [3]]}, "'data' is not a rectangular array"),
    ({"dtype": "int64", "data": "12"}, "'data' is not a rectangular array"),
    ({"dtype": "float32", "b64": "AAAA"}, "'shape' must be a list"),
    ({"dtype": "float32", "shape": [2, -1], "b64": "AAAA"}, "'shape' must be a list"),
    ({"dtype": "float32", "shape": [2], "b64": "not base64!"}, "'b64' is not base64"),
    ({"dtype": "float32", "shape": [2], "b64": "AAAA"}, "3 bytes do not hold shape [2] of float32 (8 bytes)"),
])
def test_malformed_values_are_input_errors_naming_the_problem(value, message):
    with pytest.raises(InputError, match="chunk: " + re.escape(message)):
        wire.decode(value, "chunk")


def test_a_dtype_that_cannot_travel_is_refused():
    with pytest.raises(InputError, match="torch.complex64 tensor cannot travel"):
        wire.encode(torch.zeros(2, dtype=torch.complex64))
