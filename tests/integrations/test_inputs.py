"""One input contract per entry point (issue 13): every probe a careful user tried gets an
``InputError`` naming the argument, before any work or tracing; valid odd forms are accepted.
No model is built here: the checks run on the host before anything launches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence_fx import InputError
from cadence_fx.integrations.moshi.inputs import codes_tensor
from cadence_fx.integrations.stepaudio2.inputs import check_prompt, tokens_tensor
from cadence_fx.integrations.vibevoice.inputs import latent_tensor

CPU = torch.device("cpu")
GOOD_CODES = list(range(8))


@pytest.mark.parametrize("codes,message", [
    (None, "Mimi codes must be a sequence of ints or an integer tensor; got NoneType"),
    ("01234567", "got str"),
    (torch.zeros(8, dtype=torch.int64, device="meta"), "meta device"),
    (torch.zeros(8, dtype=torch.int64).to_sparse(), "sparse_coo tensor"),
    (torch.ones(8, dtype=torch.bool), "must be integers; got a torch.bool tensor"),
    ([True] * 8, "must be ints; got bool"),
    (torch.zeros(8), "must be integers; got a torch.float32 tensor"),
    ([2 ** 70] + [0] * 7, r"must be ints in \[0, 2048\)"),
    ([-1] + [0] * 7, r"must be ints in \[0, 2048\)"),
    (torch.zeros(2, 4, dtype=torch.int64), r"Mimi codes of shape \(2, 4\)"),  # 8 elements, not a frame
    (list(range(7)), r"of shape \(7,\)"),
])
def test_mimi_codes_are_refused_with_a_named_error(codes, message):
    with pytest.raises(InputError, match=message):
        codes_tensor(codes, CPU)


@pytest.mark.parametrize("codes", [GOOD_CODES, np.arange(8), torch.arange(8, dtype=torch.uint8),
                                   torch.arange(8, dtype=torch.int16).reshape(1, 8),
                                   torch.arange(16, dtype=torch.int64)[::2], torch.arange(8).reshape(1, 8, 1)])
def test_mimi_codes_in_any_valid_form_are_one_int64_frame(codes):
    t = codes_tensor(codes, CPU)
    assert t.dtype == torch.int64 and tuple(t.shape) == (1, 8, 1)
    assert t.reshape(-1).tolist() in (GOOD_CODES, list(range(0, 16, 2)))


@pytest.mark.parametrize("tokens,message", [
    (None, "got NoneType"),
    ("abc", "got str"),
    (torch.ones(3, dtype=torch.int64).to_sparse(), "sparse_coo tensor"),
    (torch.ones(3, dtype=torch.int64, device="meta"), "meta device"),
    (torch.ones(3), "must be integers"),
    (torch.ones(3, dtype=torch.bool), "must be integers"),
    ([1, 2, 2 ** 70], r"ints in \[0, 6561\)"),
    ([1, 2, 6561], r"ints in \[0, 6561\); got \[6561\]"),
])
def test_token2wav_tokens_are_refused_with_a_named_error(tokens, message):
    with pytest.raises(InputError, match=message):
        tokens_tensor(tokens, CPU)


def test_token2wav_tokens_of_any_integer_dtype_are_int32_and_copied():
    src = torch.tensor([5, 6, 7], dtype=torch.uint8)
    t = tokens_tensor(src, CPU)
    src[0] = 0  # the caller may reuse its tensor
    assert t.dtype == torch.int32 and t.tolist() == [[5, 6, 7]]


def _prompt(n=4, mels_dtype=torch.float32, spk_dtype=torch.float32):
    return (torch.zeros(1, n, dtype=torch.int32), torch.zeros(1, 2 * n, 80, dtype=mels_dtype),
            torch.zeros(1, 192, dtype=spk_dtype))


@pytest.mark.parametrize("prompt,message", [
    (_prompt(mels_dtype=torch.float64), "prompt_mels is torch.float64; the flow takes torch.float32"),
    (_prompt(spk_dtype=torch.float64), "spk is torch.float64"),
    (_prompt(spk_dtype=torch.int64), "spk is torch.int64"),
    ((_prompt()[0], _prompt()[1].to_sparse(), _prompt()[2]), "prompt_mels is a torch.sparse_coo tensor"),
    ((None,) + _prompt()[1:], "prompt_tokens must be a tensor, got NoneType"),
    (_prompt(n=1), "prompt_tokens holds 1 tokens; upstream streams from 2"),
    (_prompt(n=500), "prompt_tokens holds 500 tokens"),
])
def test_token2wav_prompt_is_refused_before_any_tracing(prompt, message):
    with pytest.raises(InputError, match=message):
        check_prompt(*prompt, CPU, torch.float32)


def test_token2wav_prompt_at_the_model_dtype_is_accepted():
    check_prompt(*_prompt(), CPU, torch.float32)
    check_prompt(*_prompt(mels_dtype=torch.float16, spk_dtype=torch.float16), CPU, torch.float16)


@pytest.mark.parametrize("latent,message", [
    (None, "got NoneType"),
    (torch.zeros(1, 64, 1).to_sparse(), "sparse_coo tensor"),
    (torch.zeros(1, 64, 2), r"got shape \(1, 64, 2\)"),
    (torch.zeros(1, 64, 1, dtype=torch.float64), "cast it first"),
])
def test_vibevoice_latents_are_refused_with_a_named_error(latent, message):
    with pytest.raises(InputError, match=message):
        latent_tensor(latent, torch.float32, CPU)
