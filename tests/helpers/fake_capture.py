"""CUDA-graph capture and replay faked on the CPU, as a graph behaves for the runtime:
capture (``torch.cuda.graph``, or ``capture_begin``/``capture_end`` as ``pools.recording``
calls them) records the piece and the very tensors it ran on; ``replay`` runs the piece again
on them and writes the results into the outputs capture returned (a graph's static
outputs), with the host sizes of capacity graphs (``capacity_ops.at_dims``) as they were at
capture: a graph bakes what the host computed into its kernels, so a piece that read a host
size replays it at the capture's length whatever length the replaying stream has.
``fake_capture(monkeypatch)`` installs it (and no-op streams) for one test."""

from __future__ import annotations

import contextlib

import torch


class Recorded:
    """Stands for ``torch.cuda.CUDAGraph``."""

    capturing: "Recorded | None" = None

    def capture_begin(self, pool=None, **kwargs):  # pools.recording's way in
        from cadence_fx.passes import capacity_ops
        self.pool = pool  # the memory pool it records into (a test reads which)
        self.dims = capacity_ops._DIMS.get()  # the host sizes a replay sees: the capture's
        Recorded.capturing = self

    def capture_end(self):
        Recorded.capturing = None

    def replay(self):
        from cadence_fx.passes import capacity_ops
        token = capacity_ops._DIMS.set(self.dims)
        try:
            out = self.run(self.piece, self.args)
        finally:
            capacity_ops._DIMS.reset(token)
        for static, new in zip(flat(self.out), flat(out)):
            static.copy_(new)


def flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def fake_capture(monkeypatch, share: bool = True) -> None:
    from cadence_fx.runtime import graphs
    real_run = graphs.run_piece

    def run_piece(piece, args):
        out = real_run(piece, args)
        graph = Recorded.capturing
        if graph is not None:  # inside a capture: what the graph will replay
            graph.piece, graph.args, graph.out, graph.run = piece, list(args), out, real_run
        return out

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, stream=None):
        cuda_graph.capture_begin(pool)
        try:
            yield
        finally:
            cuda_graph.capture_end()

    class Stream:
        device = torch.device("cuda", 0)  # as an ExternalStream's (streams.held reads it); never a real one

        def __init__(self, *a, **k):
            pass

        def wait_stream(self, other):
            pass

    from cadence_fx.runtime import streams
    monkeypatch.setattr(streams, "take", lambda device: Stream())  # a session's own capture stream
    monkeypatch.setattr(graphs, "run_piece", run_piece)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Recorded)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())  # a new pool: a new handle
    monkeypatch.setattr(graphs, "SHARE_CALLS", share)
