"""Median seconds to load (fetch + decode) each Token2Wav program file of a cache directory, in one process.

    OMP_NUM_THREADS=1 python benchmarks/program_load.py CACHE_DIR REPEATS > out.json

For a paired comparison run it with PYTHONPATH at each checkout in turn (same files, same machine)."""
import glob, json, statistics, sys, time
import torch
torch.set_num_threads(1)
import cadence_fx
from cadence_fx.programs.disk import DiskCache, MAGIC
from cadence_fx.integrations import stepaudio2 as s2
flow, hift = s2.build_modules(0)
modules = {"flow": flow, "hift": hift}
# a first use of the model (upstream moves its positional tables on first use): run one stream
tail = s2.Token2WavTail(flow, hift, n_timesteps=2)
tail.set_stream_cache(*s2.synthetic_prompt(5, seed=1))
tail.stream(s2.synthetic_chunks(1, seed=1)[0][0], last_chunk=False)
rows = {}
for path in sorted(glob.glob(sys.argv[1] + "/*.cfx")):
    head = open(path, "rb").read(200000)[len(MAGIC):].split(b"\n", 1)[0]
    parts = json.loads(head)["parts"]
    if "Token2Wav" not in parts["adapter"]:
        continue
    times = []
    for _ in range(int(sys.argv[2])):
        disk = DiskCache(sys.argv[1])
        t0 = time.perf_counter()
        step, why = disk.fetch(parts, modules)
        times.append(time.perf_counter() - t0)
        assert step is not None, why
    key = parts["symbolic_key"]
    rows[path.split("/")[-1][:12]] = {"entry": key[0], "steps": key[1][:40], "nodes": len(step.gm.graph.nodes),
                                      "median_s": round(statistics.median(times), 3)}
print(json.dumps({"cadence_fx": cadence_fx.__file__, "files": rows,
                  "total_median_s": round(sum(r["median_s"] for r in rows.values()), 3)}, indent=1))
