"""Where a chunk's transient memory goes: liveness of the rule-S graph, op by op.

Runs one steady-state chunk of the released Token2Wav tail under rule S through an
``fx.Interpreter`` that frees each value after its last use (as eager does) and, after
every node, sums the bytes of the distinct storages still alive that the graph itself
allocated (not its inputs, arena views or weights). Prints the peak, where in the
graph it happens, and the largest live storages at that moment with the node that
allocated each and its source line. The sizes are the allocator's requests, so the
numbers hold on any device (the CUDA caching allocator rounds them up slightly).

    python benchmarks/activation_memory.py [--n-timesteps 5] [--prompt-tokens 50] [--device cpu]

This is the evidence behind the memory notes on docs/results/README.md: it does not
time anything and changes nothing.
"""

from __future__ import annotations

import argparse
import collections

import torch
import torch.fx as fx

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2


def _storages(value):
    if isinstance(value, torch.Tensor):
        yield value.untyped_storage()
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _storages(v)


def _where(node: fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    return lines[-1] if lines else str(node.target)


class Liveness(fx.Interpreter):
    """Runs the graph freeing values after their last use; records live allocated bytes."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm, garbage_collect_values=True)
        self.external: set[int] = set()
        self.owner: dict[int, fx.Node] = {}
        self.peak, self.peak_at, self.peak_live = 0, None, []
        self.curve: list[int] = []

    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        if n.op in ("placeholder", "get_attr"):
            self.external.update(s.data_ptr() for s in _storages(result))
            return result
        for s in _storages(result):
            self.owner.setdefault(s.data_ptr(), n)
        live: dict[int, int] = {}
        for v in list(self.env.values()) + [result]:
            for s in _storages(v):
                if s.data_ptr() not in self.external:
                    live[s.data_ptr()] = s.nbytes()
        total = sum(live.values())
        self.curve.append(total)
        if total > self.peak:
            self.peak, self.peak_at = total, n
            self.peak_live = sorted(((b, self.owner.get(p)) for p, b in live.items()), key=lambda x: -x[0])
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-timesteps", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--chunk", type=int, default=2, help="which chunk to measure (2: steady state)")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    dev = torch.device(a.device)
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow.to(dev), hift.to(dev), n_timesteps=a.n_timesteps)
    opt = cadence_fx.optimize(tail, rules="S", progress=lambda m: print(f"[trace] {m}", flush=True))
    opt.set_stream_cache(*s2.synthetic_prompt(a.prompt_tokens, 0, device=dev))
    chunks = s2.synthetic_chunks(a.chunk + 1, 0)
    exe = opt.session.executable
    measured = {}
    for index, program in exe.programs.items():
        gm = program.run

        def run(*args, _gm=gm, _index=index):
            li = Liveness(_gm)
            out = li.run(*args)
            measured[_index] = li
            return out
        program.run = run
    with torch.no_grad():
        for k, (tokens, last) in enumerate(chunks):
            torch.manual_seed(k)
            opt.stream(tokens, last_chunk=last, return_waveform=True)
    li = measured[max(measured)]
    print(f"\nrule S, {a.n_timesteps} flow steps, prompt {a.prompt_tokens} tokens, chunk {a.chunk} "
          f"(catalog entry {max(measured)}): {len(li.curve)} nodes")
    print(f"weights: {sum(p.numel() * p.element_size() for p in list(flow.parameters()) + list(hift.parameters())) / 2**20:.0f} MiB; "
          f"arena: {opt.session.arena.nbytes / 2**20:.0f} MiB")
    print(f"peak live intermediates: {li.peak / 2**20:.1f} MiB at node {li.peak_at.name} ({_where(li.peak_at)})")
    print(f"largest {a.top} live storages at the peak:")
    by_site = collections.Counter()
    for b, node in li.peak_live:
        by_site[_where(node) if node is not None else "?"] += b
    for b, node in li.peak_live[:a.top]:
        print(f"  {b / 2**20:8.2f} MiB  {node.name if node else '?':<28} {_where(node) if node else ''}")
    print("live bytes at the peak by source line:")
    for site, b in by_site.most_common(a.top):
        print(f"  {b / 2**20:8.2f} MiB  {site}")


if __name__ == "__main__":
    main()
