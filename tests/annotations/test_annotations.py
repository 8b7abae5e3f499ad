"""Declarations: clocks, retention policies, regions and @native_clock."""

from __future__ import annotations

import json

import pytest

from cadence_fx.annotations import (
    DECLARATION_ATTR, ChunkPad, Clock, Declaration, Fixed, Region, Ring, Unbounded, Window,
    get_declaration, native_clock,
)
from cadence_fx.errors import DeclarationError, PlanError

MEL = Clock("mel", 50, 50)
TOKEN = Clock("token", 25, 25)


def att(**kw) -> Region:
    args = dict(name="att", clock="mel", shape=("n_timesteps", 16, 2, 8, "T", 128), axis=4,
                retention=Window(100, prefix="prompt_frames"), buffers=("decoder.att_cache_buffer",))
    args.update(kw)
    return Region(**args)


def cnn(**kw) -> Region:
    args = dict(name="cnn", clock="mel", shape=(1, 512, 6))
    args.update(kw)
    return Region(**args)


# --- clocks ------------------------------------------------------------------

def test_clock_examples():
    assert Clock("sample", 24000, 24000).stride == 24000
    mimi = Clock("frame", 12.5, 1)
    assert mimi.hz == 12.5 and mimi.to_json() == {"name": "frame", "hz": 12.5, "stride": 1}
    assert Clock("mel", 50, 50) == Clock("mel", 50.0, 50)


@pytest.mark.parametrize("args, needle", [
    (("", 50, 50), "not an identifier"),
    (("mel-clock", 50, 50), "'mel-clock'"),
    (("mel", 0, 50), "Clock 'mel': hz=0"),
    (("mel", float("inf"), 50), "Clock 'mel': hz=inf"),
    (("mel", 50, 0), "Clock 'mel': stride=0"),
    (("mel", 50, 2.5), "Clock 'mel': stride=2.5"),
    (("mel", 50, True), "Clock 'mel': stride=True"),
])
def test_clock_validation(args, needle):
    with pytest.raises(DeclarationError, match=needle.replace("(", r"\(")):
        Clock(*args)


# --- retention ---------------------------------------------------------------

@pytest.mark.parametrize("policy, stride, k", [
    (Window(retain=100), 50, 3),               # Token2Wav carry (paper Table 3)
    (Window(retain=10), 10, 2),                # Freeze-Omni codec as a window
    (ChunkPad(chunk=40, pad=10), 10, 2),       # Freeze-Omni codec: chunk 40 + pad 10
    (ChunkPad(chunk=40, pad=10), 40, 2),       # the clock's stride does not matter
    (Ring(capacity=250), 1, 1),                # Moshi temporal KV ring
    (Fixed(), 50, 1),
    (Window(retain=0), 1, 1),                  # speech-token KV, windowed, steady
    (Unbounded(), 50, None),
])
def test_catalog_width_table3(policy, stride, k):
    assert policy.catalog_width(stride) == k


def test_window_extent_and_capacity():
    w = Window(retain=100, prefix="prompt_frames")
    dims = {"prompt_frames": 37}
    assert [w.extent(k, 50, dims) for k in range(5)] == [37, 87, 137, 137, 137]
    assert w.capacity(50, dims) == 37 + 100 + 50
    assert w.symbols() == ("prompt_frames",)
    assert Window(8).extent(0, 50, {}) == 0 and Window(8).extent(1, 50, {}) == 8


def test_window_unknown_symbol_names_it():
    with pytest.raises(PlanError, match="prompt_frames.*pass dims"):
        Window(100, prefix="prompt_frames").extent(0, 50, {"n_timesteps": 5})


def test_chunkpad_behaves_as_window_on_chunk():
    cp = ChunkPad(chunk=40, pad=10)
    assert [cp.extent(k, 999, {}) for k in range(3)] == [0, 10, 10]
    assert cp.capacity(999, {}) == 50
    assert ChunkPad(chunk=40, pad=0).catalog_width(40) == 1


