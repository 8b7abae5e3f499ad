"""One executable for every prompt length (``cadence_fx.capacity_executable``), against stock.

The mini Token2Wav's catalog entries, each rewritten once at a capacity of 200 prompt
frames from the symbolic steps a 40-token prompt traced, serve sessions at other prompt
lengths: every chunk against the stock tail (waveform, PCM, every state tensor), through
warm-up, growth, the trim, steady chunks and a flush, two voices interleaved on the one
set of graphs; windows and flushes on graphs of their own, each shape built once for every
voice.
"""

from __future__ import annotations

import pytest
import torch

from cadence_fx.capacity_executable import at_length, capacity_executable
from cadence_fx.compiler import open_session
from cadence_fx.errors import SpecializationRefused
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.integrations.stepaudio2.session import Token2WavSession
from cadence_fx.lockstep import compare_streams
from helpers.marks import cuda
from helpers.mini_token2wav import catalog_steps, mini_tail

CPU = torch.device("cpu")
CAPACITY = 200  # prompt frames: 100 tokens


@pytest.fixture(scope="module")
def shared(t2w_mini):
    """The capacity executable, from the symbolic steps (variant 0) of each catalog entry."""
    opt = t2w_mini.opt
    spk = s2.synthetic_prompt(40, seed=1)[2]
    steps = catalog_steps(opt)
    return opt, capacity_executable(opt.adapter_for(CAPACITY, spk), steps, "probe", programs=opt.programs)


def stream_at(opt, cexe, prompt_tokens: int):
    """A session at ``prompt_tokens`` on the capacity executable, and the stock tail set up alike."""
    tokens, mels, spk = s2.synthetic_prompt(prompt_tokens, seed=prompt_tokens)
    adapter = opt.adapter_for(2 * prompt_tokens, spk)
    session = Token2WavSession(open_session(at_length(cexe, adapter), adapter, tokens, mels, spk), spk,
                               2 * prompt_tokens, CPU)
    stock = mini_tail(n_timesteps=2, seed=0)
    stock.set_stream_cache(tokens, mels, spk)
    return session, stock


def test_two_voices_interleaved_on_one_set_of_graphs_exact(shared):
    opt, cexe = shared
    voices = {p: stream_at(opt, cexe, p) for p in (41, 57)}  # 82 and 114 prompt frames
    chunks = {p: s2.synthetic_chunks(5, seed=p, final_tokens=11) for p in voices}
    routes = {p: [] for p in voices}
    for i in range(6):
        for p, (session, stock) in voices.items():  # one chunk of each voice in turn
            report = compare_streams(stock, session, chunks[p][i:i + 1], CPU, seed=1000 * p + i)
            assert report["exact"], (p, i, report["mismatches"])
            routes[p].append(report["per_chunk"][0]["route"])
    for p in voices:  # warm-up, growth, the trimmed steady entry, the flush: the shared graphs
        assert routes[p] == ["graph entry 0", "graph entry 1"] + ["graph entry 2"] * 3 + [
            "graph specialization entry 2 | token (1, 11), spk (1, 192) | last_chunk"], routes[p]


def test_at_the_capacity_exact_and_past_it_refused(shared):
    opt, cexe = shared
    session, stock = stream_at(opt, cexe, CAPACITY // 2)
    report = compare_streams(stock, session, s2.synthetic_chunks(4, seed=3), CPU, seed=3)
    assert report["exact"] and all(r["route"].startswith("graph") for r in report["per_chunk"]), report["mismatches"]
    spk = s2.synthetic_prompt(40, seed=1)[2]
    with pytest.raises(SpecializationRefused, match="past the capacity"):
        at_length(cexe, opt.adapter_for(CAPACITY + 2, spk))


def test_a_read_after_a_write_that_moves_with_the_length_is_found_at_that_length():
    """The rule-S passes prove the arena's reads come before its writes at the capacity only:
    here the buffer's write sits at frames 4-8 and the old state's read at its last four
    frames, apart at 40 frames and overlapping at 8. ``hazards_at`` (what ``at_length`` runs
    for each entry and length) finds it at 8, not at 40: from the region views alone at the
    stream's host sizes, and by running the step where that walk cannot follow."""
    from cadence_fx import step as meta
    from cadence_fx.capacity_executable import hazards_at
    from cadence_fx.compiler import rewrite_pipeline
    from cadence_fx.passes import capacity as cap
    from cadence_fx.passes.state_rewrite import RegionBinding
    from cadence_fx.passes.trace_symbolic import trace_symbolic
    from cadence_fx.step import StepSignature

    def bind(buffers, dims=None):
        buf = buffers["buf"]

        def step(inputs, state):
            p = state["c"].shape[1]
            buf[:, 4:8].copy_(inputs["x"])  # the buffer's write, at a fixed place
            return {"y": state["c"][:, -4:] * 1}, {"c": buf[:, :p]}  # the old state's tail, read after it
        return step
    f32 = torch.float32
    sym = trace_symbolic(bind, StepSignature(("x",), ("c",), ("y",)), {"p": 12}, {"x": ((1, 4), f32)},
                         {"c": ((1, ("p", 1, 0)), f32)}, {"c": ((1, ("p", 1, 8)), f32, ("buf",))}, CPU)
    arena = torch.zeros(1, 48)
    gm, plan = cap.capacity_form(sym, {"p": 40}, buffers={"c": arena}, keep_values=True)
    gm.meta[meta.EXAMPLE_INPUTS] = [torch.zeros(1, 4), torch.tensor(40)]
    with cap.at_dims({"p": 40}):
        gm, _ = rewrite_pipeline([RegionBinding("c", (1, 48), "float32", 1, 40, 40, True)], "S", "cpu")(gm)
    slots = {"c": ((1, 48), f32)}
    from cadence_fx.passes import aliasing
    from cadence_fx.passes.state_rewrite import check_graph_hazards
    with pytest.MonkeyPatch.context() as mp, cap.at_dims({"p": 40}):  # the passes' own check (EarlyWriteback's):
        mp.setattr(aliasing, "record_accesses", lambda *a, **k: pytest.fail("ran the step"))  # a walk too, which
        bindings = {"c": RegionBinding("c", (1, 48), "float32", 1, 40, 40, True)}  # a background build may take
        assert check_graph_hazards(gm, bindings) == []
    for walk in (True, False):  # the region walk (no run of the step), and the full run it falls back to
        with pytest.MonkeyPatch.context() as mp:
            if walk:  # the walk alone must find it
                mp.setattr(aliasing, "record_accesses", lambda *a, **k: pytest.fail("ran the step"))
            else:
                mp.setattr(aliasing, "record_region_accesses",
                           lambda *a, **k: (_ for _ in ()).throw(aliasing.NeedsFullRun("off")))
            assert hazards_at(gm, slots, CPU, [torch.zeros(1, 4)], {"p": 40}, [torch.tensor(40)]) == []
            problems = hazards_at(gm, slots, CPU, [torch.zeros(1, 4)], {"p": 8}, [torch.tensor(8)])
            assert problems and "reads old state of region 'c'" in problems[0], (walk, problems)


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, s2.VOCAB, (n,), generator=g).tolist()


