"""stepaudio2's own ``Token2wav`` without its checkpoint files or its audio front end.

``upstream_token2wav_class()`` imports the class with stubs for the front-end packages
its module imports (s3tokenizer, hyperpyyaml, librosa: ``stream`` uses none of them);
``upstream_token2wav(...)`` builds an instance as its ``__init__`` would, minus the file
loading: the given flow and HiFT, upstream's stream constants, and a ``_prepare_prompt``
that returns the given prompt features instead of reading a WAV.  Every method that
streams is upstream's own (CUDA only, as upstream is).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import torch

from cadence_fx.integrations import stepaudio2 as s2


def upstream_token2wav_class():
    """upstream ``Token2wav`` without its front-end packages (stream() does not use them).

    The stubs stand in only while its module imports, then leave ``sys.modules``: other
    code in the process (transformers asks ``find_spec("librosa")``) must not see them."""
    stubs = [name for name in ("s3tokenizer", "hyperpyyaml", "librosa", "librosa.filters")
             if name not in sys.modules]
    for name in stubs:
        stub = types.ModuleType(name)
        stub.load_hyperpyyaml = stub.mel = None
        sys.modules[name] = stub
    try:
        s2.upstream_modules()
        from stepaudio2.token2wav import Token2wav  # noqa: E402 - needs the stubs above
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    return Token2wav


def upstream_token2wav(flow, hift, prompt, n_timesteps: int, float16: bool):
    """An upstream ``Token2wav`` on ``flow``/``hift`` (CUDA) whose front end returns ``prompt``
    = (tokens [1, P], mels [1, 2P, 80], spk [1, 192]) as ``_prepare_prompt`` does."""
    Token2wav = upstream_token2wav_class()
    t2w = Token2wav.__new__(Token2wav)  # attributes only: no checkpoint files needed
    t2w.float16, t2w.n_timesteps = float16, n_timesteps
    t2w.flow, t2w.hift = (flow.half() if float16 else flow), hift
    t2w.cache, t2w.hift_cache_dict = None, {}
    t2w.mel_cache_len = 8
    t2w.source_cache_len = 8 * 480
    t2w.speech_window = torch.from_numpy(np.hamming(2 * t2w.source_cache_len)).cuda()
    tokens, mels, spk = prompt
    feats = (tokens, torch.tensor([tokens.shape[1]], dtype=torch.int32, device="cuda"), spk, mels,
             torch.tensor([mels.shape[1]], dtype=torch.int32, device="cuda"))
    t2w._prepare_prompt = lambda prompt_wav: feats
    return t2w
