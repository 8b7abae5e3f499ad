"""What of each symbolic entry depends on the prompt length, by what a padded form would need.

Architecture item 4's plan (docs/architecture.md) holds a cache dim that carries the
prompt symbol at a fixed capacity.  This sorts every op of the released Token2Wav's
symbolic entries (CPU trace; the graphs are the GPU's too) whose inputs or value carry
a symbol into what that plan would do with it:

- ``view``: launches nothing (offsets and sizes: device scalars or host ints);
- ``copy``: moves values without arithmetic (``cat``, ``copy_``, ``clone``, slices
  written, factories): exact at any placement, so a write at device offsets;
- ``attention``: ``scaled_dot_product_attention`` over the symbolic keys: the masked
  padded call (exact in fp32 on the H200, ``length_free_attention.py``);
- ``pointwise``: elementwise (``torch.Tag.pointwise``): runs on the padding too;
- ``island``: anything else with a symbolic input (a matmul or softmax over the cache,
  a linear over a length-sized table...): runs at the exact length, eagerly, reading views.

Per entry and inside / outside the adapter's ``estimator`` scope, with the ops of each
class.  Prints one JSON document (``--json`` writes it).

    OMP_NUM_THREADS=1 python benchmarks/length_inventory.py --n-timesteps 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch

COPY_OPS = {"cat", "copy_", "copy", "clone", "contiguous", "_to_copy", "slice_scatter", "select_scatter",
            "index_put_", "index_put", "index_copy_", "index_copy", "zeros", "ones", "full", "empty",
            "new_zeros", "new_ones", "new_full", "new_empty", "zeros_like", "ones_like", "empty_like",
            "expand_copy", "repeat", "stack", "split_with_sizes_copy", "fill_", "zero_", "lift_fresh_copy",
            "alias_copy", "arange"}
ATTENTION_OPS = {"scaled_dot_product_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention"}


def _carries(v) -> bool:
    """Whether a node's recorded value (``step.SYM``) has a free symbol in it (``trace_symbolic``'s own reading)."""
    from cadence_fx.passes.trace_symbolic import _free_symbols
    return bool(_free_symbols(v))


def classify(gm) -> dict:
    from cadence_fx import step as meta
    from cadence_fx.passes import base
    from cadence_fx.passes.trace_symbolic import SymTensor
    out = {"nodes": 0, "carrying": 0}
    classes: dict[str, dict[str, collections.Counter]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        out["nodes"] += 1
        ins = [a for a in node.all_input_nodes]
        value_sym = _carries(node.meta.get(meta.SYM))
        input_sym = any(_carries(a.meta.get(meta.SYM)) for a in ins)
        if not (value_sym or input_sym):
            continue
        out["carrying"] += 1
        t = node.target
        name = getattr(t, "_opname", None) or getattr(t, "__name__", str(t))
        value = node.meta.get(meta.SYM)
        tensor_valued = isinstance(value, (SymTensor, list, tuple))
        if name == "getitem" or (isinstance(t, torch._ops.OpOverload) and base.is_view(node)):
            kind = "view"
        elif not tensor_valued:
            kind = "scalar"  # an int or bool of the sizes: a host int, or a device scalar in the padded form
        elif not isinstance(t, torch._ops.OpOverload):
            kind = "island"  # not an aten op: nothing known about it
        elif name == "dropout" and len(node.args) > 2 and node.args[2] is False:
            kind = "view"  # dropout in eval mode returns its input
        elif name in ATTENTION_OPS:
            kind = "attention"
        elif name in COPY_OPS:
            kind = "copy"
        elif torch.Tag.pointwise in t.tags:
            kind = "pointwise"
        else:
            kind = "island"
        where = "estimator" if "estimator" in meta.scopes(node) else "rest"
        classes.setdefault(where, {}).setdefault(kind, collections.Counter())[name] += 1
    out["by_scope"] = {w: {k: {"ops": sum(c.values()), "by_op": dict(c.most_common())} for k, c in sorted(ks.items())}
                       for w, ks in sorted(classes.items())}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=75)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.programs import entry as entry_mod

    syms = []
    orig = entry_mod.specialize

    def record(sym, at, tensors, by_region, recompile=True, share=None):
        syms.append(sym)
        return orig(sym, at, tensors, by_region, recompile=recompile, share=share)

    entry_mod.specialize = record
    try:
        flow, hift = s2.build_modules(0)
        tail = s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps)
        opt = cadence_fx.optimize(tail, rules="S", cache=True)
        opt.set_stream_cache(*s2.synthetic_prompt(args.prompt_tokens, seed=1))
    finally:
        entry_mod.specialize = orig
    seen, entries = set(), []
    for sym in syms:
        if id(sym) in seen:
            continue
        seen.add(id(sym))
        entries.append({"dims": sym.dims, "describe": sym.describe(), **classify(sym.gm)})
    out = {"torch": torch.__version__, "n_timesteps": args.n_timesteps, "entries": entries}
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
