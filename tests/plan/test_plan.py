"""Plan: shape catalog, arena layout, scope verdicts, Plan.explain/to_json."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch
from expecttest import TestCase

from cadence_fx.annotations import ChunkPad, Clock, Declaration, Fixed, Region, Ring, Unbounded, Window
from cadence_fx.errors import DeclarationError, PlanError
from cadence_fx.plan import (
    ARENA_ALGORITHMS, ArenaLayout, RegionSlot, ScopeVerdict, TensorSpec, build_catalog, catalog_width,
    entry_for_step, make_plan, plan_arena, region_verdicts, verify_layout,
)

MEL = Clock("mel", 50, 50)
TOKEN = Clock("token", 25, 25)
TOKENS_IN = {"tokens": TensorSpec.contiguous((1, 28), "int64", "cpu")}


def token2wav_like(*extra: Region) -> Declaration:
    """The Token2Wav tail's shape of state: a windowed DiT K|V carry behind a prompt,
    the vocoder's 8-frame mel carry, and a fixed conv carry."""
    return Declaration(
        clocks=[TOKEN, MEL],
        regions=[
            Region("att", "mel", ("n_timesteps", 16, 2, 8, "T", 128), axis=4,
                   retention=Window(retain=100, prefix="prompt_frames"), buffers=("decoder.att_cache_buffer",)),
            Region("hift_mel", "mel", (1, 80, "T"), axis=2, dtype="float32", retention=Window(retain=8)),
            Region("cnn", "mel", (1, 512, 6), retention=Fixed()),
            *extra,
        ],
        step="stream", unit="chunk of 25 tokens",
    )


def dims(prompt_frames=100, n_timesteps=5):
    return {"n_timesteps": n_timesteps, "prompt_frames": prompt_frames}


# --- catalog -----------------------------------------------------------------

def test_max_stride_sizes_the_arena_for_the_longest_step_and_leaves_the_catalog():
    """A clock whose steps may advance more than ``stride`` (a longer flush): the arena
    slot holds prefix + retain + max_stride; the catalog's extents are those of stride."""
    longer = Declaration(clocks=[TOKEN, Clock("mel", 50, 50, max_stride=56)],
                         regions=token2wav_like().regions, step="stream", unit="chunk of 25 tokens")
    plain = build_catalog(token2wav_like(), dims(37), TOKENS_IN, "float32", "cpu")
    cat = build_catalog(longer, dims(37), TOKENS_IN, "float32", "cpu")
    assert [e.regions["att"].shape for e in cat] == [e.regions["att"].shape for e in plain]
    assert cat[0].regions["att"].stride == torch.empty((5, 16, 2, 8, 37 + 156, 128), device="meta").stride()
    assert make_plan(longer, dims(37), TOKENS_IN).layout.slot("hift_mel").shape == (1, 80, 8 + 56)
    assert Clock("mel", 50, 50, max_stride=50) == Clock("mel", 50, 50)  # one representation
    assert longer.to_json()["clocks"][1] == {"name": "mel", "hz": 50.0, "stride": 50, "max_stride": 56}
    for bad in (49, 50.5, True):
        with pytest.raises(DeclarationError, match=r"max_stride=.* must be an int >= stride \(50\)"):
            Clock("mel", 50, 50, max_stride=bad)


def test_catalog_width_delegates_to_retention():
    d = token2wav_like()
    assert catalog_width(d.region("att"), MEL) == 3
    assert catalog_width(d.region("hift_mel"), MEL) == 2
    assert catalog_width(d.region("cnn"), MEL) == 1
    with pytest.raises(PlanError, match="region 'att' is on clock 'mel'"):
        catalog_width(d.region("att"), TOKEN)


