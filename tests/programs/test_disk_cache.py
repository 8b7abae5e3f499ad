"""The program cache on disk (``programs.disk``): a symbolic step saved by one model is
loaded by a fresh store (another process, in effect) and specialized, bit-exact; a
damaged or mismatched entry is rejected with its reason and traced again.

Most tests use the toy (``SymbolicToyAdapter``: a growing, trimmed cache whose prompt
length is symbolic; milliseconds per trace); one uses the shared Token2Wav model.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch

from cadence_fx.compiler import compile_executable
from cadence_fx.programs import DiskCache, ProgramStore, default_cache_dir
from cadence_fx.programs.disk import key_parts
from cadence_fx.programs.serialize import encode_step

from helpers.toy_models import (CHANNELS, SymbolicToyAdapter, ToyStream, assert_lockstep_exact, make_toy, toy_inputs,
                                toy_prompt)

N_STEPS = 8  # warm-up, growth, trim and steady state at every prompt length below


def _compile(model, prompt_frames: int, store: ProgramStore):
    adapter = SymbolicToyAdapter(model, prompt_frames)
    return adapter, compile_executable(adapter, "S", None, store)


def _exact(model, adapter, exe, prompt_frames: int) -> None:
    """Stream N_STEPS through the compiled toy and a stock twin (same seed): every output and state bit-equal."""
    stock, prompt = make_toy(), toy_prompt(prompt_frames, seed=prompt_frames)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    session = adapter.open_session(exe, prompt)
    assert_lockstep_exact(stock, stock_state, session, toy_inputs(N_STEPS, seed=prompt_frames), prompt_frames)


def _how(exe) -> list[tuple[str, str]]:
    return [(e["how"], e["program"]) for _, e in sorted(exe.notes["setup"].items())]


def _saved(tmp_path, prompt_frames: int = 5):
    """A toy model whose three symbolic steps were traced and written to ``tmp_path``."""
    model, store = make_toy(), ProgramStore(disk=DiskCache(tmp_path))
    _, exe = _compile(model, prompt_frames, store)
    assert _how(exe) == [("traced symbolic, specialized", "not cached")] * 3
    assert store.disk.counts["writes"] == 3 and len(list(tmp_path.glob("*.cfx"))) == 3
    return model, store


def test_round_trip_specializes_other_lengths_exactly(tmp_path):
    _saved(tmp_path, 5)
    model = make_toy()  # another model object with the same weights: a new process, in effect
    store = ProgramStore(disk=DiskCache(tmp_path))
    for prompt_frames in (3, 11):  # two lengths the saving model never saw
        adapter, exe = _compile(model, prompt_frames, store)
        want = "disk" if prompt_frames == 3 else "memory"
        assert _how(exe) == [("specialized", want)] * 3, exe.notes["setup"]
        _exact(model, adapter, exe, prompt_frames)
    assert store.disk.counts == {"hits": 3, "misses": 0, "rejected": 0, "writes": 0, "unsaved": 0, "waits": 0}
    assert all(line.endswith("loaded from disk") for line in store.describe()[:3]), store.describe()


def test_parameters_are_stored_by_path_and_bound_to_the_live_model(tmp_path):
    saver, store = _saved(tmp_path)
    (key, sym), *_ = store.items()
    attrs = encode_step(sym, {"toy": saver})["attrs"]
    assert attrs and all(spec[0] == "param" for spec in attrs.values()), attrs
    other = make_toy(seed=7)  # other weights, same shapes: same key, and it replays its own weights
    loaded = DiskCache(tmp_path).load(key_parts(SymbolicToyAdapter(other, 5), key), {"toy": other})
    live = dict(other.named_parameters())
    for node in loaded.gm.graph.nodes:
        if node.op == "get_attr":
            assert any(getattr(loaded.gm, node.target) is t for t in live.values()), node.target
    adapter, exe = _compile(other, 4, ProgramStore(disk=DiskCache(tmp_path)))
    assert _how(exe) == [("specialized", "disk")] * 3
    stock, prompt = make_toy(seed=7), toy_prompt(4)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    assert_lockstep_exact(stock, stock_state, adapter.open_session(exe, prompt), toy_inputs(N_STEPS), 4)


def test_a_corrupt_entry_is_rejected_traced_again_and_rewritten(tmp_path):
    _saved(tmp_path)
    target = sorted(tmp_path.glob("*.cfx"))[0]
    data = bytearray(target.read_bytes())
    for i in range(len(data) - 40, len(data) - 30):  # inside the payload
        data[i] ^= 0xFF
    target.write_bytes(bytes(data))
    said = []
    model = make_toy()
    store = ProgramStore(disk=DiskCache(tmp_path, progress=said.append))
    adapter, exe = _compile(model, 6, store)
    how = _how(exe)
    assert how.count(("specialized", "disk")) == 2
    [(traced, why)] = [h for h in how if h[0] != "specialized"]
    assert traced == "traced symbolic, specialized"
    assert why.startswith("rejected: payload SHA-256 mismatch"), why
    assert store.disk.last_rejection == f"{target.name}: {why.removeprefix('rejected: ')}"
    assert any("rejected" in m and target.name in m for m in said), said
    _exact(model, adapter, exe, 6)
    # the re-trace overwrote the entry: a third process loads all three
    _, exe = _compile(make_toy(), 9, ProgramStore(disk=DiskCache(tmp_path)))
    assert _how(exe) == [("specialized", "disk")] * 3


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_unreadable_entries_are_rejected_not_raised(tmp_path, damage):
    _saved(tmp_path)
    for path in tmp_path.glob("*.cfx"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00not a program\n" + data[:64])
    model = make_toy()
    store = ProgramStore(disk=DiskCache(tmp_path))
    adapter, exe = _compile(model, 5, store)
    assert [h[0] for h in _how(exe)] == ["traced symbolic, specialized"] * 3
    assert store.disk.counts["rejected"] == 3 and store.disk.counts["writes"] == 3
    _exact(model, adapter, exe, 5)


def test_a_parameter_of_another_shape_is_a_miss_and_rejected_if_forced(tmp_path):
    saver, store = _saved(tmp_path)
    (key, _), *_ = store.items()
    model = make_toy()
    model.out.bias = torch.nn.Parameter(torch.zeros(5))  # another shape: another parameter signature
    adapter = SymbolicToyAdapter(model, 5)
    assert key_parts(adapter, key)["parameters"] != key_parts(SymbolicToyAdapter(saver, 5), key)["parameters"]
    disk = DiskCache(tmp_path)
    assert disk.load(key_parts(adapter, key), adapter.modules()) is None
    assert disk.counts["misses"] == 1 and disk.last_rejection is None
    # forced: the saver's key, this model's tensors
    assert disk.load(key_parts(SymbolicToyAdapter(saver, 5), key), adapter.modules()) is None
    assert disk.counts["rejected"] == 1
    assert "toy.out.bias, stored as (4,) torch.float32 on cpu; this model's is (5,) torch.float32 on cpu" in disk.last_rejection
    missing = make_toy()
    missing.out.register_parameter("bias", None)
    assert disk.load(key_parts(SymbolicToyAdapter(saver, 5), key), {"toy": missing}) is None
    assert "toy.out.bias, which this model does not have" in disk.last_rejection


def test_another_torch_or_upstream_version_is_a_miss(tmp_path, monkeypatch):
    saver, store = _saved(tmp_path)
    (key, _), *_ = store.items()
    adapter = SymbolicToyAdapter(saver, 5)
    disk = DiskCache(tmp_path)
    assert disk.load(key_parts(adapter, key), adapter.modules()) is not None
    monkeypatch.setattr(SymbolicToyAdapter, "cache_identity", lambda self: {"upstream": "toy", "version": "2"})
    assert disk.load(key_parts(adapter, key), adapter.modules()) is None
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.0+other")
    assert disk.load(key_parts(adapter, key), adapter.modules()) is None
    assert disk.counts == {"hits": 1, "misses": 2, "rejected": 0, "writes": 0, "unsaved": 0, "waits": 0}


def test_an_entry_under_a_foreign_name_is_rejected_by_its_header(tmp_path):
    saver, store = _saved(tmp_path)
    (key, _), *_ = store.items()
    adapter = SymbolicToyAdapter(saver, 5)
    disk = DiskCache(tmp_path)
    stale = key_parts(adapter, key)
    stale["torch"] = "0.0.0+other"
    disk.path_for(stale).write_bytes(disk.path_for(key_parts(adapter, key)).read_bytes())  # copied, renamed
    assert disk.load(stale, adapter.modules()) is None
    assert disk.last_rejection.endswith("written for other torch")


def test_cache_false_writes_nothing_and_a_path_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("CADENCE_FX_CACHE_DIR", str(tmp_path / "default"))
    assert default_cache_dir() == tmp_path / "default"
    monkeypatch.delenv("CADENCE_FX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "cadence_fx"
    monkeypatch.setenv("CADENCE_FX_CACHE_DIR", str(tmp_path / "default"))
    from cadence_fx.integrations.dropin import DropIn
    cpu = torch.device("cpu")
    assert DropIn("S", cpu, cache=False).programs.disk is None
    assert DropIn("S", cpu).programs.disk.directory == tmp_path / "default"
    assert DropIn("S", cpu, cache=tmp_path / "mine").programs.disk.directory == tmp_path / "mine"
    store = DropIn("S", cpu, cache=False).programs
    model = make_toy()
    adapter, exe = _compile(model, 5, store)
    assert [h[1] for h in _how(exe)] == ["not cached"] * 3 and len(store) == 3
    assert not any(tmp_path.rglob("*")), list(tmp_path.rglob("*"))


class LazyScale(torch.nn.Module):
    """Scales by a table it converts to the input's dtype on first use (as upstream's
    positional encodings move to the input's device): a plain tensor attribute."""

    def __init__(self):
        super().__init__()
        self.table = torch.linspace(0.5, 1.5, CHANNELS, dtype=torch.float64)[:, None]

    def forward(self, y):
        if self.table.dtype != y.dtype:
            self.table = self.table.to(y.dtype)
        return y * self.table


