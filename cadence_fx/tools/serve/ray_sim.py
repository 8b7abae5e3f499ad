"""``serve-sim --ray-replicas K``: the optimized sessions served through Ray Serve.

The same ticks, budgets, sweeps and exactness check as the in-process run, but every
session is a conversation of a ``cadence_fx.serving.ray`` application: K tail replicas
(``num_gpus=1`` each on CUDA: one per GPU) behind the router, each built from this
command's options (``registry.build_optimized``).  A tick sends every speaker's chunk
through the router before reading any, so each replica batches its share into one
``run_tick``; the tick's wall time includes Ray's hops.  A tick's PCM is hashed per
session exactly as in-process, and the sweep's check replays each session alone on
its own stock model.
"""

from __future__ import annotations

import functools
import os
from typing import Any

APP = "cadence-serve-sim"


class RayStreams:
    """``serve-sim``'s optimized streams, as conversations of a Ray Serve application."""

    name = "optimized"

    def __init__(self, options: dict[str, Any], replicas: int, max_conversations: int, gpus_per_replica: float,
                 per_conversation: bool = False):
        import ray
        import torch
        from ray import serve

        from ...serving import ray as cray
        from .. import registry
        threads = torch.get_num_threads()
        if not ray.is_initialized():
            env = {"OMP_NUM_THREADS": str(threads), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
            if os.environ.get("CADENCE_FX_CACHE_DIR"):
                env["CADENCE_FX_CACHE_DIR"] = os.environ["CADENCE_FX_CACHE_DIR"]
            ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=2**30,  # chunks are small
                     runtime_env={"env_vars": env})
        self._serve = serve
        app = cray.app(functools.partial(registry.build_optimized, options), replicas=replicas,
                       max_conversations=max_conversations, num_gpus=gpus_per_replica, torch_threads=threads)
        self.handle = serve.run(app, name=APP, route_prefix=None)
        self.peak_memory()  # the next reading starts after the models were built, as in-process
        self.opened: list[int] = []
        self.per_conversation = per_conversation

    def open(self, i: int, prompt) -> None:
        self.handle.open.remote(i, [p.cpu() for p in (prompt or ())]).result()
        self.opened.append(i)

    def run_tick(self, work: list[tuple[int, Any, int]]) -> list[bytes]:
        if not self.per_conversation:  # one request a tick (the router's tick)
            work_by_id = {i: {"chunk": _on_cpu(chunk), "seed": seed} for i, chunk, seed in work}
            got = self.handle.tick.remote(work_by_id).result()
            out = [got[i] for i, _, _ in work]
        else:  # one request per conversation, as independent clients send them
            sent = [self.handle.send.remote(i, _on_cpu(chunk), False, seed) for i, chunk, seed in work]
            out = [r.result() for r in sent]
        for (i, _, _), value in zip(work, out):
            if isinstance(value, BaseException):
                raise value
        return out

    def peak_memory(self) -> int | None:
        """The replicas' peak device memory since the last reading, summed (None on the CPU)."""
        peaks = [ld.get("peak_memory_bytes") for ld in self.handle.load.remote(True).result()]
        return None if any(p is None for p in peaks) else sum(peaks)

    def report(self) -> dict[str, Any]:
        loads = self.handle.load.remote().result()
        placement = self.handle.placement.remote().result()
        return {"ray": {"replicas": loads, "sessions_per_replica": {
            ld["replica"]: sum(1 for name in placement.values() if name == ld["replica"]) for ld in loads}}}

    def close(self) -> None:
        for i in self.opened:
            self.handle.close.remote(i).result()
        self.opened.clear()
        self._serve.delete(APP)


def _on_cpu(chunk):
    """A chunk as it travels: token ids as a list, a tensor on the CPU."""
    import torch
    return chunk.cpu() if isinstance(chunk, torch.Tensor) else chunk