def test_windows_and_flushes_share_graphs_across_voices_exact(shared):
    """Turn-end windows and flushes on a capacity executable: each shape's graph is built
    once, the first time any voice sends it, and serves every voice after that; every chunk
    exact against the stock tail through two turns of two voices interleaved, a reset
    between them.  A third turn sends its window during the warm-up, which leaves the
    state off the catalog: the chunk after it gets a program of that stream's own, and the
    trim brings the state back to the catalog for the flush."""
    opt, cexe = shared
    before = cexe.stats()["built"]
    window, flush, window7 = (_tokens(14, 5), False), (_tokens(7, 6), True), (_tokens(7, 8), False)
    turns = [[(_tokens(28, 2 + i), False) for i in range(3)] + [window, flush],
             [(_tokens(28, 7 + i), False) for i in range(2)] + [window7, flush],  # the flush's shape, no flag
             [(_tokens(28, 11), False), window, (_tokens(28, 12), False), flush]]
    voices = {p: stream_at(opt, cexe, p) for p in (41, 57)}
    routes = {p: [] for p in voices}
    for t, chunks in enumerate(turns):
        for i in range(len(chunks)):
            for p, (session, stock) in voices.items():
                if t == 2 and p == 57:
                    continue  # the warm-up window: one voice is enough
                report = compare_streams(stock, session, chunks[i:i + 1], CPU, seed=100 * p + 10 * t + i)
                assert report["exact"], (p, t, i, report["mismatches"])
                routes[p].append(report["per_chunk"][0]["route"])
        for p, (session, stock) in voices.items():
            session.reset()
            stock.set_stream_cache(*s2.synthetic_prompt(p, seed=p))
    w = "graph specialization entry 2 | token (1, 14), spk (1, 192)"
    w7 = "graph specialization entry 2 | token (1, 7), spk (1, 192)"
    f = "graph specialization entry 2 | token (1, 7), spk (1, 192) | last_chunk"
    for p in voices:
        assert routes[p][:9] == ["graph entry 0", "graph entry 1", "graph entry 2", w, f,
                                 "graph entry 0", "graph entry 1", w7, f], routes[p]
    stats = cexe.stats()
    assert stats["refused"] == {}, stats
    assert {r.removeprefix("graph specialization ") for r in (w, w7, f)} <= set(stats["held"])
    third = routes[41][9:]
    assert third[:2] == ["graph entry 0", "graph specialization entry 1 | token (1, 14), spk (1, 192)"], third
    assert third[2].startswith("graph specialization off-catalog") and third[3] == f, third  # its own; the trim
    held = voices[41][0].stats()["specializations"]["held"]
    assert sum(v["how"].startswith("the capacity's shared graph") for v in held.values()) == 4, held
    assert stats["built"] - before == 4  # the turns' three shapes, each once for both voices; the warm-up window's


def test_a_shape_no_shared_graph_serves_runs_the_streams_own_program_or_eagerly(shared, monkeypatch):
    """Without a program store no shared graph can be built: the window runs a program
    traced for that stream alone (on the capacity's arena), the reason kept; where that
    fails too, the exact eager path, counted with both reasons.  The stream goes on on its
    graphs either way."""
    import collections
    import dataclasses
    from cadence_fx import capacity_executable as ce, capacity_prepare as cp
    from cadence_fx.errors import TraceError
    opt, cexe = shared
    bare = dataclasses.replace(cexe, programs=None, shared=collections.OrderedDict())
    chunks = [(_tokens(28, 2 + i), False) for i in range(3)] + [(_tokens(14, 5), False), (_tokens(28, 4), False)]
    session, stock = stream_at(opt, bare, 41)
    report = compare_streams(stock, session, chunks, CPU, seed=7)
    assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[3] == "graph specialization entry 2 | token (1, 14), spk (1, 192)" and routes[4] == "graph entry 2"
    (how,) = [v["how"] for v in session.stats()["specializations"]["held"].values()]
    assert how.startswith("this stream's own (traced)") and "no program store" in how, how
    assert bare.stats()["refused"] and not bare.stats()["held"]

    real = ce._variant_builder

    def failing(*args, **kwargs):
        real(*args, **kwargs)

        def build(key, inputs):
            raise TraceError("no trace here (the test's)")
        return build
    monkeypatch.setattr(ce, "_variant_builder", failing)
    session, stock = stream_at(opt, bare, 41)
    report = compare_streams(stock, session, chunks, CPU, seed=7)
    assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[3].startswith("fallback") and routes[4] == "graph entry 2", routes
    (why,) = session.stats()["specializations"]["refused"].values()
    assert "no program store" in why and "nor a program of this stream's own" in why and "the test's" in why, why


def test_a_flush_of_another_branch_class_runs_a_program_of_the_streams_own(shared):
    """The mini's 7-token flush has a branch class of its own in the prompt: its shared graph
    (built for a voice of 41 tokens, at the capacity's class) refuses 45 tokens (90 frames;
    one voice length in 7).  That voice's flush is traced at its own shapes onto the
    capacity's arena, every chunk exact; the shared graph goes on serving voices of its
    class, and a check of it for the other class is no quick one (a build: in the
    background while builds go there)."""
    from cadence_fx.runtime.variants import VariantKey
    opt, cexe = shared
    chunks = [(_tokens(28, 20 + i), False) for i in range(3)] + [(_tokens(7, 23), True)]
    routes, held, keys = {}, {}, {}
    for p in (41, 45):
        n_steps = len(opt.programs)  # (45's: after 41's flush traced the shape's symbolic step, if none was)
        session, stock = stream_at(opt, cexe, p)
        report = compare_streams(stock, session, chunks, CPU, seed=p)
        assert report["exact"], (p, report["mismatches"])
        routes[p] = [c["route"] for c in report["per_chunk"]]
        variants = session.session.executable.variants
        (keys[p],) = [k for k in variants._held if isinstance(k, VariantKey)]
        held[p] = session.stats()["specializations"]["held"]
    f = "graph specialization entry 2 | token (1, 7), spk (1, 192) | last_chunk"
    assert routes[41][3] == f and routes[45][3] == f, routes
    (how41,), (how45,) = [v["how"] for v in held[41].values()], [v["how"] for v in held[45].values()]
    assert how41.startswith("the capacity's shared graph"), how41
    assert how45.startswith("this stream's own (") and "does not serve {'prompt_frames': 90}" in how45, how45
    assert how45.startswith("this stream's own (traced)")  # at its exact shapes: no symbolic variant tried
    assert len(opt.programs) == n_steps  # no symbolic variant traced for 45's flush
    assert "entry 2 | token (1, 7), spk (1, 192) | last_chunk" in cexe.stats()["held"]
    # a fresh stream of each class: the held shared graph is a quick check for 41's, not for 45's
    quick = {p: at_length(cexe, opt.adapter_for(2 * p, s2.synthetic_prompt(p, seed=p)[2])).variants.quick(keys[p])
             for p in (41, 45)}
    assert quick == {41: True, 45: False}, quick


