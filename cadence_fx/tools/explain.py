"""``cadence-fx explain``: the plan (clocks, regions, catalog, arena, verdicts) and its Setup
(the dims each entry is traced symbolically in, ``"setup"`` in the JSON); ``--trace`` adds
the partition preview of the traced rule-S graphs."""

from __future__ import annotations

import json

from . import registry
from .options import add_model_args, model_of, progress


def add_args(p) -> None:
    add_model_args(p, weights=False, rules=None)
    p.add_argument("--trace", action="store_true",
                   help="also build the model (seeded), trace every entry and preview the partition (minutes on CPU)")


def run(args) -> int:
    from ..compiler import build_plan
    from ..programs import setup_section
    from ..runtime import variants
    spec = model_of(args)
    adapter = spec.explain_adapter(args)
    plan = build_plan(adapter)
    doc = plan.to_json()
    from ..integrations.dropin import DEFAULT_MAX_EXECUTABLES
    doc["setup"] = {"symbolic_dims": list(adapter.symbolic_dims()), "max_executables": DEFAULT_MAX_EXECUTABLES}
    doc["off_catalog"] = {"policies": list(variants.POLICIES), "default": variants.DEFAULT_POLICY,
                          "max_specializations": variants.DEFAULT_MAX_ENTRIES,
                          "max_specialization_bytes": variants.DEFAULT_MAX_BYTES}
    text = plan.explain() + "\n\n" + setup_section(adapter.symbolic_dims()) + "\n\n" + variants.off_catalog_section()
    if args.trace:
        doc["partition"], lines = partition_preview(spec, args)
        text += "\n\nPartition preview (rule S graphs, traced here; what rules SR/SRc would leave eager)\n" + lines
    if args.json:
        print(json.dumps(doc))
    else:
        print(text)
    return 0


def partition_preview(spec: registry.ModelSpec, args) -> tuple[dict, str]:
    """Per entry, per granularity (SRc: the chunk, SR: the step), the regions and eager islands."""
    from ..compiler import preview_partition
    args.seed, args.checkpoint = 0, None
    stock, prompt = registry.build(spec, args)
    exe = spec.executable(registry.optimize(spec, stock, "S", progress(args.json)), prompt)
    boundary = spec.explain_adapter(args).step_boundary()  # a planning adapter knows the step's boundary
    doc, lines = {}, []
    for granularity in ("chunk", "step"):
        for idx, rec in preview_partition(exe, granularity, None if granularity == "chunk" else boundary).items():
            doc.setdefault(str(idx), {})[granularity] = {
                "regions": [{"name": n, "capturable": c, "nodes": k} for n, c, k in rec.regions],
                "eager": [{"node": v.node, "reason": v.reason} for v in rec.islands]}
            lines.append(f"  entry {idx} ({'SRc' if granularity == 'chunk' else 'SR'}): {rec}")
    return doc, "\n".join(lines)
