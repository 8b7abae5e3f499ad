"""Architecture item 4 (c)'s premise on real graphs: capacity-form pieces captured ONCE, replayed at every length.

Each entry of the released Token2Wav (``capacity_form.py``'s recording) is rewritten once
by ``passes.capacity.capacity_form``; its nodes are cut into *pieces*: maximal runs of
nodes that read no host size (capacity-mode and static nodes, device sizes) inside the
``--scope`` (default: the DiT, ``estimator``; the vocoder draws noise and stays eager).
On CUDA each piece is captured in a CUDA graph the first time it runs (after one warm-up
run on a side stream) and only replayed after that, at every prompt length; everything
else (the islands, the host sizes) runs eagerly between them.  The state, buffers and
``len_<dim>`` live in tensors allocated once at the capacity (each length's values copied
in), so a piece that writes them writes the same memory at every replay; a piece input
made by an island is copied into the piece's own buffer before each replay, and a piece
that would write such an input is refused.  On the CPU nothing is captured (the pieces
run as they would be replayed: the same input buffers and copies), a dry run.

Every length is checked against ``specialize``'s graph at that length, eager, on the same
values (``torch.equal`` on every output's and buffer's live part), under the deterministic
protocol on CUDA.  Prints one JSON line per length and a summary: captures (once per
piece), replays, and the medians of a replayed run and of ``specialize``'s eager graph.

    python benchmarks/capacity_replay.py --device cuda --n-timesteps 5 --attention probe \\
        --prompt-frames 150,176,222,300,418,500 [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.fx as fx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capacity_form as cf  # noqa: E402


def pieces_of(gm: fx.GraphModule, scope: str) -> list[list[fx.Node]]:
    """Maximal runs of nodes that read no host int (a ``host_size``)
    and run no exact node, in ``scope`` (all: ``""``).  A piece may read an island's values:
    a piece never reads a padded one (``capacity_plan``), so their sizes are the same at every length."""
    from cadence_fx import step as meta
    from cadence_fx.passes import capacity_ops
    from cadence_fx.passes.capacity_plan import _MODE, EXACT
    from cadence_fx.passes.partition import HOST_SYNC
    host: set = set()
    out, run = [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            continue  # a constant: the pieces read it where it is
        if node.op != "call_function":
            if run:
                out.append(run); run = []
            continue
        reads_host = any(a in host for a in node.all_input_nodes)
        mode = node.meta.get(_MODE)
        sizes = node.target is capacity_ops.DEVICE_SIZE
        graphable = (not reads_host and node.target not in (capacity_ops.host_size, capacity_ops.TO_CAPACITY)
                     and node.target not in HOST_SYNC and mode != EXACT
                     and torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ())
                     and (mode is not None or sizes) and (not scope or scope in meta.scopes(node) or sizes))
        if not graphable:
            if node.target is capacity_ops.host_size:
                host.add(node)  # a host int (an island's values are device tensors: a piece may read them)
            if run:
                out.append(run); run = []
            continue
        run.append(node)
    if run:
        out.append(run)
    return [r for r in out if any(n.target is not capacity_ops.DEVICE_SIZE for n in r)]


class Replayer(fx.Interpreter):
    """Runs the capacity graph, each piece captured once (CUDA) and replayed after."""

    def __init__(self, gm: fx.GraphModule, pieces: list, capture: bool):
        super().__init__(gm)
        self.capture = capture
        self.first = {p[0]: p for p in pieces}
        self.members = {n for p in pieces for n in p}
        self.state: dict = {}  # piece head -> {graph, bufs (island-made inputs' copies), bound, outputs}
        self.captures = self.replays = 0
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.stable: dict = {}  # id -> tensor: memory that stays put between runs (held alive here)

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        self.stable[id(t)] = t
        return t

    def run_node(self, n):
        if n in self.first:
            self._piece(self.first[n])
        if n in self.members:
            return self.env[n]
        value = super().run_node(n)
        return self.hold(value) if n.op == "get_attr" and isinstance(value, torch.Tensor) else value

    def _piece(self, piece: list) -> None:
        from cadence_fx.passes.base import view_root, written_args
        members = set(piece)
        inputs = list(dict.fromkeys(a for n in piece for a in n.all_input_nodes if a not in members))
        for a in inputs:
            if a.op == "get_attr" and a not in self.env:  # placed after the piece's head: read it now
                self.env[a] = self.hold(self.fetch_attr(a.target))
        head = piece[0]
        st = self.state.get(head)
        if st is None:
            written = {view_root(w) for n in piece for w in written_args(n)}
            bufs, bound = {}, {}
            for a in inputs:
                v = self.env[a]
                if not isinstance(v, torch.Tensor):
                    continue
                if self.stable.get(id(v)) is v:
                    bound[a] = v  # its memory, at every replay
                else:
                    bufs[a] = v.clone()  # an island's value: copied in before each replay (and back, if written)
            outputs = [n for n in piece if any(u not in members for u in n.users)]
            st = self.state[head] = {"graph": None, "bufs": bufs, "bound": bound, "outputs": outputs,
                                     "back": [a for a in bufs if a in written]}
        for a, t in st["bound"].items():
            if self.env[a] is not t:
                raise RuntimeError(f"piece at {head.name}: {a.name} is no longer the memory it was captured on")
        for a, b in st["bufs"].items():
            b.copy_(self.env[a])
        env = {a: st["bufs"].get(a, self.env[a]) for a in inputs}

        def body():
            local = dict(env)
            for n in piece:
                args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda x: local[x])
                local[n] = n.target(*args, **kwargs)
            return [local[n] for n in st["outputs"]]
        if not self.capture:  # a dry run: the piece's outputs kept as a graph's are, refilled each run
            fresh = body()
            if "results" not in st:
                st["results"] = fresh
            else:
                for r, w in zip(st["results"], fresh):
                    if isinstance(r, torch.Tensor):
                        r.copy_(w)
                self.replays += 1
            results = st["results"]
        elif st["graph"] is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                warm = body()  # this run's values, eagerly; every kernel's first use before the capture
            torch.cuda.current_stream().wait_stream(side)
            st["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(st["graph"], pool=self.pool):  # records; runs nothing
                results = body()
            for r, w in zip(results, warm):
                if isinstance(r, torch.Tensor):
                    r.copy_(w)
            st["results"] = results
            self.captures += 1
        else:
            st["graph"].replay()
            results = st["results"]
            self.replays += 1
        for a in st["back"]:  # what the piece wrote into an island's value, into that value's memory
            self.env[a].copy_(st["bufs"][a])
        for n, r in zip(st["outputs"], results):
            self.env[n] = self.hold(r) if isinstance(r, torch.Tensor) else r
        for n in piece:
            self.env.setdefault(n, None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-timesteps", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=75)
    p.add_argument("--capacity", type=int, default=500)
    p.add_argument("--prompt-frames", default="150,176,222,300,418,500")
    p.add_argument("--entry", type=int, default=-1, help="which recorded entry (-1: the last, the steady one)")
    p.add_argument("--scope", default="estimator", help='"" for every piece of the chunk (random draws, '
                   'host reads and islands stay eager)')
    p.add_argument("--attention", choices=("exact", "masked", "probe"), default="probe")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        from cadence_fx.lockstep import deterministic_protocol
        deterministic_protocol()
    from cadence_fx.errors import SpecializationRefused
    from cadence_fx.passes import capacity as cap
    from cadence_fx.passes.specialize import specialize

    sym = cf.record_entries(args.n_timesteps, args.prompt_tokens, device)[args.entry]
    t0 = time.perf_counter()
    gm, plan = cap.capacity_form(sym, {"prompt_frames": args.capacity}, masked_attention=cf.attention(args, sym, device))
    rewrite_s = time.perf_counter() - t0
    pieces = pieces_of(gm, args.scope)
    print(plan.explain(), f"\npieces: {len(pieces)} ({sum(map(len, pieces))} nodes)", flush=True)
    replayer = Replayer(gm, pieces, capture=device.type == "cuda")
    held: dict = {}  # placeholder name -> the tensor every length runs on
    lens = replayer.hold(torch.zeros((), dtype=torch.int64, device=device))
    rows = []
    for s in [int(x) for x in args.prompt_frames.split(",")]:
        row = {"prompt_frames": s}
        try:
            cap.check_dims(plan, sym, {"prompt_frames": s})
        except SpecializationRefused as e:
            rows.append({**row, "refused": str(e)}); print(json.dumps(rows[-1]), flush=True)
            continue
        exact, padded = cf.tensors_at(sym, s, args.capacity, float("nan"), device, args.seed)
        for name, t in padded.items():
            if name not in held:
                held[name] = replayer.hold(t.clone())
            held[name].copy_(t)
        lens.fill_(s)
        want, buffers = cf.reference(sym, s, exact, args.seed)
        times, eager_times = [], []
        tensors = {k: v for k, v in exact.items() if not k.startswith("buf_")}
        ref = specialize(sym, {"prompt_frames": s}, tensors, {k[4:]: v.clone() for k, v in exact.items()
                                                                if k.startswith("buf_")})
        for rep in range(args.reps):
            for name, t in padded.items():
                held[name].copy_(t)
            torch.manual_seed(args.seed)
            sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
            sync(); t1 = time.perf_counter()
            with torch.no_grad(), cap.at_dims({"prompt_frames": s}):
                got = replayer.run(*cap.arguments(gm, held, {"prompt_frames": lens}))
            sync(); times.append(time.perf_counter() - t1)
            if rep == 0:
                row.update(cf.compare(want, got, buffers, held))
            sync(); t1 = time.perf_counter()
            with torch.no_grad():
                ref(*tensors.values())
            sync(); eager_times.append(time.perf_counter() - t1)
        row.update(replayed_ms=round(1e3 * statistics.median(times), 2),
                   specialize_eager_ms=round(1e3 * statistics.median(eager_times), 2),
                   captures_so_far=replayer.captures, replays_so_far=replayer.replays)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"torch": torch.__version__, "device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda"
           else None, "n_timesteps": args.n_timesteps, "capacity": args.capacity, "scope": args.scope,
           "attention": args.attention, "entry": sym.describe(), "rewrite_s": round(rewrite_s, 3),
           "plan": plan.counts(), "pieces": len(pieces), "captures": replayer.captures, "replays": replayer.replays,
           "exact": all(r.get("exact", True) for r in rows) and any("exact" in r for r in rows), "rows": rows}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return 0 if out["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
