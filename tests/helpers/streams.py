"""Stock references for the serving tests: each stream run alone on the stock Token2Wav
tail (``torch.manual_seed(seed_of(session, chunk))`` before every chunk), with the float
waveform and the SHA-256 of every live state tensor after every chunk, and the checks
an optimized stream (in-process or over Ray) must pass against it."""

from __future__ import annotations

import hashlib

import torch

from cadence_fx.integrations import stepaudio2 as s2


STEPS = 2  # flow-matching steps of the shared ``t2w`` fixture (tests/conftest.py): the mechanisms under test do not depend on it; fewer = cheaper on CPU
STEP_SLOTTED = ("estimator_cnn_cache", "estimator_att_cache")  # stock holds 16 step slots, live: STEPS


def seed_of(session: int, chunk: int) -> int:
    return 1000 * session + chunk


def digest(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, hashlib.sha256(t.contiguous().cpu().numpy().tobytes()).hexdigest()


def live_stock_state(tail) -> dict[str, torch.Tensor]:
    return {k: v[:STEPS] if k in STEP_SLOTTED else v for k, v in tail.state().items()}


def reference(tail, prompt, chunks, session: int) -> dict:
    """The stream alone on the stock tail: per chunk the waveform and state digests; the final state."""
    tail.set_stream_cache(*prompt)
    waves, states = [], []
    for k, (tokens, last) in enumerate(chunks):
        torch.manual_seed(seed_of(session, k))
        tail.stream(tokens, last_chunk=last, return_waveform=True)
        waves.append(tail.last_speech.clone())
        states.append({n: digest(t) for n, t in live_stock_state(tail).items()})
    return {"waves": waves, "states": states, "final": {n: t.clone() for n, t in live_stock_state(tail).items()}}


def assert_chunk_exact(ref: dict, k: int, speech: torch.Tensor, state: dict, where: str) -> None:
    assert torch.equal(speech, ref["waves"][k]), f"{where}: waveform differs from stock"
    got = {n: digest(t) for n, t in state.items()}
    for n, want in ref["states"][k].items():
        assert got[n] == want, f"{where}: state {n!r} differs from stock"


def assert_final_exact(ref: dict, state: dict, where: str) -> None:
    for n, t in ref["final"].items():
        assert torch.equal(state[n], t), f"{where}: final state {n!r} differs from stock"


def tokens_of(seed: int, n: int) -> list[int]:
    return torch.randint(0, s2.VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
