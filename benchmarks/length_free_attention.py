"""Can an attention over a growing key/value cache run at a fixed capacity and keep its bits?

Architecture item 4 (docs/architecture.md, "Graphs that do not depend on the prompt
length") needs to know which of the prompt-length-dependent kernels could run at one
fixed size for every length.  The released Token2Wav's DiT attends over ``[new keys;
cache]`` with ``F.scaled_dot_product_attention`` and no mask (upstream's eager
``DiT.forward_chunk`` passes ``mask=None``; only its own CUDA-graph path pads the cache
and passes a mask; ``--stock-mask ones`` asks the question for an all-true boolean
mask); its conformer encoder over ``[cache; new keys]`` with ``matmul``, ``softmax``
and ``matmul`` under a mask.  For each, at every cache length ``L``, this compares the
stock call (the cache concatenated) with:

- ``view``: the same call on views ``[:, :, :n+L]`` of capacity-sized key and value
  buffers (the same sizes, other strides);
- ``padded``: the call on the whole capacity (``C`` keys), the mask false past ``n + L``
  (the padding zeros, or ``--garbage``: random values, which the mask must hide);
- ``graph``: ``padded`` captured once in a CUDA graph (at the first length) and replayed
  at every length after refilling its static tensors: one graph for all lengths;
- (fp16, flash, torch with ``num_splits``) which split counts of flash at the exact length
  equal stock's call, and which of its variable-length form on the capacity do;
- ``seqlen`` (the DiT, CUDA): the kernel stock's call ran (``--backend``: the efficient
  kernel, or flash's variable-length form) called on the whole capacity with the key
  count per batch in device memory (``seqlen_k`` / ``seqused_k``): no mask, a launch that
  does not depend on ``L``; ``seqlen_graph``: that call captured once, replayed at every length.

``--rows`` also asks the same of the chunk length (windows and flushes): the DiT's
linears (512 -> 512, 512 -> 2048, 2048 -> 512, ``2 x n`` rows) and its causal
convolution (``Conv1d(512, 512, 3)`` over ``n + 2`` frames) on ``n`` rows or frames
against the first ``n`` of a batch padded to the largest chunk.

``torch.equal`` against stock, in the same process, under deterministic algorithms
(``CUBLAS_WORKSPACE_CONFIG=:4096:8``), and which SDPA backend stock's call equals.
It measures kernels, not the product: nothing in the library runs this.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python benchmarks/length_free_attention.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

HEADS, HEAD_DIM, BATCH = 8, 64, 2  # the released DiT's attention (att_cache (16, 2, 8, t, 128))


STOCK_MASK = {"mask": False}  # --stock-mask ones: True


def dit_keys(k_new, v_new, att_cache):
    """The DiT's keys and values as upstream concatenates them: new first, then the cache."""
    k_cache, v_cache = att_cache.chunk(2, dim=3)
    return torch.cat([k_new, k_cache], dim=2), torch.cat([v_new, v_cache], dim=2)