def test_the_drop_in_runs_new_voices_on_capacity_graphs_exact(t2w_mini, shared):
    """``optimize(..., capacity=...)``: voices up to the capacity run its graphs (no
    executable of their own length is compiled), a flush on its shared graph; a voice in
    the other branch class of the model's code (76 frames: ``2 * (s // 2) + 49`` divides by
    25) on the graphs of that class's largest length up to the capacity (176 frames); a
    voice past the capacity is built for its own length, and ``capacity_stats`` says why.
    The first voice's flush builds its shared graph in the background (``background=True``:
    its hazard check walks the region views, it runs nothing of the step); the next voice's
    flush runs it at once (its own check of a held graph is quick). Every chunk exact
    against the stock tail."""
    import cadence_fx
    from cadence_fx.runtime.variants import BUILDING
    opt = cadence_fx.optimize(t2w_mini.tail, capacity=(CAPACITY,), off_catalog="specialize", background=True)
    _, cexe = shared  # the capacity's graphs (the drop-in's own build of them: test_traffic's capacity test)
    opt._capacities[(CAPACITY, (1, 192), torch.float32, False)] = cexe
    before = cexe.stats()["built"]
    # a 6-token flush: a 7-token one has a branch class of its own in the prompt (one length in 7,
    # 76 frames among them), which its shared graph refuses (a trace of that voice's own: tested above)
    chunks = [(_tokens(28, 2 + i), False) for i in range(3)] + [(_tokens(6, 6), True)]
    where = {}
    for p in (41, 57, 38, 113):  # 82, 114, 76 and 226 prompt frames
        prompt = s2.synthetic_prompt(p, seed=p)
        session = opt.open_session(*prompt)
        t2w_mini.tail.set_stream_cache(*prompt)
        mine = chunks if p != 113 else chunks[:1]  # past the capacity: the per-length path, tested elsewhere
        report = compare_streams(t2w_mini.tail, session, mine, CPU, seed=p)
        assert report["exact"], (p, report["mismatches"])
        routes = [c["route"] for c in report["per_chunk"]]
        if p == 41:  # background builds: the flush's shared graph builds on the worker, its chunk eager
            assert all(r.startswith("graph") for r in routes[:3]) and BUILDING in routes[3], routes
            assert opt.wait_for_builds(300)
        else:  # 57, background still on: its check of the held graph is quick, made on its own thread
            assert all(r.startswith("graph") for r in routes), (p, routes)
        if p == 57:
            opt.set_background(False)  # (the class capacity's flush, and the length past it: built here)
        where[p] = session.session.executable.notes.get("capacity")
        session.close()
    assert where == {41: {"prompt_frames": CAPACITY}, 57: {"prompt_frames": CAPACITY},
                     38: {"prompt_frames": 176}, 113: None}, where
    stats = opt.capacity_stats()
    assert set(stats["refused"]) == {226} and "past the largest capacity" in stats["refused"][226], stats
    shared = stats["built"][f"{CAPACITY} mel frames"]
    assert shared["built"] - before == 1 and not shared["refused"], shared  # the flush, once for both voices
    assert "entry 2 | token (1, 6), spk (1, 192) | last_chunk" in shared["held"], shared
    assert stats["built"]["176 mel frames"]["built"] == 1  # the class's own flush graph
    for cexe in opt._capacities.values():  # the device's probe decided each attention call (the CPU's: exact)
        assert {cplan.attention for _, cplan, _ in cexe.graphs.values()} == {"probed"}


def test_a_new_process_loads_the_capacity_graphs_and_runs_its_own_weights_exactly(shared):
    """The capacity's graphs on disk (``capacity_build``): a model of other weights (seed 1)
    with a program store of its own on the same cache directory, as a restarted process
    has, loads the catalog's graphs and a window's and a flush's that the shared capacity
    built and stored, building none; a voice on them (warm-up, growth, the trim, steady
    chunks, the window, the flush) is exact against ITS OWN stock tail on every chunk: the
    weights are bound by path to the live model, and the folded constants computed again."""
    import cadence_fx
    from cadence_fx import capacity_prepare as cp
    opt, cexe = shared
    shapes = [(cp.chunk_inputs(cexe.adapter, {"chunk_tokens": 10}), {}),
              (cp.chunk_inputs(cexe.adapter, {"chunk_tokens": 5}), {"last_chunk": True})]
    cp.prepare(cexe, shapes)  # built and stored here (or held, stored by an earlier build)
    tail = mini_tail(n_timesteps=2, seed=1)
    other = cadence_fx.optimize(tail, cache=opt.programs.disk.directory)
    spk = s2.synthetic_prompt(40, seed=1)[2]
    mine = capacity_executable(other.adapter_for(CAPACITY, spk), None, "probe", programs=other.programs)
    assert mine.loaded == 3, other.programs.disk.counts
    for i, built in cexe.checked.items():  # the loaded rule-S graph is the built one, and lowers as it does
        assert _graph_text(mine.checked[i]) == _graph_text(built), i
        lowered = _lowered_text(built, cexe)
        assert len(lowered) > 2 and _lowered_text(mine.checked[i], mine) == lowered, i  # (pieces and islands)
    got = cp.prepare(mine, shapes)
    assert all(h.startswith("loaded from disk in ") for h in got.values()), got
    assert mine.stats()["loaded_from_disk"] == 5 and other.programs.disk.counts["writes"] == 0
    tokens, mels, spk = s2.synthetic_prompt(57, seed=57)
    adapter = other.adapter_for(114, spk)
    session = Token2WavSession(open_session(at_length(mine, adapter), adapter, tokens, mels, spk), spk, 114, CPU)
    tail.set_stream_cache(tokens, mels, spk)
    chunks = [(_tokens(28, 60 + i), False) for i in range(4)] + [(_tokens(10, 64), False), (_tokens(5, 65), True)]
    report = compare_streams(tail, session, chunks, CPU, seed=57)
    assert report["exact"], report["mismatches"]
    routes = [r["route"] for r in report["per_chunk"]]
    assert routes == ["graph entry 0", "graph entry 1", "graph entry 2", "graph entry 2",
                      "graph specialization entry 2 | token (1, 10), spk (1, 192)",
                      "graph specialization entry 2 | token (1, 5), spk (1, 192) | last_chunk"], routes
    assert mine.stats()["built"] == 2 and mine.stats()["loaded_from_disk"] == 5  # nothing built on a chunk


def _graph_text(gm) -> list:
    """``gm``'s nodes with what the passes after the rewrite read of their meta (values as layouts)."""
    from cadence_fx import capacity_build as cb
    from cadence_fx.programs.serialize import _encode_meta
    return [str(gm.graph)] + [(n.name, repr(_encode_meta(n, cb._KEYS))) for n in gm.graph.nodes]


