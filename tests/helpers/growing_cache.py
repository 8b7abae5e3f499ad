"""A six-line step with a growing cache, the symbolic tests' shared toy (test_specialize, test_capacity).

The step appends two frames to a cache of ``prompt + 3`` frames, keeps the prompt and the
last four once longer than 8 frames (a guard: ``prompt + 5 > 8``), and writes the cache
into a bound buffer of ``prompt + 10`` frames.
"""

from __future__ import annotations

import torch

from cadence_fx.passes.trace_symbolic import trace_symbolic
from cadence_fx.step import StepSignature

SIG = StepSignature(inputs=("x",), regions=("cache",), outputs=("y",))
F32 = torch.float32


def bind(buffers, dims=None, prompt=None):
    prompt = dims["prompt"] if dims else prompt
    buf = buffers["buf"]

    def step(inputs, state):
        cache = torch.cat([state["cache"], inputs["x"]], dim=1)
        if cache.shape[1] > 8:
            cache = torch.cat([cache[:, :prompt], cache[:, -4:]], dim=1)
        n = cache.shape[1]
        buf[:, :n].copy_(cache)
        return {"y": buf[:, :n] * 2}, {"cache": cache}
    return step


def symbolic(prompt: int = 6):
    """The step traced with the prompt length free (at ``prompt`` frames)."""
    return trace_symbolic(bind, SIG, {"prompt": prompt}, {"x": ((1, 2), F32)},
                          {"cache": ((1, ("prompt", 1, 3)), F32)},
                          {"buf": ((1, ("prompt", 1, 10)), F32, ("buf",))}, torch.device("cpu"))