class LazyToy(ToyStream):
    """The toy with its output scaled by a ``LazyScale`` (a submodule the twins share)."""

    def __init__(self):
        super().__init__()
        self.scale = LazyScale()

    def stream(self, inputs, state, prompt_frames, last=False):
        out, new = super().stream(inputs, state, prompt_frames, last)
        return {"y": self.scale(out["y"])}, new


def _lazy_toy() -> LazyToy:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LazyToy().eval()


def test_a_table_moved_on_first_use_is_prepared_then_bound(tmp_path):
    """A fresh model's table is not yet converted: the entry's constant differs from it,
    so the step runs once (the first use) and the entry binds to the converted table."""
    saver = _lazy_toy()
    store = ProgramStore(disk=DiskCache(tmp_path))
    _, exe = _compile(saver, 5, store)
    assert [h[1] for h in _how(exe)] == ["not cached"] * 3
    (_, sym), *_ = store.items()
    attrs = encode_step(sym, {"toy": saver})["attrs"]
    assert ("param", "toy.scale.table", (CHANNELS, 1), "torch.float32", "cpu") in attrs.values(), attrs
    said = []
    model = _lazy_toy()
    assert model.scale.table.dtype == torch.float64
    adapter, exe = _compile(model, 7, ProgramStore(disk=DiskCache(tmp_path, progress=said.append)))
    assert _how(exe) == [("specialized", "disk")] * 3, exe.notes["setup"]
    assert any("toy.scale.table" in m and "running the step once" in m for m in said), said
    stock, prompt = _lazy_toy(), toy_prompt(7)
    with torch.no_grad():
        stock_state = stock.setup(prompt)
    assert_lockstep_exact(stock, stock_state, adapter.open_session(exe, prompt), toy_inputs(N_STEPS), 7)


