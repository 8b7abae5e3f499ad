"""The model options explain, verify and demo share, and their checks."""

from __future__ import annotations

import argparse
import sys
import time

from . import registry


def add_model_args(p: argparse.ArgumentParser, *, weights: bool = True, rules: str | None = "S",
                   prompt_list: bool = False) -> None:
    """The shared model options; ``prompt_list``: ``--prompt-tokens`` takes a comma list
    (a tuple of ints; the command sets ``args.prompt_tokens`` to each in turn)."""
    p.add_argument("--model", choices=registry.names(), default=registry.DEFAULT_MODEL)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    if prompt_list:
        p.add_argument("--prompt-tokens", type=prompt_lengths, default=(50,), metavar="P[,P...]",
                       help="prompt length P in tokens (mel frames = 2P); a comma list runs each in turn on "
                            "one optimized model")
    else:
        p.add_argument("--prompt-tokens", type=int, default=50, help="prompt length P in tokens (mel frames = 2P)")
    p.add_argument("--n-timesteps", type=int, default=5, help="flow-matching steps per chunk (upstream: 5 or 10)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="; ".join(f"{m}: {' or '.join(registry.get(m).dtypes)}" for m in registry.names()))
    if weights:
        p.add_argument("--seed", type=int, default=0, help="seeds the weights, the prompt and the tokens")
        p.add_argument("--checkpoint", default=None, help="token2wav: directory with upstream flow.pt and hift.pt; "
                                                          "mimi: moshi's .safetensors or a torch.save'd state dict; "
                                                          "vibevoice: the acoustic tokenizer's .safetensors or "
                                                          "torch.save'd state dict")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    if rules is not None:
        p.add_argument("--rules", default=rules, help="S (CPU or CUDA); on CUDA, replay: SR (per DiT "
                                                      "call) or SRc (per chunk) over the arena, R or Rc over "
                                                      "stock-managed state" + ("; auto: SRc on CUDA, S on CPU"
                                                                          if rules == "auto" else ""))


def prompt_lengths(text: str) -> tuple[int, ...]:
    """``"23,41"`` -> ``(23, 41)`` (argparse type; the range is checked with the model)."""
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a prompt length in tokens or a comma list of them "
                                         f"(e.g. 23 or 23,41)") from None
    return lengths


def each_prompt_length(spec: registry.ModelSpec, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """``lengths`` once every one applies to ``spec``: a list needs a model whose streams
    take a prompt, and each length must be >= 1."""
    if len(lengths) > 1 and spec.prompt is None:
        raise SystemExit(f"--prompt-tokens {','.join(map(str, lengths))}: --model {spec.name} streams take no "
                         f"prompt, so there is no prompt length to vary; give one value or none")
    if spec.prompt is not None and min(lengths) < 1:
        raise SystemExit(f"--prompt-tokens must be >= 1 (got {min(lengths)})")
    return lengths


def model_of(args) -> registry.ModelSpec:
    """The ``--model``'s spec, once ``--dtype`` is one it runs."""
    spec = registry.get(args.model)
    if args.dtype not in spec.dtypes:
        raise SystemExit(f"--model {args.model} runs {' or '.join(spec.dtypes)}, not --dtype {args.dtype}")
    return spec


def check_flush(spec: registry.ModelSpec, final_tokens: int) -> None:
    if final_tokens and not spec.flush:
        raise SystemExit(f"--final-tokens does not apply to --model {spec.name}: it has no flush {spec.unit}")


def progress(quiet: bool):
    """The commands' progress lines on stderr (None with ``quiet``), each with the seconds since
    this call: what a long run spent where (preparing, a voice's set-up) reads off its log."""
    if quiet:
        return None
    t0 = time.perf_counter()
    return lambda msg: print(f"[cadence-fx {time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)