def _lowered_text(gm, cexe) -> list:
    """``gm`` lowered for replay as a capacity with shared captures lowers it (on the CPU: the
    pieces split by their ops alone), printed with every piece."""
    from cadence_fx.compiler import lowered_copy
    out = lowered_copy(gm, "SRc", "cpu", cexe.adapter.step_boundary(), length_free=True)
    return [str(out.graph)] + [str(getattr(m, "piece", m).graph) for _, m in out.named_children()
                               if hasattr(getattr(m, "piece", m), "graph")]


def test_capacity_graphs_partition_into_one_piece_around_their_host_sizes(shared):
    """What rules R capture of each capacity graph (``preview_partition``: the op-level
    verdicts): every capacity op is capturable, and the only eager nodes are the dims' check
    and the host sizes, hoisted to the graph's head in one island, so what follows them is
    one piece."""
    from cadence_fx.compiler import preview_partition
    opt, cexe = shared
    exe = at_length(cexe, opt.adapter_for(82, s2.synthetic_prompt(41, seed=41)[2]))
    records = preview_partition(exe)
    assert sorted(records) == sorted(cexe.graphs)
    for idx, record in records.items():
        eager = [name for name, capturable, _ in record.regions if not capturable]
        assert len(eager) == 1 and len(record.regions) <= 3, (idx, record.regions)
        assert {v.node.rstrip("_0123456789") for v in record.islands} == {"within", "host_size"}, (idx, record)


def test_length_free_pieces_leave_every_length_dependent_node_eager(shared):
    """``Partition(length_free=True)`` (captures shared by voices, next): each capacity graph's
    host sizes, what reads them, the plan's exact nodes and the pads of their values are eager
    islands; every piece's nodes run at the capacity on device lengths (the same kernels at
    every length), and the islands are exactly ``length_bound``'s (nothing else is made eager)."""
    import operator
    from cadence_fx.compiler import preview_partition
    from cadence_fx.passes.capacity_plan import _MODE, EXACT
    from cadence_fx.passes.partition import length_bound
    opt, cexe = shared
    exe = at_length(cexe, opt.adapter_for(82, s2.synthetic_prompt(41, seed=41)[2]))
    plain, free = preview_partition(exe), preview_partition(exe, length_free=True)
    for idx, record in free.items():
        gm = exe.programs[idx].run
        bound = {n.name for n in length_bound(gm)}
        assert bound and any(n.meta.get(_MODE) == EXACT for n in gm.graph.nodes), idx
        islands = {v.node for v in record.islands}
        assert islands == bound | {v.node for v in plain[idx].islands}, (idx, islands ^ bound)
        assert all(v.reason.endswith("(length-free pieces)") for v in record.islands if v.node in bound - {
            w.node for w in plain[idx].islands})
        assert len(record.regions) > len(plain[idx].regions), (idx, record.regions)
        exact = {n.name for n in gm.graph.nodes if n.meta.get(_MODE) == EXACT and n.target is not operator.getitem}
        assert exact <= islands, (idx, exact - islands)


def test_prepare_builds_window_and_flush_graphs_before_any_voice(t2w_mini, shared, monkeypatch):
    """``prepare_capacity`` (a server's start): the capacity's shared graphs of each window and
    flush length asked for, at the steady state; the catalog's own chunk is not built again.
    A voice's window and flush of those lengths then build nothing, every chunk exact; a
    second call finds them held.  A prompt length asked for (``prompt_tokens``) that the
    capacity's catalog refuses (76 frames: the 1-in-25 class) gets its class's capacity (176
    frames) built and its shapes prepared there too: that voice's set-up traces nothing and
    its window and flush build nothing, exact.  Bad lengths and a model without a capacity:
    clear errors."""
    import cadence_fx
    from cadence_fx.programs import entry as programs_entry
    opt = cadence_fx.optimize(t2w_mini.tail, capacity=(CAPACITY,), off_catalog="specialize")
    _, cexe = shared
    opt._capacities[(CAPACITY, (1, 192), torch.float32, False)] = cexe
    window, own, flush = ("entry 2 | token (1, 9), spk (1, 192)", "entry 2 | token (1, 28), spk (1, 192)",
                          "entry 2 | token (1, 4), spk (1, 192) | last_chunk")
    before = cexe.stats()["built"]
    everything = opt.prepare_capacity(windows=[9, 28], flushes=[4], prompt_tokens=[38, 43])
    got = everything[f"{CAPACITY} mel frames"]
    assert set(got) == {window, own, flush} and got[own] == "the catalog's own chunk", got
    made = ("built in ", "loaded from disk in ")  # (another test's process may have stored the same graph)
    assert got[window].startswith(made) and got[flush].startswith(made), got
    assert cexe.stats()["built"] == before + 2
    assert everything["classes"] == {f"{CAPACITY} mel frames": {"76 mel frames": "on 176 mel frames"}}, everything
    theirs = everything["176 mel frames"]  # the class's capacity, its shapes prepared as the capacity's
    assert theirs[own] == "the catalog's own chunk" and theirs[window].startswith(made) and \
        theirs[flush].startswith(made), theirs
    assert opt._prompt_frames(None) == list(range(4, CAPACITY + 1, 2))  # default: every length upstream streams
    for bad in ([1], [500], [2.0], [True]):
        with pytest.raises(cadence_fx.CadenceError, match="prompt_tokens must be"):
            opt.prepare_capacity(windows=[9], flushes=[], prompt_tokens=bad)
    prompt = s2.synthetic_prompt(43, seed=43)
    session = opt.open_session(*prompt)
    t2w_mini.tail.set_stream_cache(*prompt)
    chunks = [(_tokens(28, 60 + i), False) for i in range(3)] + [(_tokens(9, 63), False), (_tokens(4, 64), True)]
    report = compare_streams(t2w_mini.tail, session, chunks, CPU, seed=43)
    assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[3:] == [f"graph specialization {window}", f"graph specialization {flush}"], routes
    assert cexe.stats()["built"] == before + 2  # the voice built nothing
    session.close()
    cls = next(c for k, c in opt._capacities.items() if k[0] == 176)
    held = cls.stats()["built"]

    def no_trace(*args, **kwargs):
        raise AssertionError("a voice of a prepared class traced a program")
    with monkeypatch.context() as m:  # the class's voice: its steps looked up, its shapes held
        m.setattr(programs_entry, "_trace", no_trace)
        prompt = s2.synthetic_prompt(38, seed=38)
        session = opt.open_session(*prompt)
        t2w_mini.tail.set_stream_cache(*prompt)
        report = compare_streams(t2w_mini.tail, session, chunks, CPU, seed=38)
    assert report["exact"], report["mismatches"]
    assert session.session.executable.notes.get("capacity") == {"prompt_frames": 176}
    routes = [c["route"] for c in report["per_chunk"]]
    assert routes[3:] == [f"graph specialization {window}", f"graph specialization {flush}"], routes
    assert cls.stats()["built"] == held  # the class's voice built nothing either
    session.close()
    all_again = opt.prepare_capacity(windows=[9], flushes=[4])  # every prompt length: the class's 4, held
    assert all_again["classes"] == {f"{CAPACITY} mel frames": {f"{f} mel frames": "on 176 mel frames"
                                                               for f in (26, 76, 126, 176)}}, all_again["classes"]
    assert all(h.startswith("held") for h in all_again["176 mel frames"].values()), all_again["176 mel frames"]
    first = opt.prepare_capacity(windows=[9], flushes=[4], classes_first=True)  # the order of the work only
    order = [list(d).index(f"{c} mel frames") for d in (first, all_again) for c in (176, CAPACITY)]
    assert first == all_again and order[0] < order[1] and order[2] > order[3], (list(first), list(all_again))
    with pytest.raises(cadence_fx.CadenceError, match="classes_first=1 must be True or False"):
        opt.prepare_capacity(windows=[9], flushes=[4], classes_first=1)
    again = all_again[f"{CAPACITY} mel frames"]
    # held; with one symbolic dim, the lengths up to the capacity each graph serves, of the
    # catalog's: the even ones 4..200 but the catalog's own 1-in-25 class (26, 76, 126, 176)
    assert again[window] == "held; serves 95 of 95 lengths" and again[flush].startswith("held; serves "), again
    from cadence_fx import capacity_prepare as cp
    lengths = cp.catalog_lengths(cexe)
    assert len(lengths) == 95 and {26, 76, 126, 176, 201}.isdisjoint(d["prompt_frames"] for d in lengths)
    n = int(again[flush].split()[2])  # each length it serves is one a stream's quick check takes, and no other
    from cadence_fx import capacity_executable as ce
    from cadence_fx.runtime.variants import VariantKey
    shape = next(k for k in cexe.shared if k[2] and k[1][0][1] == (1, 4))
    quick = [at_length(cexe, opt.adapter_for(f, prompt[2])).variants.quick(VariantKey(shape[0], (), *shape[1:]))
             for f in (84, 86, 88, 90)]
    assert quick == [cp.served(cexe.shared[shape], [{"prompt_frames": f}]) == 1 for f in (84, 86, 88, 90)], quick
    from cadence_fx.passes.capacity import check_dims

    def serves(plan, sym, dims) -> bool:  # sympy's reading of the guards, as every stream's check makes it
        try:
            check_dims(plan, sym, dims)
            return True
        except SpecializationRefused:
            return False
    counts = {k: (cp.served(g, lengths), sum(serves(g.plan, g.sym, d) for d in lengths)) for k, g in cexe.shared.items()
              if isinstance(g, ce.SharedGraph)}
    assert counts[shape][0] == n <= 95 and all(a == b for a, b in counts.values()), counts
    assert lengths == [{"prompt_frames": v} for v in range(1, CAPACITY + 1)
                       if all(serves(cplan, sym, {"prompt_frames": v}) for _, cplan, sym in cexe.graphs.values())]
    said = []
    monkeypatch.setattr(cp, "served", lambda shared, lengths: 1)  # a capacity in a rare class of the shape's code
    got = cp.prepare(cexe, [(cp.chunk_inputs(cexe.adapter, {"chunk_tokens": 9}), {})], say=said.append)
    assert got == {window: "held; serves 1 of 95 lengths"} and any("serves 1 of the 95 lengths" in s for s in said), said
    for bad in ([0], [2.5], [True]):
        with pytest.raises(cadence_fx.CadenceError, match="token lengths"):
            opt.prepare_capacity(windows=bad)
    with pytest.raises(cadence_fx.CadenceError, match="no capacity is set"):
        cadence_fx.optimize(t2w_mini.tail, off_catalog="specialize").prepare_capacity()