def stock_dit(q, k_new, v_new, att_cache):
    """upstream's DiT ``Attention.forward_chunk`` from the heads on: new keys first."""
    k, v = dit_keys(k_new, v_new, att_cache)
    mask = None
    if STOCK_MASK["mask"]:
        mask = torch.ones(q.shape[0], q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).unsqueeze(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


SPLITS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def has_num_splits() -> bool:
    """Whether this torch's flash forward takes ``num_splits`` (how many parts the keys are cut into)."""
    return any(a.name == "num_splits" for a in torch.ops.aten._flash_attention_forward.default._schema.arguments)


def flash_splits(q, k_new, v_new, att_cache, kbuf, vbuf, lens, want) -> dict:
    """fp16's question: for each ``num_splits``, does flash at the exact length (stock's form)
    equal stock's call (which split count its heuristic took), and does the variable-length
    form on the capacity with the same count equal it."""
    k, v = dit_keys(k_new, v_new, att_cache)
    n = q.shape[2]
    exact, varlen = [], []
    for s in SPLITS:
        out = torch.ops.aten._flash_attention_forward(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, n, k.shape[2], 0.0, False, False,
            num_splits=s)[0].transpose(1, 2)
        if torch.equal(out, want):
            exact.append(s)
        try:
            out = seqlen_call("FLASH_ATTENTION", q, kbuf, vbuf, lens, num_splits=s)
        except RuntimeError:
            continue
        if torch.equal(out, want):
            varlen.append(s)
    return {"stock_equals_splits": exact, "varlen_equals_splits": varlen}


def seqlen_call(backend: str, q, kbuf, vbuf, lens, **flash_kw):
    """The DiT's attention over the first ``lens[b]`` keys of capacity buffers, the count
    read on the device: ``q`` (B, H, n, d), ``kbuf``/``vbuf`` (B, C, H, d), ``lens`` int32 (B,).
    Both kernels read the count only in their variable-length mode (cumulative offsets given)."""
    if backend not in ("EFFICIENT_ATTENTION", "FLASH_ATTENTION"):
        raise ValueError(f"no device-length form of {backend}")
    B, H, n, d = q.shape
    C = kbuf.shape[1]
    cum_q = torch.arange(0, (B + 1) * n, n, dtype=torch.int32, device=q.device)
    cum_k = torch.arange(0, (B + 1) * C, C, dtype=torch.int32, device=q.device)
    qs, ks, vs = q.transpose(1, 2).reshape(B * n, H, d), kbuf.reshape(B * C, H, d), vbuf.reshape(B * C, H, d)
    if backend == "EFFICIENT_ATTENTION":
        out = torch.ops.aten._efficient_attention_forward(
            qs[None], ks[None], vs[None], None, cum_q, cum_k, n, C, 0.0, 0, False, seqlen_k=lens)[0]
    else:
        out = torch.ops.aten._flash_attention_forward(
            qs, ks, vs, cum_q, cum_k, n, C, 0.0, False, False, seqused_k=lens, **flash_kw)[0]
    return out.reshape(B, n, H, d).transpose(1, 2)


def manual(q, k, v, mask):
    """upstream's conformer ``forward_attention`` (scores, masked softmax, weighted sum)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    neg = ~mask
    scores = scores.masked_fill(neg, -float("inf"))
    attn = torch.softmax(scores, dim=-1).masked_fill(neg, 0.0)
    return torch.matmul(attn, v)


def stock_manual(q, k_new, v_new, att_cache):
    """The conformer's order: cache first."""
    k_cache, v_cache = att_cache.chunk(2, dim=3)
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    mask = torch.ones(q.shape[0], 1, q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    return manual(q, k, v, mask)


def _fill(buf, parts, garbage: bool, gen):
    """``parts`` laid along dim 2 of ``buf`` from 0; the rest zeros or random values."""
    if garbage:
        buf.copy_(torch.randn(buf.shape, generator=gen, device="cpu").to(buf))
    else:
        buf.zero_()
    at = 0
    for p in parts:
        buf[:, :, at:at + p.shape[2]] = p
        at += p.shape[2]
    return at


def backend_of(q, k_new, v_new, att_cache, want) -> list[str]:
    """The SDPA backends whose result equals ``want`` (stock's default call)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return ["unknown"]
    same = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel([backend]):
                got = stock_dit(q, k_new, v_new, att_cache)
        except RuntimeError:
            continue  # not available for these inputs
        if torch.equal(got, want):
            same.append(name)
    return same


def run_case(kind: str, n: int, lengths: list[int], cap: int, dtype, device, garbage: bool, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)

    stock = stock_dit if kind == "dit" else stock_manual
    q = rnd(BATCH, HEADS, n, HEAD_DIM)
    kbuf = torch.empty(BATCH, HEADS, cap, HEAD_DIM, device=device, dtype=dtype)
    vbuf = torch.empty_like(kbuf)
    pmask = torch.zeros(BATCH, 1, n, cap, dtype=torch.bool, device=device)
    s_q = q.clone()

    def padded():
        if kind == "dit":
            return F.scaled_dot_product_attention(s_q, kbuf, vbuf, attn_mask=pmask)
        return manual(s_q, kbuf, vbuf, pmask)

    graph = out_static = None
    seq_graph = seq_static = None
    backend = None
    kbmhk = torch.empty(BATCH, cap, HEADS, HEAD_DIM, device=device, dtype=dtype)
    vbmhk = torch.empty_like(kbmhk)
    lens = torch.zeros(BATCH, dtype=torch.int32, device=device)
    rows = []
    for L in lengths:
        k_new, v_new, cache = rnd(BATCH, HEADS, n, HEAD_DIM), rnd(BATCH, HEADS, n, HEAD_DIM), rnd(BATCH, HEADS, L, 2 * HEAD_DIM)
        want = stock(q, k_new, v_new, cache)
        k_cache, v_cache = cache.chunk(2, dim=3)
        order = ([k_new, k_cache], [v_new, v_cache]) if kind == "dit" else ([k_cache, k_new], [v_cache, v_new])
        used = _fill(kbuf, order[0], garbage, gen)
        _fill(vbuf, order[1], garbage, gen)
        pmask.zero_()
        pmask[..., :used] = True
        row = {"kind": kind, "n": n, "L": L, "capacity": cap}
        mask = pmask[..., :used]
        if kind == "dit":
            view = F.scaled_dot_product_attention(q, kbuf[:, :, :used], vbuf[:, :, :used],
                                                  attn_mask=mask if STOCK_MASK["mask"] else None)
        else:
            view = manual(q, kbuf[:, :, :used], vbuf[:, :, :used], mask)
        got_padded = padded()
        row["view"] = _verdict(view, want)
        row["padded"] = _verdict(got_padded, want)
        if device.type == "cuda":
            if graph is None:
                torch.cuda.synchronize()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    padded()  # warm the kernels on the capture stream
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out_static = padded()
            graph.replay()
            torch.cuda.synchronize()
            row["graph"] = _verdict(out_static, want)
        if kind == "dit" and device.type == "cuda":
            if L == lengths[0]:
                row["stock_backend"] = found = backend_of(q, k_new, v_new, cache, want)
                backend = next((b for b in found if b in ("EFFICIENT_ATTENTION", "FLASH_ATTENTION")), None)
            if backend is not None and not STOCK_MASK["mask"]:
                kbmhk.copy_(kbuf.transpose(1, 2))
                vbmhk.copy_(vbuf.transpose(1, 2))
                lens.fill_(used)
                row["seqlen_backend"] = backend
                try:
                    row["seqlen"] = _verdict(seqlen_call(backend, q, kbmhk, vbmhk, lens), want)
                    if seq_graph is None:
                        torch.cuda.synchronize()
                        seq_graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(seq_graph):
                            seq_static = seqlen_call(backend, s_q, kbmhk, vbmhk, lens)
                    seq_graph.replay()
                    torch.cuda.synchronize()
                    row["seqlen_graph"] = _verdict(seq_static, want)
                except RuntimeError as e:  # this torch's kernel refuses the form: say so, go on
                    row["seqlen_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    backend = None
                if backend == "FLASH_ATTENTION" and has_num_splits():
                    row.update(flash_splits(q, k_new, v_new, cache, kbmhk, vbmhk, lens, want))
        rows.append(row)
    return rows


def rows_case(chunks: list[int], dtype, device, garbage: bool, seed: int) -> list[dict]:
    """Linears and the causal convolution at ``n`` against the first ``n`` of ``max(chunks)``."""
    gen = torch.Generator().manual_seed(seed)
    top = max(chunks)
    mods = {"linear 512->512": torch.nn.Linear(512, 512), "linear 512->2048": torch.nn.Linear(512, 2048),
            "linear 2048->512": torch.nn.Linear(2048, 512), "conv1d 512x3": torch.nn.Conv1d(512, 512, 3)}
    rows = []
    for name, mod in mods.items():
        mod = mod.to(device=device, dtype=dtype)
        conv = name.startswith("conv")
        wide = 2048 if name.startswith("linear 2048") else 512
        pad = torch.randn((BATCH, top, wide), generator=gen).to(device=device, dtype=dtype)
        if not garbage:
            pad.zero_()
        for n in chunks:
            x = torch.randn((BATCH, n, wide), generator=gen).to(device=device, dtype=dtype)
            xp = pad.clone()
            xp[:, :n] = x
            cache = torch.randn((BATCH, 2, wide), generator=gen).to(device=device, dtype=dtype)
            with torch.no_grad():
                if conv:  # (b, c, t): n frames after the 2-frame cache, the padding after them
                    want = mod(torch.cat([cache, x], 1).transpose(1, 2))
                    got = mod(torch.cat([cache, xp], 1).transpose(1, 2))[..., :n]
                else:
                    want, got = mod(x), mod(xp)[:, :n]
            rows.append({"kind": name, "n": n, "padded_to": top, "padded": _verdict(got, want)})
    return rows


def _verdict(got, want) -> dict:
    if torch.equal(got, want):
        return {"equal": True}
    return {"equal": False, "max_abs_diff": float((got.float() - want.float()).abs().max())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--chunks", default="50,56,22,2", help="new frames a call (the queries)")
    p.add_argument("--lengths", default="0,150,151,333,500,777,1000", help="cache lengths L")
    p.add_argument("--capacity", type=int, default=1100)
    p.add_argument("--garbage", action="store_true", help="random values in the padding, not zeros")
    p.add_argument("--stock-mask", choices=("none", "ones"), default="none",
                   help="stock's DiT call: no mask (upstream's eager path) or an all-true boolean mask")
    p.add_argument("--rows", action="store_true", help="also the chunk length: linears and the conv padded")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    STOCK_MASK["mask"] = args.stock_mask == "ones"
    device = torch.device(args.device)
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for kind in ("dit", "manual"):
            for n in (int(x) for x in args.chunks.split(",")):
                if n + max(lengths) > args.capacity:
                    raise SystemExit(f"--capacity {args.capacity} < {n} + {max(lengths)}")
                for row in run_case(kind, n, lengths, args.capacity, dtype, device, args.garbage, args.seed):
                    row["dtype"] = dtype_name
                    rows.append(row)
        if args.rows:
            for row in rows_case([int(x) for x in args.chunks.split(",")], dtype, device, args.garbage, args.seed):
                row["dtype"] = dtype_name
                rows.append(row)
    variants = [v for v in ("view", "padded", "graph", "seqlen", "seqlen_graph") if any(v in r for r in rows)]
    summary = {}
    for r in rows:
        key = f"{r['dtype']} {r['kind']}"
        s = summary.setdefault(key, {v: [0, 0] for v in variants if v in r})
        for v in variants:
            if v in r:
                s[v][0] += r[v]["equal"]
                s[v][1] += 1
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "garbage": args.garbage, "stock_mask": args.stock_mask, "capacity": args.capacity, "summary": {
               k: {v: f"{a}/{b} equal" for v, (a, b) in s.items() if b} for k, s in summary.items()},
           "backends": sorted({(r["dtype"], r["n"], tuple(r["stock_backend"])) for r in rows if "stock_backend" in r}),
           "rows": rows}
    for k, s in out["summary"].items():
        print(k, s)
    print("stock's SDPA equals backend(s):", out["backends"])
    split_rows = [r for r in rows if "stock_equals_splits" in r]
    if split_rows:
        both = sum(bool(set(r["stock_equals_splits"]) & set(r["varlen_equals_splits"])) for r in split_rows)
        print(f"flash num_splits: the variable-length form equals stock at a split count stock's own form "
              f"also matches in {both}/{len(split_rows)} rows")
    for e in sorted({r["seqlen_error"] for r in rows if "seqlen_error" in r}):
        print("seqlen form refused:", e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