@pytest.mark.parametrize("n_timesteps", [5, 10])
@pytest.mark.parametrize("prompt_frames", [0, 37, 100, 500])
def test_token2wav_catalog(prompt_frames, n_timesteps):
    cat = build_catalog(token2wav_like(), dims(prompt_frames, n_timesteps), TOKENS_IN, "float32", "cpu")
    assert [e.steps for e in cat] == [(0,), (1,), "2+"]
    assert [e.phase for e in cat] == [e.index for e in cat] == [0, 1, 2]
    p = prompt_frames
    assert [e.regions["att"].shape[4] for e in cat] == [p, p + 50, p + 100]
    assert [e.regions["hift_mel"].shape[2] for e in cat] == [0, 8, 8]
    capacity = (n_timesteps, 16, 2, 8, p + 150, 128)
    for e in cat:
        att = e.regions["att"]
        # The view keeps the arena's (capacity) strides whatever its extent.
        assert att.stride == torch.empty(capacity, device="meta").stride()
        assert att.shape[:4] + att.shape[5:] == capacity[:4] + capacity[5:]
        assert att.dtype == "float32" and att.device == "cpu"
        assert e.regions["hift_mel"].stride == (80 * 58, 58, 1)
        assert e.regions["cnn"] == TensorSpec.contiguous((1, 512, 6), "float32", "cpu")
        assert e.inputs == TOKENS_IN
    assert entry_for_step(cat, 0) is cat[0] and entry_for_step(cat, 1) is cat[1]
    assert entry_for_step(cat, 2) is cat[2] and entry_for_step(cat, 7) is cat[-1]


def test_catalog_views_match_torch_narrowed_arena_views():
    cat = build_catalog(token2wav_like(), dims(37), TOKENS_IN, "float16", "cpu")
    arena_att = torch.empty(5, 16, 2, 8, 187, 128, dtype=torch.float16)
    for e in cat:
        view = arena_att.narrow(4, 0, e.regions["att"].shape[4])
        assert TensorSpec.of(view) == e.regions["att"]


def test_catalog_keys_are_hashable_signatures():
    cat = build_catalog(token2wav_like(), dims(), TOKENS_IN, "float32", "cpu")
    again = build_catalog(token2wav_like(), dims(), TOKENS_IN, "float32", "cpu")
    assert len({e.key() for e in cat}) == 3
    assert [e.key() for e in cat] == [e.key() for e in again]
    assert hash(cat[0]) == hash(again[0]) and cat == again


def test_model_dtype_resolves_and_explicit_dtype_stays():
    cat = build_catalog(token2wav_like(), dims(), TOKENS_IN, "bfloat16", "cuda:0")
    assert cat[0].regions["att"].dtype == "bfloat16" and cat[0].regions["att"].device == "cuda:0"
    assert cat[0].regions["hift_mel"].dtype == "float32"


def test_unbounded_region_is_left_out_of_the_catalog():
    log = Region("log", "token", (1, "T"), axis=1, retention=Unbounded(), dtype="int64")
    cat = build_catalog(token2wav_like(log), dims(), TOKENS_IN, "float32", "cpu")
    assert len(cat) == 3 and "log" not in cat[0].regions


def test_ring_only_catalog_is_one_steady_entry():
    mimi = Declaration([Clock("frame", 12.5, 1)],
                       [Region("kv", "frame", (2, 8, "T", 64), axis=2, retention=Ring(250))])
    cat = build_catalog(mimi, {}, {}, "float32", "cpu")
    assert len(cat) == 1 and cat[0].steps == "0+" and cat[0].regions["kv"].shape == (2, 8, 250, 64)
    assert entry_for_step(cat, 1000) is cat[0]


def test_chunkpad_catalog_has_two_entries():
    codec = Declaration([Clock("codec", 12.5, 40)],
                        [Region("ctx", "codec", (1, 512, "T"), axis=2, retention=ChunkPad(chunk=40, pad=10))])
    cat = build_catalog(codec, {}, {}, "float32", "cpu")
    assert [e.regions["ctx"].shape for e in cat] == [(1, 512, 0), (1, 512, 10)]
    assert [e.regions["ctx"].stride for e in cat] == [(512 * 50, 50, 1)] * 2


