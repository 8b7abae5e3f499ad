"""Upstream's own padded DiT graphs against its eager DiT, at every cache length.

Upstream's DiT (``stepaudio2``'s ``decoder_dit.DiT``) has a CUDA-graph path of its own
(``_init_cuda_graph_chunk``): one graph per chunk size (30, 48, 96 frames), its
attention cache padded with zeros to 500 or 1000 frames and a boolean mask false on the
padding; its eager path (``forward_chunk`` with ``use_cuda_graph`` off, what the stock
Token2Wav runs and what cadence_fx matches) concatenates the cache at its own length and
passes no mask.  ``benchmarks/length_free_attention.py`` found the DiT's attention call
exact under that padding in fp32 on the H200; this asks the same of the whole DiT chunk
(16 blocks, the released configuration, seeded random weights): at each cache length,
upstream's graph replay against its eager call, ``torch.equal`` on the output, the new
conv caches and the new attention cache (its first ``n + L`` frames), in one process
under deterministic algorithms.  fp16 runs both under ``torch.autocast`` as the flow
does.  ``--time-reps N``: each path's call timed too (median of N, to a device sync): what
a padded graph would save an eager chunk (one DiT call per flow step).  A measurement of
architecture item 4's premise; nothing in the library runs it.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python benchmarks/dit_padded_cache.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--lengths", default="1,63,64,65,150,257,333,499,500,777,904",
                   help="cache lengths (frames); each chunk size takes those its graph holds")
    p.add_argument("--time-reps", type=int, default=0,
                   help="also time each call (both paths, to a device sync): the median of this many")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from cadence_fx.integrations import stepaudio2 as s2

    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)
    flow, _ = s2.build_modules(args.seed)
    est = flow.decoder.estimator.to(device)
    gen = torch.Generator().manual_seed(args.seed)

    def rnd(*shape):
        return torch.randn(shape, generator=gen).to(device)

    rows = []
    for dtype_name in args.dtypes.split(","):
        half = dtype_name == "float16"
        est.use_cuda_graph = False
        est.graph_chunk, est.inference_buffers_chunk, est.max_size_chunk = {}, {}, {}
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16, enabled=half):
            est._init_cuda_graph_chunk()  # upstream's graphs: 30 and 48 frames at 500, 96 at 1000
            for chunk, cap in sorted(est.max_size_chunk.items()):
                for L in (int(x) for x in args.lengths.split(",")):
                    if L > cap or L + chunk > est.att_cache_buffer.shape[3]:
                        continue
                    inputs = (rnd(2, 80, chunk), rnd(2, 80, chunk), rnd(2), rnd(2, 80), rnd(2, 80, chunk),
                              rnd(16, 2, 1024, 2), rnd(16, 2, 8, L, 128))
                    outs, ms = {}, {}
                    for mode in ("eager", "graph"):
                        est.use_cuda_graph = mode == "graph"
                        x, cnn, att = est.forward_chunk(*inputs)
                        outs[mode] = (x.clone(), cnn.clone(), att.clone())  # eager: views of the module's buffers
                        if args.time_reps and device.type == "cuda":
                            times = []
                            for _ in range(args.time_reps):  # the call again, to a device sync
                                torch.cuda.synchronize()
                                t0 = time.perf_counter()
                                est.forward_chunk(*inputs)
                                torch.cuda.synchronize()
                                times.append((time.perf_counter() - t0) * 1e3)
                            ms[mode] = round(statistics.median(times), 3)
                    est.use_cuda_graph = False
                    row = {"dtype": dtype_name, "chunk": chunk, "capacity": cap, "L": L}
                    if ms:
                        row["ms_p50"] = ms
                    for name, e, g in zip(("x", "cnn_cache", "att_cache"), outs["eager"], outs["graph"]):
                        same = e.shape == g.shape and torch.equal(e, g)
                        row[name] = same if same else float((e.float() - g.float()).abs().max()) if e.shape == g.shape \
                            else f"shapes {tuple(e.shape)} {tuple(g.shape)}"
                    row["exact"] = all(row[k] is True for k in ("x", "cnn_cache", "att_cache"))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary = {}
    for r in rows:
        s = summary.setdefault(f"{r['dtype']} chunk {r['chunk']}", [0, 0])
        s[0] += r["exact"]
        s[1] += 1
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "summary": {k: f"{a}/{b} exact" for k, (a, b) in summary.items()}, "rows": rows}
    print(json.dumps(out["summary"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