def test_ring_extent_is_capacity():
    r = Ring(8)
    assert r == Ring(capacity=8) and r.frames == 8 and repr(r) == "Ring(capacity=8)"
    assert [r.extent(k, 1, {}) for k in range(3)] == [8, 8, 8]
    assert r.capacity(1, {}) == 8


def test_fixed_and_unbounded_have_no_capacity():
    with pytest.raises(PlanError, match="no growth axis"):
        Fixed().capacity(50, {})
    with pytest.raises(PlanError, match="out of scope"):
        Unbounded().capacity(50, {})


@pytest.mark.parametrize("make, needle", [
    (lambda: Window(retain=-1), r"Window\(retain=-1\)"),
    (lambda: Window(retain=10, prefix="prompt frames"), "must be an identifier"),
    (lambda: Window(retain=10, prefix=-3), r"Window\(prefix=-3\)"),
    (lambda: Ring(capacity=0), r"Ring\(capacity=0\)"),
    (lambda: ChunkPad(chunk=40, pad=40), "pad must be < chunk"),
    (lambda: ChunkPad(chunk=0, pad=0), "chunk must be"),
    (lambda: ChunkPad(chunk=4, pad=-1), "pad must be"),
])
def test_retention_validation(make, needle):
    with pytest.raises(DeclarationError, match=needle):
        make()


def test_retention_json_and_describe():
    assert Window(100, "prompt_frames").to_json() == {"policy": "Window", "retain": 100, "prefix": "prompt_frames"}
    assert Window(8).describe() == "Window(retain=8)"
    assert Window(100, "prompt_frames").describe() == "Window(retain=100, prefix=prompt_frames)"
    assert Ring(8).to_json() == {"policy": "Ring", "capacity": 8}
    assert ChunkPad(40, 10).to_json() == {"policy": "ChunkPad", "chunk": 40, "pad": 10}
    assert Fixed().to_json() == {"policy": "Fixed"} and Unbounded().to_json() == {"policy": "Unbounded"}


# --- regions -----------------------------------------------------------------

def test_region_normalises():
    r = att(shape=["n_timesteps", 16, 2, 8, "T", 128], axis=-2, dtype="torch.float16", clock=MEL)
    assert r.shape == ("n_timesteps", 16, 2, 8, "T", 128)
    assert r.axis == 4 and r.dtype == "float16" and r.clock == "mel"
    assert r.symbols() == ("n_timesteps", "prompt_frames")  # "T" sits on the growth axis
    assert json.loads(json.dumps(r.to_json()))["retention"]["policy"] == "Window"


@pytest.mark.parametrize("make, needle", [
    (lambda: att(name="att cache"), "'att cache' is not an identifier"),
    (lambda: att(axis=None), "Region 'att': .*needs axis"),
    (lambda: att(axis=6), "Region 'att': axis=6 is out of range"),
    (lambda: cnn(axis=1), "Region 'cnn': Fixed\\(\\) has no growth axis"),
    (lambda: att(retention=Ring(10), axis=None), "Region 'att': Ring\\(capacity=10\\) needs axis"),
    (lambda: att(retention=ChunkPad(40, 10), axis=None), "Region 'att': ChunkPad"),
    (lambda: cnn(shape=(1, 0, 6)), "Region 'cnn': shape entries \\[0\\]"),
    (lambda: cnn(shape=(1, "n-steps", 6)), "Region 'cnn': shape entries"),
    (lambda: cnn(shape="1x512"), "Region 'cnn': shape="),
    (lambda: cnn(dtype="float31"), "Region 'cnn': unknown dtype 'float31'"),
    (lambda: cnn(retention="window"), "Region 'cnn': retention="),
    (lambda: cnn(buffers="decoder.cnn_cache"), "Region 'cnn': buffers must be a tuple"),
    (lambda: cnn(buffers=("decoder..cache",)), "Region 'cnn': buffer paths"),
    (lambda: cnn(buffers=("a.b", "a.b")), "Region 'cnn': buffer paths \\['a.b'\\] are listed twice"),
    (lambda: cnn(clock="mel clock"), "Region 'cnn': clock="),
    (lambda: cnn(carried="yes"), "Region 'cnn': carried="),
])
def test_region_validation(make, needle):
    with pytest.raises(DeclarationError, match=needle):
        make()