@pytest.mark.parametrize("bad_dims, needle", [
    ({"n_timesteps": 5}, r"region 'att' needs dims\['prompt_frames'\]"),
    ({"prompt_frames": 100}, r"region 'att' needs dims\['n_timesteps'\]"),
    ({"prompt_frames": -1, "n_timesteps": 5}, r"region 'att': dims\['prompt_frames'\]=-1"),
    ({"prompt_frames": 10, "n_timesteps": 0}, r"region 'att': dims\['n_timesteps'\]=0"),
])
def test_missing_or_bad_symbol_names_region_and_symbol(bad_dims, needle):
    with pytest.raises(PlanError, match=needle):
        build_catalog(token2wav_like(), bad_dims, TOKENS_IN, "float32", "cpu")


def test_catalog_bound_names_the_growing_region():
    d = Declaration([Clock("frame", 12.5, 1)],
                    [Region("kv", "frame", (8, "T"), axis=1, retention=Window(retain=1000)),
                     Region("conv", "frame", (8, 3))])
    with pytest.raises(PlanError, match=r"exceeds 64 entries: region 'kv' \(Window\(retain=1000\) on clock frame, "
                                        r"stride 1: K=1001\) keeps growing"):
        build_catalog(d, {}, {}, "float32", "cpu")
    ok = Declaration([Clock("frame", 12.5, 1)], [Region("kv", "frame", (8, "T"), axis=1, retention=Window(63))])
    assert len(build_catalog(ok, {}, {}, "float32", "cpu")) == 64


def test_bad_inputs_and_dtype():
    with pytest.raises(PlanError, match="inputs"):
        build_catalog(token2wav_like(), dims(), {"tokens": (1, 28)}, "float32", "cpu")
    with pytest.raises(PlanError, match="model dtype 'float31'"):
        build_catalog(token2wav_like(), dims(), TOKENS_IN, "float31", "cpu")
    with pytest.raises(PlanError, match="step=-1"):
        entry_for_step(build_catalog(token2wav_like(), dims(), TOKENS_IN, "float32", "cpu"), -1)


def test_tensor_spec():
    assert TensorSpec.contiguous((2, 3, 4), "torch.float32", "cpu").stride == (12, 4, 1)
    for shape in [(1, 80, 0), (0, 3), ()]:
        assert TensorSpec.contiguous(shape, "float32", "cpu").stride == torch.empty(shape).stride()
    with pytest.raises(PlanError, match="stride"):
        TensorSpec((2, 3), "float32", (1,), "cpu")
    with pytest.raises(PlanError, match="unknown dtype"):
        TensorSpec((2,), "float31", (1,), "cpu")


# --- arena layout --------------------------------------------------------------

ATT_BYTES = 5 * 16 * 2 * 8 * 250 * 128 * 4
HIFT_BYTES = 80 * 58 * 4
CNN_BYTES = 512 * 6 * 4


def test_arena_layout_for_token2wav():
    layout = plan_arena(token2wav_like(), dims(), "float32")
    verify_layout(layout)
    assert [s.name for s in layout.slots] == ["att", "hift_mel", "cnn"]
    att, hift, cnn = layout.slots
    assert att.shape == (5, 16, 2, 8, 250, 128) and att.capacity == 250 and att.axis == 4
    assert (att.nbytes, hift.nbytes, cnn.nbytes) == (ATT_BYTES, HIFT_BYTES, CNN_BYTES)
    assert cnn.capacity is None and cnn.axis is None
    assert all(s.offset % 512 == 0 for s in layout.slots)
    assert hift.offset == ATT_BYTES and cnn.offset == ATT_BYTES + math.ceil(HIFT_BYTES / 512) * 512
    assert layout.total_bytes == 163_871_232 == cnn.offset + CNN_BYTES


