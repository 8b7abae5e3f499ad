"""Which convolution keys does the optimized path use that stock never does?  (CPU or GPU.)

PyTorch's cuDNN v8 convolution keeps a thread-local plan cache keyed by the convolution's
parameters and the **alignment** of x, w and y (``Conv_v8.cpp``: ``getAlignment``, 1 to 32
bytes); on a miss it runs the heuristics' plans in order and caches the first that runs,
skipping one whose workspace runs out of memory.  A key the optimized path alone uses is
therefore a place where, under memory pressure, it could keep another engine than stock's
(session 48's float16 chunk; docs/results/README.md, session fifty).

This runs Token2Wav's stock tail and ``optimize(tail, rules=RULES)`` on the same voice and
chunks, in lockstep, under a ``TorchDispatchMode`` that records every ``aten.convolution``
(and the cuDNN/transposed variants) that reaches the dispatcher: input, weight and output
shapes, strides, dtype and alignments.  Rule S runs the traced program op by op, so every
convolution is seen (under replay rules a replayed graph is not: use S).  Prints one JSON
object: the keys each side used, how often, and ``optimized_only`` (keys stock never used).

    python benchmarks/conv_keys.py [--device cuda] [--float16] [--rules S] [--prompt-tokens 61]
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CONVS = {"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose", "conv1d", "conv2d",
         "conv_transpose1d"}


def alignment(t: torch.Tensor) -> int:
    """As ``Conv_v8.cpp``'s ``getAlignment``: the largest power of two up to 32 dividing the address."""
    address, a = t.data_ptr(), 1
    while a < 32 and address % (a * 2) == 0:
        a *= 2
    return a


class ConvKeys(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.keys: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in CONVS:
            x, w = args[0], args[1]
            key = tuple((tuple(t.shape), tuple(t.stride()), str(t.dtype), alignment(t)) for t in (x, w, out))
            self.keys[json.dumps(key)] += 1
        return out


def main(argv=None) -> int:
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--float16", action="store_true")
    p.add_argument("--rules", default="S")
    p.add_argument("--prompt-tokens", type=int, default=61)
    p.add_argument("--chunks", type=int, default=6)
    p.add_argument("--n-timesteps", type=int, default=2)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.use_deterministic_algorithms(True)
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.to(dev), hift.to(dev), n_timesteps=a.n_timesteps, float16=a.float16)
    opt = cadence_fx.optimize(tail, rules=a.rules, cache=False)
    prompt = s2.synthetic_prompt(a.prompt_tokens, seed=a.prompt_tokens, device=a.device)
    opt.set_stream_cache(*prompt)
    tail.set_stream_cache(*prompt)
    chunks = s2.synthetic_chunks(a.chunks, seed=a.prompt_tokens, final_tokens=13)
    # the stock tail and the optimized one are run one after the other per chunk by compare_streams;
    # two modes, each around its own side, keep the keys apart
    stock_keys, opt_keys = ConvKeys(), ConvKeys()
    real_stream, real_opt = tail.stream, opt.stream

    def stock_stream(*args, **kwargs):
        with stock_keys:
            return real_stream(*args, **kwargs)

    def opt_stream(*args, **kwargs):
        with opt_keys:
            return real_opt(*args, **kwargs)
    tail.stream, opt.stream = stock_stream, opt_stream
    report = compare_streams(tail, opt, chunks, dev, seed=a.prompt_tokens)
    only = {k: n for k, n in opt_keys.keys.items() if k not in stock_keys.keys}
    print(json.dumps({"exact": report["exact"], "routes": [c["route"] for c in report["per_chunk"]],
                      "stock_keys": len(stock_keys.keys), "optimized_keys": len(opt_keys.keys),
                      "optimized_only": only,
                      "stock_only": {k: n for k, n in stock_keys.keys.items() if k not in opt_keys.keys}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