def test_misuse_of_the_capacity_apis_is_a_clear_error(t2w_mini, shared, monkeypatch):
    """Replaying rules on a CPU model, a dim no input has, an entry past the catalog, a speaker
    dtype no voice brings: each a clear error.  And on the quick path (a held shared graph
    that serves the length, then refused by the hazard check at it) a chunk never waits for a
    trace of the stream's own while builds go to the background: refused, eager."""
    import cadence_fx
    from cadence_fx import capacity_executable as ce, capacity_prepare as cp
    from cadence_fx.runtime.variants import VariantKey, VariantRefused
    opt, cexe = shared
    spk = s2.synthetic_prompt(41, seed=41)[2]
    with pytest.raises(cadence_fx.RulesError, match="need a CUDA device"):
        capacity_executable(opt.adapter_for(CAPACITY, spk), {}, rules="SRc")
    with pytest.raises(cadence_fx.CadenceError, match="no input axis"):
        cp.chunk_inputs(cexe.adapter, {"prompt_frames": 9})
    with pytest.raises(cadence_fx.CadenceError, match="at least 1"):
        cp.chunk_inputs(cexe.adapter, {"chunk_tokens": 0})
    with pytest.raises(cadence_fx.CadenceError, match="no catalog entry"):
        cp.prepare(cexe, [], entry=len(cexe.plan.catalog))
    drop = cadence_fx.optimize(t2w_mini.tail, capacity=(CAPACITY,))
    with pytest.raises(cadence_fx.CadenceError, match="spk_dtype"):
        drop.prepare_capacity(spk_dtype=torch.float64)
    inputs = cp.chunk_inputs(cexe.adapter, {"chunk_tokens": 9})
    assert cp.prepare(cexe, [(inputs, {})])  # held, or built now
    exe = at_length(cexe, opt.adapter_for(82, spk))
    key = VariantKey.of(len(cexe.plan.catalog) - 1, {}, (), inputs, cexe.signature.inputs, {})
    assert exe.variants.quick(key)
    monkeypatch.setattr(ce, "_hazards", lambda *args: ["a read after a write (the test's)"])
    exe.variants.background = object()  # builds go to the background: the quick path is the chunk's thread
    with pytest.raises(VariantRefused, match="not traced on a chunk while builds go to the background"):
        exe.variants._build(key, inputs)


def test_capacity_options_are_checked():
    import cadence_fx
    from helpers.mini_token2wav import mini_tail
    tail = mini_tail()
    for bad in (0, -5, (), (100, "x"), True, 1.5):
        with pytest.raises(cadence_fx.CadenceError, match="capacity="):
            cadence_fx.optimize(tail, capacity=bad)
    from cadence_fx.integrations.stepaudio2.dropin import check_capacity
    assert check_capacity((512, 256, 256), "S") == (256, 512) and check_capacity(None, "SRc") is None
    assert check_capacity(256, "SRc") == (256,) and check_capacity(256, "SR") == (256,)
    for rules in ("R", "Rc"):  # stock's own state: no arena to lay out at the capacity
        with pytest.raises(cadence_fx.RulesError, match="needs rule S"):
            check_capacity(256, rules)
    from cadence_fx.capacity_executable import capacity_executable
    with pytest.raises(cadence_fx.RulesError, match="need S"):
        capacity_executable(object(), {}, rules="Rc")