def test_arena_alignment_and_algorithm_are_pluggable():
    layout = plan_arena(token2wav_like(), dims(), "float32", alignment=4096)
    verify_layout(layout)
    assert all(s.offset % 4096 == 0 for s in layout.slots) and layout.total_bytes % 4096 == 0
    assert "sequential" in ARENA_ALGORITHMS

    def reversed_order(sizes, alignment):
        offsets, cursor = [0] * len(sizes), 0
        for i in reversed(range(len(sizes))):
            offsets[i] = cursor
            cursor += -(-sizes[i][1] // alignment) * alignment
        return offsets

    layout = plan_arena(token2wav_like(), dims(), "float32", algorithm=reversed_order)
    verify_layout(layout)
    assert layout.slot("cnn").offset == 0
    with pytest.raises(PlanError, match="unknown arena algorithm 'best_fit'"):
        plan_arena(token2wav_like(), dims(), "float32", algorithm="best_fit")
    with pytest.raises(PlanError, match="power of two"):
        plan_arena(token2wav_like(), dims(), "float32", alignment=500)
    with pytest.raises(PlanError, match="1 offsets for 3 regions"):
        plan_arena(token2wav_like(), dims(), "float32", algorithm=lambda sizes, a: [0])


def test_verify_layout_catches_overlap_misalignment_and_overflow():
    a = RegionSlot("att", 0, (1024,), "float32", 4096, 0, 1024)
    b = RegionSlot("hift_mel", 3584, (256,), "float32", 1024, 0, 256)
    c = RegionSlot("cnn", 512, (4,), "float32", 16, None, None)  # nested inside att
    with pytest.raises(PlanError, match=r"regions 'att' \[0, 4096\) and 'hift_mel' \[3584, 4608\) overlap"):
        verify_layout(ArenaLayout((a, b), 8192, 512))
    with pytest.raises(PlanError, match="regions 'att' .* and 'cnn' .* overlap"):
        verify_layout(ArenaLayout((a, RegionSlot("hift_mel", 4096, (256,), "float32", 1024, 0, 256), c), 8192, 512))
    with pytest.raises(PlanError, match="region 'hift_mel': arena offset 4100"):
        verify_layout(ArenaLayout((a, RegionSlot("hift_mel", 4100, (256,), "float32", 1024, 0, 256)), 8192, 512))
    with pytest.raises(PlanError, match="region 'hift_mel': slot .* runs past the arena's 4608 bytes"):
        verify_layout(ArenaLayout((a, RegionSlot("hift_mel", 4096, (256,), "float32", 1024, 0, 256)), 4608, 512))
    with pytest.raises(PlanError, match="region 'att': slot spans 4096 bytes"):
        verify_layout(ArenaLayout((RegionSlot("att", 0, (1024,), "float16", 4096, 0, 1024),), 4096, 512))


def test_unbounded_region_has_no_slot():
    log = Region("log", "token", (1, "T"), axis=1, retention=Unbounded(), dtype="int64")
    layout = plan_arena(token2wav_like(log), dims(), "float32")
    assert [s.name for s in layout.slots] == ["att", "hift_mel", "cnn"]
    with pytest.raises(PlanError, match="region 'log' has no arena slot"):
        layout.slot("log")


# --- verdicts ------------------------------------------------------------------

def test_region_verdicts():
    log = Region("log", "token", (1, "T"), axis=1, retention=Unbounded(), dtype="int64")
    v = region_verdicts(token2wav_like(log), dims())
    assert [(x.subject, x.verdict) for x in v] == [("att", "in"), ("hift_mel", "in"), ("cnn", "in"), ("log", "out")]
    assert v[0].reason.startswith("Window(retain=100, prefix=prompt_frames) on clock mel, stride 50: K=3")
    assert v[3].reason == "unbounded growth: no finite catalog" and v[3].kind == "region"
    with pytest.raises(PlanError, match="kind='function'"):
        ScopeVerdict("decoder.forward", "function", "in", "static shapes")


# --- plan ----------------------------------------------------------------------

STOCK = 16 * 16 * 2 * 8 * 1000 * 128 * 4  # Step-Audio2's att_cache_buffer, fp32


def test_make_plan_json_round_trip():
    extra = ScopeVerdict("hift.f0_predictor", "callable", "out", "host sync (.item())")
    plan = make_plan(token2wav_like(), dims(), TOKENS_IN, stock_state_bytes=STOCK, extra_verdicts=[extra])
    assert plan.arena_bytes == plan.layout.total_bytes == 163_871_232
    doc = plan.to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert set(doc) >= {"clocks", "regions", "catalog", "verdicts", "arena_bytes", "stock_state_bytes",
                        "dims", "dtype", "device"}
    att = doc["regions"][0]
    assert att["catalog_width"] == 3 and att["bytes"] == ATT_BYTES and att["offset"] == 0
    assert att["shape"] == [5, 16, 2, 8, 250, 128] and att["buffers"] == ["decoder.att_cache_buffer"]
    assert att["retention"] == {"policy": "Window", "retain": 100, "prefix": "prompt_frames"}
    assert [e["steps"] for e in doc["catalog"]] == [[0], [1], "2+"]
    assert doc["catalog"][2]["regions"]["att"]["shape"] == [5, 16, 2, 8, 200, 128]
    assert doc["verdicts"][-1]["subject"] == "hift.f0_predictor"
    assert plan.entry_for_step(9) is plan.catalog[-1]


def test_explain_mentions_everything():
    text = make_plan(token2wav_like(), dims(), TOKENS_IN, stock_state_bytes=STOCK).explain()
    for needle in ["att", "hift_mel", "cnn", "K=3", "arena_bytes", "163,871,232", "stock_state_bytes",
                   f"{STOCK:,}", "7.8%"]:
        assert needle in text, needle


def test_plan_package_is_pure_python():
    # The plan must be derivable on a machine with no GPU and no torch import.
    for path in (pathlib.Path(__file__).parents[1] / "cadence_fx" / "plan").glob("*.py"):
        source = path.read_text()
        assert "import torch" not in source and "torch.cuda" not in source, path.name


class TestExplain(TestCase):
    def test_explain_small_plan(self):
        decl = Declaration(
            clocks=[Clock("token", 25, 25), Clock("mel", 50, 50)],
            regions=[
                Region("att", "mel", (2, "T", 4), axis=1, retention=Window(100, prefix="prompt_frames"),
                       buffers=("decoder.att_cache_buffer",)),
                Region("hift_mel", "mel", (1, 80, "T"), axis=2, dtype="float32", retention=Window(8)),
                Region("cnn", "mel", (1, 512, 6), retention=Fixed(), carried=False),
                Region("history", "token", (1, "T"), axis=1, dtype="int64", retention=Unbounded()),
            ],
            step="stream", unit="chunk of 25 tokens")
        plan = make_plan(decl, {"prompt_frames": 100}, TOKENS_IN, dtype="float16",
                         stock_state_bytes=2 * 1000 * 4 * 2 + 80 * 1000 * 4 + 512 * 6 * 2)
        self.assertExpectedInline(plan.explain(), """\
Plan for step 'stream' (chunk of 25 tokens): dtype float16 on cpu
dims: prompt_frames=100

Clocks
  clock  Hz  frames/step
  token  25  25
  mel    50  50

Regions (capacity = frames the arena holds along the growth axis)
  region    clock  retention                                 K  axis  capacity  arena shape   dtype    bytes   MiB   offset  carried
  att       mel    Window(retain=100, prefix=prompt_frames)  3  1     250       (2, 250, 4)   float16  4,000   0.00  0       yes
  hift_mel  mel    Window(retain=8)                          2  2     58        (1, 80, 58)   float32  18,560  0.02  4096    yes
  cnn       mel    Fixed()                                   1  -     -         (1, 512, 6)   float16  6,144   0.01  23040   no
  history   token  Unbounded()                               -  1     -         out of scope  int64    -       -     -       yes

Catalog: 3 entries (frames along each growth axis at the step's input)
  entry  steps  att  hift_mel
  0      0      100  0
  1      1      150  8
  2      2+     200  8
  fixed in every entry: cnn
  inputs in every entry: tokens (1, 28) int64 cpu

Scope verdicts
  verdict  kind    subject   reason
  in       region  att       Window(retain=100, prefix=prompt_frames) on clock mel, stride 50: K=3, capacity 250 frames
  in       region  hift_mel  Window(retain=8) on clock mel, stride 50: K=2, capacity 58 frames
  in       region  cnn       Fixed() on clock mel, stride 50: K=1, constant shape (1, 512, 6)
  out      region  history   unbounded growth: no finite catalog

Arena
  arena_bytes        29,184   (0.03 MiB, 3 slots, 512-byte aligned)
  stock_state_bytes  342,144  (0.33 MiB)
  arena / stock      8.5%     (312,960 bytes less than stock)""")