@contextlib.contextmanager
def _holding(directory, model, keys):
    """Another holder's claims on ``keys`` (of the toy ``model``) in ``directory``, all
    granted at once, released on leaving (also when an assertion inside fails)."""
    holder = DiskCache(directory)
    with contextlib.ExitStack() as stack:
        got = [stack.enter_context(holder.claim(key_parts(SymbolicToyAdapter(model, 5), key))) for key in keys]
        assert got == [False] * len(keys)  # nobody held them
        yield


def test_a_claimed_key_waits_for_its_holder_and_loads_what_it_wrote(tmp_path):
    """Processes sharing a directory trace a key once: while another holds an entry's
    claim, the compiler waits (and says so), then specializes what the holder wrote,
    tracing nothing.  (Threads of one process exclude each other like processes do.)"""
    import shutil
    import threading
    import time
    source = tmp_path / "written"
    saver, saved = _saved(source)
    shared = tmp_path / "shared"
    model = make_toy()
    said = []
    store = ProgramStore(disk=DiskCache(shared, progress=said.append, wait_s=120))  # a failure cannot hang the run
    result = {}
    compiling = threading.Thread(target=lambda: result.update(exe=_compile(model, 9, store)), daemon=True)
    with _holding(shared, model, [key for key, _ in saved.items()]):
        compiling.start()
        deadline = time.monotonic() + 60
        while store.disk.counts["waits"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.disk.counts["waits"] == 1 and compiling.is_alive()
        assert any("another process is tracing entry 1 variant 0; waiting" in m for m in said), said
        for f in source.glob("*.cfx"):  # the holder writes its entries, then lets go
            shutil.copy(f, shared / f.name)
    compiling.join(60)
    adapter, exe = result["exe"]
    assert _how(exe) == [("specialized", "disk")] * 3, exe.notes["setup"]
    assert store.disk.counts["writes"] == 0 and store.disk.counts["hits"] == 3
    waited = [e.get("waited_s") for _, e in sorted(exe.notes["setup"].items())]
    assert waited[0] > 0 and waited[1:] == [None, None], waited  # entry 1 waited; 2 and 3 were written by then
    assert exe.notes["setup_s"]["waited_s"] == waited[0]  # and the compile's total counts it
    _exact(model, adapter, exe, 9)
    # an entry claimed and found written by the time the claim is granted is not traced again
    (key, _), *_ = saved.items()
    with DiskCache(shared).claim(key_parts(SymbolicToyAdapter(model, 5), key)) as waited:
        assert waited is False


def test_a_holder_that_never_lets_go_is_waited_for_at_most_wait_s_then_traced_here(tmp_path, monkeypatch):
    model = make_toy()
    traced = ProgramStore()
    _compile(model, 5, traced)
    said = []
    store = ProgramStore(disk=DiskCache(tmp_path, progress=said.append, wait_s=0.2))
    with _holding(tmp_path, model, [key for key, _ in traced.items()]):
        adapter, exe = _compile(model, 6, store)
    assert _how(exe) == [("traced symbolic, specialized", "not cached")] * 3, exe.notes["setup"]
    assert store.disk.counts["waits"] == 3 and store.disk.counts["writes"] == 3
    assert sum("gave up waiting for entry" in m and "after 0.2 s; tracing it here" in m for m in said) == 3, said
    assert all(e["waited_s"] >= 0.2 for e in exe.notes["setup"].values())
    _exact(model, adapter, exe, 6)
    monkeypatch.setenv("CADENCE_FX_CACHE_WAIT_S", "soon")
    with pytest.raises(ValueError, match=r"\$CADENCE_FX_CACHE_WAIT_S must be a number of seconds, not 'soon'"):
        DiskCache(tmp_path)
    monkeypatch.setenv("CADENCE_FX_CACHE_WAIT_S", "30")
    assert DiskCache(tmp_path).wait_s == 30.0
    with pytest.raises(ValueError, match="wait_s must be >= 0"):
        DiskCache(tmp_path, wait_s=-1)


def test_a_claim_without_a_writable_directory_holds_nothing(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    said = []
    disk = DiskCache(blocked / "cache", progress=said.append)
    with disk.claim({"k": 1}) as waited:
        assert waited is False
    assert said and "no lock" in said[0] and "tracing without it" in said[0]


def test_the_suite_never_writes_the_users_cache():
    assert os.environ.get("CADENCE_FX_CACHE_DIR"), "tests/conftest.py sets a per-session cache directory"
    assert not default_cache_dir().is_relative_to(Path.home() / ".cache")


def test_token2wav_loads_its_programs_for_a_new_prompt_length(t2w, tmp_path):
    """The shared model's symbolic steps, written to ``tmp_path`` and loaded by a fresh
    store, specialize a prompt length no test uses, exact against stock."""
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.lockstep import compare_streams
    cpu = torch.device("cpu")
    prompt = s2.synthetic_prompt(5, seed=1)
    t2w.tail.set_stream_cache(*prompt)
    t2w.opt.set_stream_cache(*prompt)  # the symbolic steps exist from here (traced, or loaded)
    adapter = t2w.opt.adapter_for(int(prompt[1].shape[1]), prompt[2])
    disk = DiskCache(tmp_path)
    for key, sym in t2w.opt.programs.items():
        assert disk.save(key_parts(adapter, key), sym, adapter.modules()) is not None
        attrs = encode_step(sym, adapter.modules())["attrs"]
        by_value = sum(len(spec[1]) for spec in attrs.values() if spec[0] == "value")
        assert by_value < 2 ** 20, f"{by_value} bytes stored by value: weights not mapped to their paths"
    saved, t2w.opt.programs = t2w.opt.programs, ProgramStore(disk=DiskCache(tmp_path))
    try:
        prompt = s2.synthetic_prompt(17, seed=17)  # 34 frames: inside the guards (26 is not)
        t2w.tail.set_stream_cache(*prompt)
        t2w.opt.set_stream_cache(*prompt)
        setup = t2w.opt.session.executable.notes["setup"]
        assert [(e["how"], e["program"]) for e in setup.values()] == [("specialized", "disk")] * len(setup), setup
        report = compare_streams(t2w.tail, t2w.opt, s2.synthetic_chunks(4, seed=17, final_tokens=11), cpu, seed=17)
        assert report["exact"], report["mismatches"]
    finally:
        t2w.opt.programs = saved


def _tensor_attrs(module: torch.nn.Module):
    yield from module._buffers.items()
    yield from module._parameters.items()
    yield from ((k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("path", ["symbolic", "concrete"])
def test_an_executable_keeps_no_reference_to_the_arena_it_was_traced_on(tmp_path, path):
    """Tracing binds the region buffers to the scratch arena; ``state_rewrite`` turns them
    into arena inputs, and whatever held them in the graph module must go too (PruneDead).
    The scratch arena is the first session's: if an executable (one is kept per prompt
    length) still held it, that arena's memory would outlive every session on it."""
    model = make_toy()
    store = ProgramStore(disk=DiskCache(tmp_path)) if path == "symbolic" else None
    adapter = SymbolicToyAdapter(model, 5)
    exe = compile_executable(adapter, "S", None, store)
    assert {e["how"] for e in exe.notes["setup"].values()} == (
        {"traced symbolic, specialized"} if path == "symbolic" else {"traced"})
    arena = exe.spare_arena.storage.untyped_storage().data_ptr()
    held = [f"entry {i}: {mod_name}.{name}" for i, p in exe.programs.items()
            for mod_name, m in p.run.named_modules() for name, t in _tensor_attrs(m)
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == arena]
    assert held == []
    # and a session on it still runs exactly (the arena inputs are its own arena's)
    _exact(model, adapter, exe, 5)


def test_a_decoded_runnable_graph_generates_its_code_when_it_first_runs_and_computes_the_same(monkeypatch):
    """``decode_graph(runnable=True)`` (a capacity graph, a folded-constant recipe) builds no
    Python code at decode: under SRc a loaded capacity graph is split into pieces and never
    runs as itself (a restart's load took 0.65x as long without it, session 49).  Called,
    it generates its code then and gives the original's bits."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from cadence_fx.passes.base import lazy_graph_module_class
    from cadence_fx.programs.serialize import decode_graph, encode_graph
    if lazy_graph_module_class() is torch.fx.GraphModule:
        pytest.skip("this torch has no lazy GraphModule")
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with torch.no_grad():
        gm = make_fx(lambda t: torch.nn.functional.gelu(model(t)) * 2, pre_dispatch=True)(x)
        expected = gm(x)
    record = encode_graph(gm, {"model": model})
    generated = []
    real = torch.fx.Graph.python_code
    monkeypatch.setattr(torch.fx.Graph, "python_code", lambda self, *a, **k: generated.append(1) or real(self, *a, **k))
    decoded = decode_graph(record, {"model": model}, runnable=True)
    assert not generated, "decode_graph generated Python code for a graph that may never run as itself"
    with torch.no_grad():
        got = decoded(x)
    assert generated and torch.equal(got, expected)