def test_the_hazard_check_runs_at_each_streams_own_length(shared, monkeypatch):
    """``at_length`` checks each entry, and each shared off-catalog graph a stream takes, at
    that stream's dims and device lengths, not the capacity's (where the passes proved it)."""
    import cadence_fx.capacity_executable as ce
    opt, cexe = shared
    calls = []
    real = ce.hazards_at

    def spy(gm, slots, device, inputs, dims, lengths, scratch=None, full_run=True):
        calls.append((dict(dims), [int(x) for x in lengths]))
        return real(gm, slots, device, inputs, dims, lengths, scratch, full_run)
    monkeypatch.setattr(ce, "hazards_at", spy)
    session, stock = stream_at(opt, cexe, 43)  # 86 frames
    assert calls == [({"prompt_frames": 86}, [86])] * 3, calls  # the catalog's three entries
    chunks = [(_tokens(28, 2 + i), False) for i in range(3)] + [(_tokens(11, 4), True)]
    report = compare_streams(stock, session, chunks, CPU, seed=43)
    assert report["exact"] and report["per_chunk"][3]["route"].startswith("graph specialization"), report["per_chunk"]
    assert calls[3:] == [({"prompt_frames": 86}, [86])], calls  # the flush's shared graph, at this stream



def test_idle_time_checks_the_held_shared_graphs_so_a_voices_first_window_does_not(shared, monkeypatch):
    """``session.idle()`` makes a stream's hazard check of each shared graph held that serves
    its length (``_StreamBuilder.work_ahead``): its first window and flush of those shapes run
    the shared graphs with no walk on the chunk, exact.  What idle found is what the chunk
    acts on (a problem found ahead refuses the graph there: a program of the stream's own,
    the problem its reason; never the shared graph); a graph
    of another branch class at the stream's length gets the stream's own program of that
    shape, built there where the time left holds it; ``idle(0)`` does nothing."""
    import cadence_fx.capacity_executable as ce
    opt, cexe = shared
    window, flush = (_tokens(14, 5), False), (_tokens(7, 6), True)
    steady = [(_tokens(28, 30 + i), False) for i in range(3)]
    session, stock = stream_at(opt, cexe, 41)  # the shapes' shared graphs, if no test built them yet
    assert compare_streams(stock, session, steady + [window, flush], CPU, seed=5)["exact"]
    held = ["entry 2 | token (1, 14), spk (1, 192)", "entry 2 | token (1, 7), spk (1, 192) | last_chunk"]
    assert set(held) <= set(cexe.stats()["held"])
    calls = []
    real = ce.hazards_at

    def spy(*args, **kwargs):
        calls.append(dict(args[4]))
        return real(*args, **kwargs)
    monkeypatch.setattr(ce, "hazards_at", spy)
    session, stock = stream_at(opt, cexe, 57)  # 114 frames: a length no stream checked them at
    calls.clear()
    assert session.idle(0) == [] and calls == []
    report = compare_streams(stock, session, steady, CPU, seed=6)
    assert report["exact"] and calls == [], calls
    variants = session.session.executable.variants
    assert session.idle() == [] and calls and set(map(str, calls)) == {"{'prompt_frames': 114}"}, calls
    ahead = variants.stats()["ahead"]
    assert ahead["checked"] == len(calls) >= 2 and ahead["taken_by_chunks"] == 0, ahead
    calls.clear()
    report = compare_streams(stock, session, [window, flush], CPU, seed=7)
    assert report["exact"], report["mismatches"]
    assert [c["route"] for c in report["per_chunk"]] == ["graph specialization " + k for k in held]
    assert calls == [] and variants.stats()["ahead"]["taken_by_chunks"] == 2, (calls, variants.stats()["ahead"])
    assert session.idle() == [] and calls == []  # each checked once

    # a problem found ahead is the chunk's reason to run eagerly (never a replay it refused)
    session, stock = stream_at(opt, cexe, 61)
    monkeypatch.setattr(ce, "hazards_at", lambda *a, **k: ["a read after a write (the test's)"])
    session.idle()
    monkeypatch.setattr(ce, "hazards_at", spy)
    report = compare_streams(stock, session, steady + [window], CPU, seed=8)
    assert report["exact"] and report["per_chunk"][3]["route"] == "graph specialization " + held[0]
    (how,) = [v["how"] for v in session.stats()["specializations"]["held"].values()]
    assert how.startswith("this stream's own (") and "the test's" in how, how

    # another branch class: 45 tokens' flush of 7 (see the test above) is of the stream's own
    # program, built in idle time where the time left holds such a build (not in 1 ms), at the
    # steady entry's state: the chunk finds it held and builds nothing
    session, stock = stream_at(opt, cexe, 45)
    variants = session.session.executable.variants
    for _ in range(50):  # each idle(1 ms) does one item at least: the flush's shape is found, not built
        assert session.idle(0.001) == [] and variants.stats()["ahead"]["built"] == 0, variants.stats()["ahead"]
        if variants.stats()["ahead"]["own_waiting"]:
            break
    assert variants.stats()["ahead"]["own_waiting"] >= 1 and not variants.stats()["held"], variants.stats()

    def no_background(label, fn):  # idle time is the foreground: its build never goes to the worker
        raise AssertionError(f"idle time's build of {label} went to the background")
    variants.background = no_background  # (as with background=True: a chunk would not trace its own)
    session.idle()
    ahead = variants.stats()["ahead"]
    assert ahead["built"] >= 1 and ahead["own_waiting"] == 0, ahead
    own = "entry 2 | token (1, 7), spk (1, 192) | last_chunk"
    assert variants.stats()["held"][own]["how"].startswith("this stream's own (traced)"), variants.stats()["held"]
    assert variants.stats()["held"][own]["how"].endswith("ahead in idle time"), variants.stats()["held"]
    built = variants.built
    report = compare_streams(stock, session, steady + [flush], CPU, seed=9)
    assert report["exact"] and report["per_chunk"][3]["route"] == "graph specialization " + own, report["per_chunk"]
    assert variants.built == built, "the flush's chunk built again what idle time built"
    variants.background = None
    assert session.idle() == []  # nothing left to do


