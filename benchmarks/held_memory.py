"""What an optimized model holds per prompt length it has seen (rules S, CPU).

    OMP_NUM_THREADS=1 python benchmarks/held_memory.py [--n-timesteps 5]

Sets up six prompt lengths in turn on one optimized Token2Wav tail (an empty program
cache in a temporary directory) and prints, after each: the process's resident memory,
the number of objects the garbage collector tracks, and the executables held (one per
length). Then the distinct tensor storage the held executables' graph modules
reference, parameters included, and the resident memory once all executables but the
current one are dropped. One JSON line.
"""

import argparse
import gc
import json
import tempfile

import torch


def rss_mib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return -1


def tensor_storages(exe) -> dict[int, int]:
    held = {}
    for program in exe.programs.values():
        for m in program.run.modules():
            values = list(m._buffers.values()) + list(m._parameters.values()) + list(vars(m).values())
            for t in values:
                if isinstance(t, torch.Tensor):
                    held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return held


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n-timesteps", type=int, default=5)
    args = p.parse_args()
    import cadence_fx
    from cadence_fx.integrations import stepaudio2 as s2
    flow, hift = s2.build_modules(0)
    tail = s2.Token2WavTail(flow, hift, n_timesteps=args.n_timesteps)
    opt = cadence_fx.optimize(tail, rules="S", cache=tempfile.mkdtemp())
    rows = [{"prompt_tokens": None, "rss_mib": rss_mib()}]
    for tokens in (75, 150, 250, 100, 200, 120):
        opt.set_stream_cache(*s2.synthetic_prompt(tokens, seed=tokens, device=torch.device("cpu")))
        gc.collect()
        rows.append({"prompt_tokens": tokens, "rss_mib": rss_mib(), "gc_objects": len(gc.get_objects()),
                     "executables": len(opt._executables)})
    held: dict[int, int] = {}
    for exe in opt._executables.values():
        held.update(tensor_storages(exe))
    current = opt.session.executable
    opt._executables = {k: v for k, v in opt._executables.items() if v is current}
    gc.collect()
    print(json.dumps({"torch": torch.__version__, "n_timesteps": args.n_timesteps, "rows": rows,
                      "held_tensor_mib": sum(held.values()) >> 20,
                      "rss_mib_after_dropping_the_others": rss_mib(), "gc_objects_after": len(gc.get_objects())}))


if __name__ == "__main__":
    main()
