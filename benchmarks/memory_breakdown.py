"""Where the optimized Token2Wav tail's CUDA memory goes, from the allocator itself.

After ``optimize`` + prompt setup + warm-up chunks it attributes every live block
(``torch.cuda.memory_snapshot``) to a named owner: the weights, each module buffer,
the session's arena, the CUDA-graph private pool, or "other" (with its size and the
source line that allocated it: the allocator's history is on from the start). Then it
records the allocator's history over one steady-state chunk
(``torch.cuda.memory._record_memory_history``) and prints the peak over that chunk
with the allocations live at that moment and the source line that made each.

    python benchmarks/memory_breakdown.py --rules SRc [--n-timesteps 5] [--prompt-tokens 50]

Needs CUDA. Evidence for docs/results/README.md; it changes nothing.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json

import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.lockstep import deterministic_protocol

MiB = 2 ** 20


def owners(opt, flow, hift) -> list[tuple[int, int, str]]:
    """(start, end, name) of every tensor we can name."""
    spans = []
    for label, mod in (("flow", flow), ("hift", hift)):
        for n, p in mod.named_parameters():
            s = p.untyped_storage()
            spans.append((s.data_ptr(), s.data_ptr() + s.nbytes(), "weights"))
        for n, b in mod.named_buffers():
            s = b.untyped_storage()
            spans.append((s.data_ptr(), s.data_ptr() + s.nbytes(), f"buffer {label}.{n}"))
    arena = opt.session.arena.storage
    spans.append((arena.data_ptr(), arena.data_ptr() + arena.numel() * arena.element_size(), "arena"))
    return sorted(spans)


def attribute(snapshot, spans) -> dict:
    totals = collections.Counter()
    others = collections.Counter()
    for seg in snapshot:
        pool = tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0)
        addr = seg["address"]
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                name = next((n for lo, hi, n in spans if lo <= addr < hi), None)
                if name is None:
                    name = "cuda-graph pool (live)" if pool else "other"
                    if not pool:  # with the allocation's source line (history is recorded from the start)
                        others[(blk["size"], frame(blk.get("frames", [])))] += 1
                totals[name] += blk["size"]
            elif pool and blk["state"] == "inactive":
                totals["cuda-graph pool (reserved, free)"] += blk["size"]
            addr += blk["size"]
    return {"by_owner_mib": {k: round(v / MiB, 2) for k, v in totals.most_common()},
            "other_blocks": [{"mib": round(size / MiB, 2), "count": n, "allocated_at": where}
                             for (size, where), n in sorted(others.items(), reverse=True)[:16]]}


def frame(frames) -> str:
    """The innermost frame in our code or upstream's, else the innermost Python frame."""
    def fmt(f):
        return f"{f.get('filename', '?').split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    ours = [f for f in frames if any(k in f.get("filename", "") for k in ("cadence_fx", "stepaudio2", "moshi"))]
    py = [f for f in frames if f.get("filename", "").endswith(".py")]
    return fmt((ours or py or frames or [{}])[0]) if frames else "?"


def chunk_peak(trace) -> dict:
    live, total, peak, at_peak = {}, 0, 0, {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], frame(ev.get("frames", [])))
            total += ev["size"]
        elif ev["action"] in ("free_completed",) and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
        if total > peak:
            peak, at_peak = total, dict(live)
    by_site = collections.Counter()
    for size, where in at_peak.values():
        by_site[where] += size
    return {"allocated_during_chunk_peak_mib": round(peak / MiB, 2),
            "live_at_peak_by_site_mib": {k: round(v / MiB, 2) for k, v in by_site.most_common(15)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", default="SRc")
    ap.add_argument("--n-timesteps", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("memory_breakdown needs CUDA")
    deterministic_protocol()
    dev = torch.device("cuda")
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)  # every block's allocation stack
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.to(dev), hift.to(dev), n_timesteps=a.n_timesteps)
    report = {"rules": a.rules, "n_timesteps": a.n_timesteps, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(dev), "stages_mib": {}}
    stage = report["stages_mib"]
    stage["modules built"] = torch.cuda.memory_allocated(dev) / MiB
    opt = cadence_fx.optimize(tail, rules=a.rules)
    del tail
    gc.collect()
    torch.cuda.empty_cache()
    opt.set_stream_cache(*s2.synthetic_prompt(a.prompt_tokens, 0, device=dev))
    stage["optimized + prompt set (graphs captured)"] = torch.cuda.memory_allocated(dev) / MiB
    stage["peak so far (trace, capture, setup)"] = torch.cuda.max_memory_allocated(dev) / MiB
    chunks = s2.synthetic_chunks(a.warmup + 1, 0)
    for k in range(a.warmup):
        torch.manual_seed(k)
        opt.stream(chunks[k][0], last_chunk=False, return_waveform=True)
    torch.cuda.synchronize()
    stage["after warm-up chunks"] = torch.cuda.memory_allocated(dev) / MiB
    report["static"] = attribute(torch.cuda.memory_snapshot(), owners(opt, flow, hift))
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.memory._record_memory_history(enabled=None)  # restart: the trace holds one chunk only
    torch.cuda.memory._record_memory_history(max_entries=200000)
    torch.manual_seed(a.warmup)
    opt.stream(chunks[a.warmup][0], last_chunk=False, return_waveform=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stage["steady chunk: peak allocated"] = torch.cuda.max_memory_allocated(dev) / MiB
    stage["steady chunk: allocated before it"] = base / MiB
    report["steady_chunk"] = chunk_peak(snap["device_traces"][dev.index or 0])
    report["stats"] = opt.stats()
    report["stages_mib"] = {k: round(v, 2) for k, v in stage.items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