def test_the_hazard_walks_plan_logs_what_the_whole_walk_logs(shared):
    """``hazards_at`` walks a capacity graph once per stream length through its ``WalkPlan``
    (the nodes that may take region memory, found once): at every length the log is the
    whole walk's, access for access, and the plan leaves most nodes out."""
    from cadence_fx import step as meta
    from cadence_fx.passes import aliasing, capacity_ops
    _, cexe = shared
    moved = []
    for index, gm in sorted(cexe.checked.items()):
        plan = aliasing.WalkPlan(gm)
        assert 0 < len(plan.nodes) < len(gm.graph.nodes) // 2, (index, len(plan.nodes))
        regions = {n: torch.empty(cexe.plan.layout.slot(n).shape, dtype=getattr(torch, cexe.plan.layout.slot(n).dtype))
                   for n in meta.arena_inputs(gm)}
        logs = []
        for frames in (CAPACITY, 86, 114):
            with capacity_ops.at_dims({"prompt_frames": frames}):
                sizes = capacity_ops.host_sizes(gm)
                whole = aliasing.record_region_accesses(gm, regions, sizes)
                assert aliasing.record_region_accesses(gm, regions, sizes, plan) == whole, (index, frames)
            logs.append(whole)
        moved.append(logs[0] != logs[1])
    assert any(moved), moved  # some entry's accesses move with the length: the walk is per length


def test_a_build_that_needs_the_foreground_is_not_remembered_as_refused(shared, monkeypatch):
    """A shape's build on a background thread that needs the foreground (a trace, a full run:
    ``NeedsForeground``, wrapped by a pass as a ``PassError``) leaves nothing behind: the
    next stream (or the foreground) builds it; a real refusal is remembered for every stream."""
    import collections
    import dataclasses
    import cadence_fx.capacity_executable as ce
    from cadence_fx.errors import NeedsForeground, PassError
    from cadence_fx.runtime.variants import VariantKey, VariantRefused
    opt, cexe = shared
    bare = dataclasses.replace(cexe, shared=collections.OrderedDict())
    key = VariantKey(2, (), (("token", (1, 9), "int32", (9, 1)),), ())

    def needs_foreground(*a):
        try:
            raise NeedsForeground("a full run on a build's thread")
        except NeedsForeground as e:
            raise PassError("EarlyWriteback failed") from e
    monkeypatch.setattr(ce, "_build_shared", needs_foreground)
    with pytest.raises(NeedsForeground):
        ce.shared_variant(bare, key, {})
    assert not bare.shared
    monkeypatch.setattr(ce, "_build_shared", lambda *a: (_ for _ in ()).throw(PassError("a hazard")))
    with pytest.raises(VariantRefused, match="a hazard"):
        ce.shared_variant(bare, key, {})
    with pytest.raises(VariantRefused, match="a hazard"):  # remembered: not built again
        ce.shared_variant(bare, key, {})
    assert list(bare.shared.values()) == [f"no capacity graph for {ce._label(ce._shape(key))}: PassError: a hazard"]
    # while another shape builds: a shape held (or refused) answers at once, a new one is busy
    from cadence_fx.runtime.variants import VariantBusy, Variants
    other = VariantKey(2, (), (("token", (1, 10), "int32", (10, 1)),), ())
    with bare._building:
        with pytest.raises(VariantRefused, match="a hazard"):
            ce.shared_variant(bare, key, {})
        with pytest.raises(VariantBusy):
            ce.shared_variant(bare, other, {})
    variants = Variants(lambda k, i: ce.shared_variant(bare, k, i), "specialize")
    with bare._building:  # the stream's chunk runs eagerly, and nothing is remembered for the shape
        program, why = variants.get(other, {})
    assert program is None and "another stream is building" in why and variants.stats()["refused"] == {}


def test_a_build_out_of_memory_is_remembered_for_a_while_then_tried_again(shared, monkeypatch):
    """Out of memory in a shape's build (the GPU suite of 2026-12-06: a pass's run, wrapped as a
    ``PassError``) is a refusal for ``OOM_RETRY_S``, then the shape is built again (memory comes
    back; a refusal for good would leave its chunks off the graph for the process's life)."""
    import collections
    import dataclasses
    import cadence_fx.capacity_executable as ce
    from cadence_fx.errors import PassError
    from cadence_fx.runtime.variants import RefusedForNow, VariantKey, VariantRefused
    opt, cexe = shared
    bare = dataclasses.replace(cexe, shared=collections.OrderedDict())
    key = VariantKey(2, (), (("token", (1, 9), "int32", (9, 1)),), ())
    now, builds = [1000.0], []
    monkeypatch.setattr(ce.time, "monotonic", lambda: now[0])

    def out_of_memory(*a):
        builds.append(now[0])
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 396.00 MiB")
        except torch.OutOfMemoryError as e:
            raise PassError("EarlyWriteback failed") from e
    monkeypatch.setattr(ce, "_build_shared", out_of_memory)
    for _ in range(2):  # the second within the time: remembered, not built again (the streams' Variants
        with pytest.raises(RefusedForNow, match="EarlyWriteback failed"):  # keep it as long: test_variants)
            ce.shared_variant(bare, key, {})
    assert builds == [1000.0] and "out of memory" in bare.stats()["refused"][ce._label(ce._shape(key))]
    now[0] += ce.OOM_RETRY_S - 1
    with pytest.raises(VariantRefused, match="EarlyWriteback failed"):
        ce.shared_variant(bare, key, {})
    now[0] += 1
    sentinel = ce.SharedGraph(None, None, None, 0, 0.0, "a graph", None)
    monkeypatch.setattr(ce, "_build_shared", lambda *a: builds.append(now[0]) or sentinel)
    got = ce.shared_variant(bare, key, {})
    assert got is sentinel and builds == [1000.0, 1000.0 + ce.OOM_RETRY_S] and bare.shared[ce._shape(key)] is sentinel


@cuda
@pytest.mark.parametrize("rules,shared", [("SRc", False), ("SR", False), ("SRc", True), ("SR", True)])
def test_capacity_graphs_replay_exactly_under_src(rules, shared):
    """Rules SRc (and SR: a graph per flow step) on capacity graphs (the released Token2Wav,
    5 flow steps, fp32): two voices
    of new lengths on one capacity's graphs, each captured on its own session (``shared``:
    once, on the capacity's working arena, for both: ``runtime.working``), every chunk
    replayed and exact against the stock tail: warm-up, growth, the trim, steady chunks, an
    11-token window and a 7-token flush on the capacity's shared graphs; the second voice
    is one the flush's shared graph refuses (its other branch class in the prompt), whose
    flush gets a program of its own."""
    import cadence_fx
    from cadence_fx.capacity_executable import SharedGraph
    from cadence_fx.passes.capacity import check_dims
    from helpers.marks import deterministic_protocol_restored
    device = torch.device("cuda")
    with deterministic_protocol_restored():
        flow, hift = s2.build_modules(0)
        tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
        opt = cadence_fx.optimize(tail, rules=rules, capacity=(256,), off_catalog="specialize",
                                  shared_captures=shared)
        chunks = [(_tokens(28, 40 + i), False) for i in range(4)] + [(_tokens(11, 45), False), (_tokens(7, 46), True)]
        flush = "entry 2 | token (1, 7), spk (1, 192) | last_chunk"
        voices, held = [111], {}  # 222 frames; then one of the flush's other class
        for p in voices:
            prompt = s2.synthetic_prompt(p, seed=p, device="cuda")
            tail.set_stream_cache(*prompt)
            session = opt.open_session(*prompt)
            report = compare_streams(tail, session, chunks, device, seed=p)
            assert report["exact"], (p, report["mismatches"])
            routes = [c["route"] for c in report["per_chunk"]]
            assert all(r.startswith("replay") for r in routes), (p, routes)
            assert session.session.executable.notes.get("capacity") == {"prompt_frames": 256}, p
            held[p] = {k: v["how"] for k, v in session.stats()["specializations"]["held"].items()}
            fallbacks = session.stats()["fallbacks"]
            assert not any(k.startswith("region refused replay") for k in fallbacks), (p, fallbacks)
            if shared:  # the entries, the window, the flush: captured by the first voice only
                captures = session.stats()["working_arena"]["captures"]
                assert captures == (5 if len(voices) == 1 else 6), (p, captures)  # the second's own flush
            session.close()
            if len(voices) == 1:
                (cexe,) = opt._capacities.values()
                (graph,) = [g for k, g in cexe.shared.items() if isinstance(g, SharedGraph) and k[2]]  # the flush

                def refused(t: int) -> bool:
                    try:
                        check_dims(graph.plan, graph.sym, {"prompt_frames": 2 * t})
                    except SpecializationRefused:
                        return True
                    return False
                voices.append(next(t for t in range(76, 128) if refused(t) and (2 * t + 49) % 25))
        assert held[111][flush].startswith("the capacity's shared graph"), held
        assert held[voices[1]][flush].startswith("this stream's own (traced)"), held
        stats = opt.capacity_stats()
        assert stats["refused"] == {}, stats
        built = stats["built"]["256 mel frames" + (", shared captures" if shared else "")]  # capacity_stats' keys
        assert {"entry 2 | token (1, 11), spk (1, 192)", flush} <= set(built["held"]), built