def test_unbounded_region_is_declarable():
    r = Region("log", "token", (1, "T"), axis=1, retention=Unbounded(), dtype="int64")
    assert r.retention.catalog_width(25) is None
    Region("log2", "token", (1, 7), retention=Unbounded())  # axis optional: it is out of scope anyway


# --- declarations ------------------------------------------------------------

def test_declaration_json_round_trip():
    d = Declaration([MEL, TOKEN], [att(), cnn()], step="stream", unit="chunk")
    assert d.clocks == (MEL, TOKEN)  # lists become tuples
    text = json.dumps(d.to_json())
    assert json.loads(text)["regions"][0]["buffers"] == ["decoder.att_cache_buffer"]
    assert d.region("cnn").shape == (1, 512, 6) and d.clock("mel") is MEL


@pytest.mark.parametrize("clocks, regions, needle", [
    ([MEL, Clock("mel", 100, 100)], [cnn()], "clock 'mel' is declared twice"),
    ([MEL], [cnn(), cnn()], "region 'cnn' is declared twice"),
    ([MEL], [cnn(clock="sample")], "Region 'cnn' is on clock 'sample', which is not declared"),
    ([MEL], [att(), cnn(buffers=("decoder.att_cache_buffer",))],
     "buffer 'decoder.att_cache_buffer' is bound by both region 'att' and region 'cnn'"),
    ([MEL], [], "no regions"),
    ([], [cnn()], "no clocks"),
    ([MEL], ["cnn"], "regions must hold Region objects"),
])
def test_declaration_validation(clocks, regions, needle):
    with pytest.raises(DeclarationError, match=needle):
        native_clock(clocks=clocks, regions=regions)
    with pytest.raises(DeclarationError, match=needle):
        Declaration(clocks, regions)


def test_native_clock_as_class_decorator():
    @native_clock(clocks=[MEL], regions=[cnn()], step="forward_chunk", unit="chunk of 50 mel frames")
    class Decoder:
        def forward_chunk(self):
            pass

    d = get_declaration(Decoder)
    assert isinstance(d, Declaration) and d.step == "forward_chunk" and d.unit == "chunk of 50 mel frames"
    assert get_declaration(Decoder()) is d

    class Subclass(Decoder):  # a subclass inherits its parent's declaration
        pass
    assert get_declaration(Subclass()) is d


def test_native_clock_from_outside_an_upstream_class():
    import torch.nn as nn

    class Upstream(nn.Module):  # stands for a class we cannot edit
        def forward(self, x):
            return x

    returned = native_clock(clocks=[MEL], regions=[att()], step="forward")(Upstream)
    assert returned is Upstream
    assert get_declaration(Upstream()).region("att").axis == 4
    assert DECLARATION_ATTR in vars(Upstream)


def test_native_clock_on_one_instance_only():
    import torch.nn as nn

    class Upstream(nn.Module):
        pass

    a, b = Upstream(), Upstream()
    assert native_clock(clocks=[MEL], regions=[cnn()])(a) is a
    assert get_declaration(a).regions[0].name == "cnn"
    with pytest.raises(DeclarationError, match="Upstream instance has no @native_clock declaration; "
                                               r"decorate the class or call native_clock\(\.\.\.\)\(obj\)"):
        get_declaration(b)


def test_instance_declaration_overrides_class():
    @native_clock(clocks=[MEL], regions=[cnn()])
    class Model:
        pass

    m = Model()
    native_clock(clocks=[MEL], regions=[att()])(m)
    assert get_declaration(m).regions[0].name == "att"
    assert get_declaration(Model()).regions[0].name == "cnn"


def test_get_declaration_missing_on_class():
    class Plain:
        pass

    with pytest.raises(DeclarationError, match="class .*Plain has no @native_clock declaration"):
        get_declaration(Plain)


def test_native_clock_on_slotted_object_says_what_to_do():
    class Slotted:
        __slots__ = ()

    with pytest.raises(DeclarationError, match="decorate its class"):
        native_clock(clocks=[MEL], regions=[cnn()])(Slotted())
