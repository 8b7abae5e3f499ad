"""Folds call A's setup_time.py reports into docs/results/setup-h200.json (run from the repository
root): today's rows become "rows", the file's previous rows go under "before" with their commit.

    python3 docs/results/h200-2026-12-04-session36/compose_setup_json.py
"""
import json
from pathlib import Path

HERE = Path(__file__).parent / "callA-node-copy-setup-rows"
TARGET = Path("docs/results/setup-h200.json")
COMMIT = "9c6c146"

old = json.loads(TARGET.read_text())
rows, torch_versions = [], set()
for k in (10, 5):
    rep = json.loads((HERE / f"setup{k}" / f"setup-SRc-{k}.json").read_text())
    torch_versions.add(rep["torch"])
    every = [r["ready_s"] for r in rep["cold"]["rows"][1:]] + [r["ready_s"] for r in rep["warm"]["rows"][1:]]
    split = []
    for run in ("cold", "warm"):
        for r in rep[run]["rows"]:
            s = r["split"]
            split.append({"run": run, "prompt_tokens": r["prompt_tokens"], "ready_s": r["ready_s"],
                          "trace_s": s["trace_s"], "specialize_s": s["specialize_s"], "passes_s": s["passes_s"],
                          "capture_s": r["capture_s"], "gc_full_s": r["gc"]["full_s"],
                          "gc_young_s": r["gc"]["young_s"], "exact": r["exact"]})
    rows.append({"rules": rep["rules"], "dtype": "float32", "n_timesteps": k, "prompt_tokens": rep["prompt_tokens"],
                 "command": "python3 benchmarks/setup_time.py --device cuda --rules SRc --n-timesteps "
                            f"{k} --prompt-tokens 75,150,250 --chunks 4 --timeout 140 --out $OUT",
                 "first_setup_s": rep["first_setup_s"], "new_prompt_length_ready_s": rep["new_prompt_length_ready_s"],
                 "cold_start_cached_s": rep["cold_start_cached_s"], "exact": rep["exact"],
                 "new_prompt_length_ready_s_every_row": every, "split_per_length": split,
                 "tracked_objects_per_row": [r["tracked_objects"] for run in ("cold", "warm") for r in rep[run]["rows"]]})
    assert rep["gpu"] == "NVIDIA H200" and rep["date"] == "2026-12-04", rep

def control() -> dict:
    """call C: the control's child run directly, an empty inductor cache, then a new process on it."""
    here = Path(__file__).parent / "callC-compile-control" / "control"
    runs = {}
    for run in ("empty_cache", "warm_cache"):
        rows = [json.loads(line) for line in (here / f"{run}.log").read_text().splitlines() if line.startswith("{")]
        done = (here / f"{run}.json").read_text().strip()
        runs[run] = {"rows": rows, "finished": bool(done)}
    return {"variant": "compile-ro: torch.compile(estimator.forward_chunk, mode='reduce-overhead', dynamic=False)",
            "n_timesteps": 10, "prompt_tokens": [75, 150],
            "command": "TORCHINDUCTOR_CACHE_DIR=DIR python3 benchmarks/setup_time.py --child --run-control compile-ro "
                       "--device cuda --rules SRc --n-timesteps 10 --prompt-tokens 75,150 --chunks 4 --seed 0 "
                       "(timeout 285 s; twice, the second a new process on the cache the first filled)",
            **runs,
            "result": "ready_s: set-up + 3 chunks less 3 steady chunks. Empty cache: the first length 173.9 s, the "
                      "second not finished by 285 s (killed, so its programs never reached the cache). A new process "
                      "on that cache: the cached length 51.3 s, the uncached one 115.4 s. Not exact (bench: "
                      "differs from stock); the chunks after the first three took 96-115 ms in these runs",
            "before": {"measured_at": old["control_measured_at"], **old["control"]}}


previous = {k: old[k] for k in ("commit", "date", "notes", "rows") if k in old}
before = {f"{old['commit']} (session thirty-three: the rows this file held before session thirty-six's)": previous,
          **old["before"]}
(torch_version,) = torch_versions  # both reports from one machine
new = {"gpu": "NVIDIA H200", "torch": torch_version,
       "date": "2026-12-04", "commit": COMMIT, "protocol": old["protocol"],
       "notes": old["notes"].split(" Library at ")[0] + (
           f" Library at {COMMIT} (session thirty-six): as session thirty-five's (torch 2.5 support, a "
           "stream capture_entry took given back) plus node copies through passes.base.copy_node. "
           "Command and output: h200-2026-12-04-session36/callA-node-copy-setup-rows/ (gpu.txt's sha256 "
           "lines checked against the commit). Session thirty-five's 10-step rows at 985136c on another "
           "host (callD-setup-10-steps): 2.91, 2.14, 1.98, 2.00 s, restarted 6.42 s, exact."),
       "rows": rows, "control": control(), "control_measured_at": f"{COMMIT} (callC-compile-control; the control's code unchanged)",
       "reuse_paired": old["reuse_paired"], "before": before}
TARGET.write_text(json.dumps(new, indent=1) + "\n")
print({r["n_timesteps"]: (r["new_prompt_length_ready_s_every_row"], r["cold_start_cached_s"], r["exact"]) for r in rows})