def _replayed_voice(tail, opt, prompt_tokens: int, window: int, flush: int):
    """A voice of ``prompt_tokens`` on ``opt`` (four 28-token chunks, a window and a flush of
    those lengths) against the stock ``tail`` on the GPU, seeded by its length: exact on every
    chunk, every chunk replayed.  Returns its session (open)."""
    chunks = [(_tokens(28, 40 + i), False) for i in range(4)] + [(_tokens(window, 45), False),
                                                                   (_tokens(flush, 46), True)]
    prompt = s2.synthetic_prompt(prompt_tokens, seed=prompt_tokens, device="cuda")
    tail.set_stream_cache(*prompt)
    session = opt.open_session(*prompt)
    report = compare_streams(tail, session, chunks, torch.device("cuda"), seed=prompt_tokens)
    assert report["exact"], report["mismatches"]
    routes = [c["route"] for c in report["per_chunk"]]
    assert all(r.startswith("replay") for r in routes), routes
    return session


@cuda
def test_a_prepared_class_voice_replays_exactly_building_and_capturing_nothing(monkeypatch):
    """``prepare_capacity(..., prompt_tokens=...)`` under SRc with shared captures (the released
    Token2Wav, 5 flow steps, fp32, capacity 256): a prompt length the capacity's catalog
    refuses (38 tokens, 76 frames: 76 + 99 divides by 25) gets its class's capacity (226
    frames) built, its window and flush prepared and every graph captured on its working
    arena before the voice comes.  That voice's set-up then traces nothing, every chunk
    (warm-up, growth, the trim, steady chunks, a 9-token window, a 4-token flush) is
    replayed and exact against the stock tail, and it builds and captures nothing."""
    import cadence_fx
    from cadence_fx.programs import entry as programs_entry
    from helpers.marks import deterministic_protocol_restored
    with deterministic_protocol_restored():
        flow, hift = s2.build_modules(0)
        tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
        opt = cadence_fx.optimize(tail, rules="SRc", capacity=(256,), off_catalog="specialize", shared_captures=True)
        got = opt.prepare_capacity(windows=[9], flushes=[4], prompt_tokens=[38, 111])
        assert got["classes"] == {"256 mel frames": {"76 mel frames": "on 226 mel frames"}}, got["classes"]
        theirs = got["226 mel frames"]
        assert all(h.startswith(("built in", "loaded from disk in", "the catalog's own")) for h in theirs.values()), \
            theirs
        captured = got["captured"]["226 mel frames, shared captures"]
        assert len(captured) == 5 and all(h.startswith("captured in") for h in captured.values()), captured
        cls = next(c for k, c in opt._capacities.items() if k[0] == 226)
        built, captures = cls.stats()["built"], cls.working().stats()["captures"]

        def no_trace(*args, **kwargs):
            raise AssertionError("a voice of a prepared class traced a program")
        monkeypatch.setattr(programs_entry, "_trace", no_trace)
        session = _replayed_voice(tail, opt, 38, window=9, flush=4)
        assert session.session.executable.notes.get("capacity") == {"prompt_frames": 226}
        assert cls.stats()["built"] == built and cls.working().stats()["captures"] == captures
        session.close()


@cuda
def test_a_restart_loads_and_captures_the_capacity_graphs_and_replays_exactly(tmp_path):
    """The capacity graphs on disk under SRc with shared captures (the released Token2Wav, 5
    flow steps, fp32, capacity 256): one model prepares a 9-token window and a 4-token flush
    (its graphs stored); a model of other weights (seed 1) with a program store of its own on
    the same directory, as a restarted process has, loads every graph (the catalog's and the
    shapes': the device's attention probe is in the key, not run again), lowers and captures
    them on its working arena, and a 111-token voice on them replays every chunk (warm-up,
    growth, the trim, steady chunks, the window, the flush) exactly against its own stock
    tail, building nothing."""
    import cadence_fx
    from helpers.marks import deterministic_protocol_restored
    with deterministic_protocol_restored():
        models = []
        for seed in (0, 1):
            flow, hift = s2.build_modules(seed)
            tail = s2.Token2WavTail(flow.cuda(), hift.cuda(), n_timesteps=5)
            opt = cadence_fx.optimize(tail, rules="SRc", capacity=(256,), off_catalog="specialize",
                                      shared_captures=True, cache=tmp_path)
            got = opt.prepare_capacity(windows=[9], flushes=[4], prompt_tokens=[111])
            models.append((tail, opt, got))
        first, (tail, opt, got) = models[0][2]["256 mel frames"], models[1]
        assert all(h.startswith(("built in", "the catalog's own")) for h in first.values()), first
        assert all(h.startswith(("loaded from disk in", "the catalog's own")) for h in got["256 mel frames"].values()), got
        (cexe,) = opt._capacities.values()
        assert cexe.loaded == 5 == cexe.stats()["loaded_from_disk"] and opt.programs.disk.counts["writes"] == 0
        captured = got["captured"]["256 mel frames, shared captures"]
        assert len(captured) == 5 and all(h.startswith("captured in") for h in captured.values()), captured
        session = _replayed_voice(tail, opt, 111, window=9, flush=4)
        assert cexe.stats()["built"] == 2 and cexe.working().stats()["captures"] == 5
        session.close()
