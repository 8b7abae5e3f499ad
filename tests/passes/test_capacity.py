"""passes.capacity: one graph for every prompt length, its sizes held at a capacity.

Each symbolic step is rewritten once at a capacity and run at several prompt lengths
against the graph ``specialize`` makes at each, on the same inputs, state and buffers;
the padding past every live prefix holds NaN or another value, which must never reach a
result (``torch.equal`` on every output's and buffer's live part).  The toy steps pin the
plan and the graph; the mini Token2Wav's entries (upstream's own classes) run the rewrite
on a real decoder's programs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

from cadence_fx.errors import SpecializationRefused
from cadence_fx.passes import capacity as cap
from cadence_fx.passes.capacity_ops import masked_attention
from cadence_fx.passes.specialize import _value, specialize
from cadence_fx.passes.trace_symbolic import trace_symbolic
from cadence_fx.step import StepSignature
from helpers import growing_cache
from helpers.trace_forms import WHOLE_SLICES_TRACED

F32 = torch.float32
CPU = torch.device("cpu")
FILLS = (float("nan"), 3.0)


def pad(t: torch.Tensor, shape, fill: float) -> torch.Tensor:
    out = torch.full(tuple(shape), fill, dtype=t.dtype) if t.is_floating_point() else torch.zeros(tuple(shape), dtype=t.dtype)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def live(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t[tuple(slice(0, n) for n in like.shape)]


def run_both(sym, gm, plan, dim: str, s: int, fill: float, seed: int = 0):
    """(specialize's outputs, the capacity graph's, buffers each left) on the same random
    tensors at ``s``; the capacity graph's padding holds ``fill``."""
    binding = cap._binding(sym, {dim: s})
    at_cap = cap._binding(sym, plan.capacity)
    g = torch.Generator().manual_seed(seed * 1000 + s)
    exact, padded = {}, {}
    for p in sym.placeholders:
        if p.name.startswith("dim_"):
            continue
        shape = [_value(x, binding, "a size") for x in p.shape]
        t = (torch.randn(shape, generator=g) * 0.5).to(p.dtype) if p.dtype.is_floating_point else \
            torch.randint(1, 100, shape, generator=g).to(p.dtype)  # live integers never 0; the padding's are
        exact[p.name] = t
        padded[p.name] = pad(t, [_value(x, at_cap, "a size") for x in p.shape], fill)
    buffers = {n[4:]: t.clone() for n, t in exact.items() if n.startswith("buf_")}
    tensors = {n: t for n, t in exact.items() if not n.startswith("buf_")}
    with torch.no_grad():
        torch.manual_seed(seed)
        want = specialize(sym, {dim: s}, tensors, buffers)(*tensors.values())
        torch.manual_seed(seed)
        with cap.at_dims({dim: s}):
            got = gm(*cap.arguments(gm, padded, {dim: torch.tensor(s)}))
    return want, got, buffers, {n[4:]: t for n, t in padded.items() if n.startswith("buf_")}


def assert_exact(sym, gm, plan, dim, s, fill, seed=0):
    cap.check_dims(plan, sym, {dim: s})
    want, got, bufs, cap_bufs = run_both(sym, gm, plan, dim, s, fill, seed)
    assert len(want) == len(got)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, live(b, a)), f"output {i} at {dim}={s}, padding {fill}"
    for r, t in bufs.items():  # written inside its live box, the rest as it was
        assert torch.equal(t, live(cap_bufs[r], t)), f"buffer {r} at {dim}={s}, padding {fill}"


# ---------------------------------------------------------------- a growing cache, trimmed, written to a buffer

def cache_step():
    """The growing-cache toy (``helpers.growing_cache``), traced at a prompt of 6."""
    return growing_cache.symbolic(6)


# ---------------------------------------------------------------- attention over a cache

SIG_ATT = StepSignature(inputs=("q", "kv"), regions=("k", "v"), outputs=("y", "z", "flat", "scaled"))


def bind_attention(buffers, dims=None):
    def step(inputs, state):
        k = torch.cat([state["k"], inputs["kv"]], dim=2)  # new frames after the cache: an offset write
        v = torch.cat([inputs["kv"] * 2, state["v"]], dim=2)  # newest first: a plain cat
        y = F.scaled_dot_product_attention(inputs["q"], k, v)  # over the padded keys
        scores = torch.softmax(inputs["q"] @ k.transpose(-1, -2) / 4, dim=-1)  # reduces over them: exact
        z = (scores @ v).transpose(1, 2).reshape(1, 3, 8)
        heads = (k * 0.5).transpose(1, 2).reshape(1, k.shape[2], 8)  # keeps the padded dim whole
        flat = k.reshape(1, -1)  # merges it with the heads and channels around it: exact
        return ({"y": y, "z": z, "flat": flat, "scaled": heads * k.shape[2]},  # a size as a value: exact
                {"k": k, "v": v})
    return step


def attention_step():
    kv = ((1, 2, ("prompt", 1, 1), 4), F32)
    return trace_symbolic(bind_attention, SIG_ATT, {"prompt": 6}, {"q": ((1, 2, 3, 4), F32), "kv": ((1, 2, 3, 4), F32)},
                          {"k": kv, "v": kv}, {}, CPU)


class TestCapacityForm(TestCase):
    def test_cache_step_pinned_and_exact_at_every_prompt_its_guards_admit(self):
        sym = cache_step()
        gm, plan = cap.capacity_form(sym, {"prompt": 40})
        if WHOLE_SLICES_TRACED:  # torch 2.5 records the whole slices too: each a capacity view
            self.assertExpectedInline(plan.explain(), """\
capacity form: prompt <= 40; attention over padded keys: exact
  capacity: 11 nodes (masked write 1, offset cat 2, pointwise 1, slice 3, view 4)
  exact: 1 nodes (slices a padded dim from a symbolic start 1)
  islands: 1, largest 1 nodes""")
        else:
            self.assertExpectedInline(plan.explain(), """\
capacity form: prompt <= 40; attention over padded keys: exact
  capacity: 7 nodes (masked write 1, offset cat 2, pointwise 1, slice 3)
  exact: 1 nodes (slices a padded dim from a symbolic start 1)
  islands: 1, largest 1 nodes""")
        # the graph, its symbol named as this torch names it: the cache grows at a device
        # offset, the trim's tail is an island (a host size), the buffer write is masked
        code = gm.code.strip().replace(str(sym.symbols["prompt"]), "s")
        if not WHOLE_SLICES_TRACED:
            self.assertExpectedInline(code, """\
def forward(self, in_x, in_len_prompt, state_cache, buf_buf):
    within = cadence_fx_passes_capacity_ops_within(('prompt',), (40,), ('s',), ('s + 5 > 8', 's >= 4'), ('s', 's + 10', 's + 3', 's + 4', 's + 5'), [in_len_prompt]);  within = None
    host_size = cadence_fx_passes_capacity_ops_host_size('s + 5', ('s',), ('prompt',))
    capacity_device_size_default = torch.ops.cadence_fx.capacity_device_size.default('0', 's', [in_len_prompt])
    capacity_device_size_default_1 = torch.ops.cadence_fx.capacity_device_size.default('s + 3', 's', [in_len_prompt])
    capacity_offset_cat_default = torch.ops.cadence_fx.capacity_offset_cat.default([state_cache, in_x], 1, [capacity_device_size_default, capacity_device_size_default_1]);  state_cache = in_x = capacity_device_size_default_1 = None
    slice_tensor = torch.ops.aten.slice.Tensor(capacity_offset_cat_default, 1, 0, 40, 1)
    narrow_default = torch.ops.aten.narrow.default(capacity_offset_cat_default, 1, 0, host_size);  capacity_offset_cat_default = host_size = None
    slice_tensor_1 = torch.ops.aten.slice.Tensor(narrow_default, 1, -4, 9223372036854775807);  narrow_default = None
    capacity_device_size_default_2 = torch.ops.cadence_fx.capacity_device_size.default('s', 's', [in_len_prompt])
    capacity_offset_cat_default_1 = torch.ops.cadence_fx.capacity_offset_cat.default([slice_tensor, slice_tensor_1], 1, [capacity_device_size_default, capacity_device_size_default_2]);  slice_tensor = slice_tensor_1 = capacity_device_size_default = capacity_device_size_default_2 = None
    slice_tensor_2 = torch.ops.aten.slice.Tensor(buf_buf, 1, 0, 44, 1)
    capacity_device_size_default_3 = torch.ops.cadence_fx.capacity_device_size.default('s + 4', 's', [in_len_prompt]);  in_len_prompt = None
    capacity_masked_copy_default = torch.ops.cadence_fx.capacity_masked_copy.default(slice_tensor_2, capacity_offset_cat_default_1, [1], [capacity_device_size_default_3]);  slice_tensor_2 = capacity_device_size_default_3 = capacity_masked_copy_default = None
    slice_tensor_3 = torch.ops.aten.slice.Tensor(buf_buf, 1, 0, 44, 1);  buf_buf = None
    mul_tensor = torch.ops.aten.mul.Tensor(slice_tensor_3, 2);  slice_tensor_3 = None
    return (mul_tensor, capacity_offset_cat_default_1)""")
        else:
            self.assertExpectedInline(code, """\
def forward(self, in_x, in_len_prompt, state_cache, buf_buf):
    within = cadence_fx_passes_capacity_ops_within(('prompt',), (40,), ('s',), ('s + 5 > 8', 's + 1 <= 9223372036854775807', 's >= 4', 's <= 9223372036854775806'), ('s', 's + 10', 's + 3', 's + 4', 's + 5'), [in_len_prompt]);  within = None
    host_size = cadence_fx_passes_capacity_ops_host_size('s + 5', ('s',), ('prompt',))
    capacity_device_size_default = torch.ops.cadence_fx.capacity_device_size.default('0', 's', [in_len_prompt])
    capacity_device_size_default_1 = torch.ops.cadence_fx.capacity_device_size.default('s + 3', 's', [in_len_prompt])
    capacity_offset_cat_default = torch.ops.cadence_fx.capacity_offset_cat.default([state_cache, in_x], 1, [capacity_device_size_default, capacity_device_size_default_1]);  state_cache = in_x = capacity_device_size_default_1 = None
    slice_tensor = torch.ops.aten.slice.Tensor(capacity_offset_cat_default, 0, 0, 9223372036854775807)
    slice_tensor_1 = torch.ops.aten.slice.Tensor(slice_tensor, 1, 0, 40, 1);  slice_tensor = None
    slice_tensor_2 = torch.ops.aten.slice.Tensor(capacity_offset_cat_default, 0, 0, 9223372036854775807);  capacity_offset_cat_default = None
    narrow_default = torch.ops.aten.narrow.default(slice_tensor_2, 1, 0, host_size);  slice_tensor_2 = host_size = None
    slice_tensor_3 = torch.ops.aten.slice.Tensor(narrow_default, 1, -4, 9223372036854775807);  narrow_default = None
    capacity_device_size_default_2 = torch.ops.cadence_fx.capacity_device_size.default('s', 's', [in_len_prompt])
    capacity_offset_cat_default_1 = torch.ops.cadence_fx.capacity_offset_cat.default([slice_tensor_1, slice_tensor_3], 1, [capacity_device_size_default, capacity_device_size_default_2]);  slice_tensor_1 = slice_tensor_3 = capacity_device_size_default = capacity_device_size_default_2 = None
    slice_tensor_4 = torch.ops.aten.slice.Tensor(buf_buf, 0, 0, 9223372036854775807)
    slice_tensor_5 = torch.ops.aten.slice.Tensor(slice_tensor_4, 1, 0, 44, 1);  slice_tensor_4 = None
    capacity_device_size_default_3 = torch.ops.cadence_fx.capacity_device_size.default('s + 4', 's', [in_len_prompt]);  in_len_prompt = None
    capacity_masked_copy_default = torch.ops.cadence_fx.capacity_masked_copy.default(slice_tensor_5, capacity_offset_cat_default_1, [1], [capacity_device_size_default_3]);  slice_tensor_5 = capacity_device_size_default_3 = capacity_masked_copy_default = None
    slice_tensor_6 = torch.ops.aten.slice.Tensor(buf_buf, 0, 0, 9223372036854775807);  buf_buf = None
    slice_tensor_7 = torch.ops.aten.slice.Tensor(slice_tensor_6, 1, 0, 44, 1);  slice_tensor_6 = None
    mul_tensor = torch.ops.aten.mul.Tensor(slice_tensor_7, 2);  slice_tensor_7 = None
    return (mul_tensor, capacity_offset_cat_default_1)""")
        for prompt in (4, 6, 9, 23, 39, 40):
            cap.check_dims(plan, sym, {"prompt": prompt})
            for fill in FILLS:
                assert_exact(sym, gm, plan, "prompt", prompt, fill, seed=prompt)

    def test_fake_values_at_the_capacity_kept_on_request(self):
        """What the compiler's passes read of a graph (``meta["val"]``): each node's value at the
        capacity, kept by ``check_shapes_at(keep_values=True)``, dropped otherwise."""
        sym = cache_step()
        gm, plan = cap.capacity_form(sym, {"prompt": 40})
        self.assertFalse(any("val" in n.meta for n in gm.graph.nodes))
        cap.check_shapes_at(gm, sym, plan, {"prompt": 40}, keep_values=True)
        [out] = [n for n in gm.graph.nodes if n.op == "output"]
        self.assertEqual([tuple(a.meta["val"].shape) for a in out.args[0]], [(1, 44), (1, 44)])

    def test_dims_past_the_capacity_or_the_guards_are_refused_by_name(self):
        sym = cache_step()
        plan = cap.plan_capacity(sym, {"prompt": 40})
        with pytest.raises(SpecializationRefused, match="prompt = 41 is past the capacity 40"):
            cap.check_dims(plan, sym, {"prompt": 41})
        with pytest.raises(SpecializationRefused, match=r"guard .*\+ 5 > 8 does not hold at \{'prompt': 3\}"):
            cap.check_dims(plan, sym, {"prompt": 3})
        with pytest.raises(SpecializationRefused, match="dims"):
            cap.check_dims(plan, sym, {"other": 6})
        with pytest.raises(cap.CapacityRefused, match="capacity for"):
            cap.plan_capacity(sym, {"other": 40})
        with pytest.raises(cap.CapacityRefused, match=r"capacity \{'prompt': 3\} is outside the step's guard"):
            cap.plan_capacity(sym, {"prompt": 3})

    def test_attention_step_runs_each_op_as_its_rule_says_and_exact(self):
        sym = attention_step()
        gm, plan = cap.capacity_form(sym, {"prompt": 32})
        self.assertEqual([(name.rstrip("_0123456789"), mode, how) for name, mode, how in plan.modes], [
            ("cat", "capacity", "offset cat"),  # k: the new frames after the cache, at a device offset
            ("cat", "capacity", "copy"),  # v: newest first, a plain cat
            ("scaled_dot_product_attention", "exact", "attention (not found exact padded here)"),
            ("transpose", "capacity", "view"),
            ("matmul", "exact", "reads a padded dim"),  # the scores: an island at the exact length
            ("div", "exact", "follows an exact island"),
            ("softmax", "exact", "follows an exact island"),
            ("matmul", "exact", "follows an exact island"),
            ("mul", "capacity", "pointwise"),
            ("transpose", "capacity", "view"),
            ("reshape", "capacity", "reshape"),  # heads: the padded dim kept whole
            ("reshape", "exact", "moves a padded dim"),  # flat: merged with the heads
            ("mul", "exact", "symbolic argument"),  # heads * k.shape[2]
        ])
        self.assertEqual(len(plan.islands), 4)
        for prompt in (2, 5, 17, 32):  # its guards: prompt >= 2
            for fill in FILLS:
                assert_exact(sym, gm, plan, "prompt", prompt, fill, seed=prompt)

    def test_masked_attention_is_planned_only_when_asked_and_hides_the_padding(self):
        sym = attention_step()
        gm, plan = cap.capacity_form(sym, {"prompt": 32}, masked_attention=True)
        self.assertIn(("scaled_dot_product_attention", "capacity", "masked attention"), plan.modes)
        self.assertIn("attention over padded keys: masked", plan.explain())
        # the padding never reaches the result: NaN or another value past the keys, the same bits
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, 40, 4, generator=g),
                   torch.randn(1, 2, 40, 4, generator=g))
        for n in (1, 9, 40):
            outs = []
            for fill in FILLS:
                kp, vp = k.clone(), v.clone()
                kp[:, :, n:], vp[:, :, n:] = fill, fill
                outs.append(masked_attention(q, kp, vp, torch.tensor(n)))
            assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])

    def test_a_probe_decides_each_attention_call_and_is_asked_once_per_call(self):
        sym = attention_step()
        asked = []

        def probe(q, k, v, live, scale=None):
            asked.append((tuple(q.shape), str(live)))
            return False
        _, plan = cap.capacity_form(sym, {"prompt": 32}, masked_attention=probe)
        self.assertEqual(asked, [((1, 2, 3, 4), str(sym.symbols["prompt"] + 4))])  # cache + 3 new keys
        self.assertIn(("scaled_dot_product_attention", "exact", "attention (the masked call differs here)"), plan.modes)
        self.assertIn("attention over padded keys: probed", plan.explain())
        # the device's own probe (here the CPU's): whatever it finds, the graph is exact
        probe = cap.attention_probe(sym, {"prompt": 32}, {"prompt": list(range(2, 33))}, CPU)
        gm, plan = cap.capacity_form(sym, {"prompt": 32}, masked_attention=probe)
        [(how,)] = {(h,) for n, _, h in plan.modes if n.startswith("scaled_dot")}
        self.assertIn(how, ("masked attention", "attention (the masked call differs here)"))
        for prompt in (2, 5, 17, 32):
            assert_exact(sym, gm, plan, "prompt", prompt, float("nan"), seed=prompt)


    def test_the_probe_is_asked_per_layout_and_scale_and_runs_the_call_as_each_side_lays_it_out(self):
        """Two attention calls of one shape, one with its own ``scale``, one over keys laid out
        transposed: the probe is asked for each (a verdict for one says nothing of the
        other), with the call's scale; ``probe_masked_attention`` runs both sides with it
        and with each operand laid out as given (at the full length, no padding, the CPU's
        masked call equals the plain one: the check that fails if either side drops them)."""
        def bind(buffers, dims=None):
            def step(inputs, state):
                k = torch.cat([state["k"], inputs["kv"]], dim=2)
                a = F.scaled_dot_product_attention(inputs["q"], k, k)
                b = F.scaled_dot_product_attention(inputs["q"], k, k, scale=0.3)
                kt = k.transpose(2, 3).contiguous().transpose(2, 3)  # the keys laid out channel-major
                c = F.scaled_dot_product_attention(inputs["q"], kt, kt)
                return {"y": a + b + c}, {"k": k}
            return step
        kv = ((1, 2, ("prompt", 1, 1), 4), F32)
        sym = trace_symbolic(bind, StepSignature(inputs=("q", "kv"), regions=("k",), outputs=("y",)), {"prompt": 6},
                             {"q": ((1, 2, 3, 4), F32), "kv": ((1, 2, 1, 4), F32)}, {"k": kv}, {}, CPU)
        asked = []

        def probe(q, k, v, live, scale=None):
            asked.append((tuple(str(x) for x in k.stride), scale))
            return False
        cap.plan_capacity(sym, {"prompt": 32}, masked_attention=probe)
        self.assertEqual(len(asked), 3, asked)
        self.assertEqual(sorted(scale for _, scale in asked if scale is not None), [0.3])
        self.assertEqual(len({stride for stride, _ in asked}), 2, asked)  # the transposed keys' own
        from cadence_fx.passes.capacity_ops import probe_masked_attention
        q, k = ((1, 2, 3, 4), (24, 12, 4, 1), 0), ((1, 2, 8, 4), (64, 32, 4, 1), 0)
        kt = ((1, 2, 8, 4), (64, 32, 1, 8), 0)
        for scale in (None, 0.3):
            self.assertTrue(probe_masked_attention(q, k, k, F32, CPU, [(8, q, k, k)], scale=scale))
            self.assertTrue(probe_masked_attention(q, kt, kt, F32, CPU, [(8, q, kt, kt)], scale=scale))


# ---------------------------------------------------------------- what an adversarial review found (session thirty-eight)

SIG_ONE = StepSignature(inputs=("x",), regions=("c",), outputs=("y",))


def one_step(body, c=((2, ("p", 1, 0)), F32), buf=None):
    """A step of one input ``x`` (1, 2), one state ``c`` (by default (2, p)) and an optional buffer."""
    def bind(buffers, dims=None):
        def step(inputs, state):
            return {"y": body(inputs["x"], state["c"], buffers.get("buf"))}, {"c": state["c"]}
        return step
    bufs = {"buf": (buf[0], buf[1], ("buf",))} if buf else {}
    return trace_symbolic(bind, SIG_ONE, {"p": 6}, {"x": ((1, 2), F32)}, {"c": c}, bufs, CPU)


def _write_through_flatten(x, c, buf):
    buf.flatten()[1] = 7.0
    return buf * 1


def _reshape_read_after_write(x, c, buf):
    flat = buf.reshape(-1)
    buf.add_(1)
    return flat * 1


BUF = ((2, ("p", 1, 0)), F32)
INT = ((1, ("p", 1, 0)), torch.int64)
EXACT_CASES = {  # each exact at every length, whatever the padding holds
    "a whole-tensor sum (its bits follow the strides: run on the step's own layout)":
        (lambda x, c, b: c.sum(), {"c": ((3, ("p", 1, 0)), F32)}, (100, 257), 300),
    "a view of a narrowed value": (lambda x, c, b: c.view(-1) * 1, {}, (3, 7), 20),
    "a tuple-valued op's item": (lambda x, c, b: torch.sort(c, dim=0).values + 1, {}, (3, 7), 20),
    "a static item of a split at a symbolic size": (
        lambda x, c, b: torch.split(c, [c.shape[1] - 3, 3], dim=1)[1] * 2, {}, (7, 9), 20),
    "a pointwise op returning a tuple": (lambda x, c, b: torch.frexp(c)[0].sum(1), {}, (3, 7), 20),
    "offsets of 2p + 6": (lambda x, c, b: torch.cat([c, c, x], 1), {"c": ((1, ("p", 1, 3)), F32)}, (3, 7), 20),
    "a cache of 2p - 1 frames": (lambda x, c, b: torch.cat([c, x], 1), {"c": ((1, ("p", 2, -1)), F32)}, (3, 7), 20),
    "integer division (zeros in the padding)": (
        lambda x, c, b: torch.div(c * 7, c, rounding_mode="floor"), {"c": INT}, (3, 7), 20),
    "random draws (as many as the live values)": (lambda x, c, b: torch.rrelu(c, training=True), {}, (3, 7), 20),
}
REFUSED_CASES = {  # a copy cannot stand for memory the step writes: refused by name, never a wrong graph
    "a write through flatten()": (_write_through_flatten, "flatten of buf_buf"),
    "a reshape read after the buffer is written": (_reshape_read_after_write, "reshape of buf_buf"),
    "as_strided": (lambda x, c, b: torch.as_strided(c, (2, 2), (2, 1)) + 0, "as_strided reads memory by offset"),
}


@pytest.mark.parametrize("case", sorted(EXACT_CASES))
def test_reviewed_steps_run_exact(case):
    body, kw, lengths, capacity = EXACT_CASES[case]
    sym = one_step(body, **kw)
    gm, plan = cap.capacity_form(sym, {"p": capacity})
    for s in lengths:
        for fill in FILLS + (-1.0,):
            assert_exact(sym, gm, plan, "p", s, fill, seed=s)
    bare, _ = cap.capacity_form(sym, {"p": capacity}, code=False)  # for a caller that only rewrites it
    assert str(bare.graph) == str(gm.graph)
    with pytest.raises(RuntimeError, match="code was not generated"):
        bare(*[torch.zeros(()) for n in bare.graph.nodes if n.op == "placeholder"])


def _vals(gm) -> list:
    def one(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device)
        return tuple(one(x) for x in v) if isinstance(v, (list, tuple)) else v
    return [(n.name, one(n.meta.get("val"))) for n in gm.graph.nodes]


def _unsqueezed_in_place(x, c, b):  # (of a padded value: refused, "a value whose memory the step writes")
    y = x * 2
    y.unsqueeze_(0)  # its sizes change after the node that made it
    return c * y.sum()


@pytest.mark.parametrize("case", sorted(EXACT_CASES) + ["an unsqueeze_ of a value"])
def test_kept_values_are_the_snapshots_fake_tensor_prop_takes(case, monkeypatch):
    """``check_shapes`` keeps each node's value as it was made, without FakeTensorProp's copy
    of it, where no node changes a tensor's layout in place: every node's value at the
    capacity (size, stride, offset, dtype, device) is what the copying prop records; a graph
    with such a node (``unsqueeze_``) takes the copies."""
    body, kw, _, capacity = EXACT_CASES.get(case) or (_unsqueezed_in_place, {}, None, 20)
    sym = one_step(body, **kw)
    gm, plan = cap.capacity_form(sym, {"p": capacity})
    inplace = [n for n in gm.graph.nodes if n.op == "call_function" and cap._changes_metadata(n.target)]
    assert bool(inplace) == (body is _unsqueezed_in_place), inplace
    cap.check_shapes_at(gm, sym, plan, {"p": capacity}, keep_values=True)
    kept = _vals(gm)
    monkeypatch.setattr(cap, "_changes_metadata", lambda target: True)  # FakeTensorProp's own run_node
    cap.check_shapes_at(gm, sym, plan, {"p": capacity}, keep_values=True)
    assert kept == _vals(gm)


def test_ops_that_change_a_layout_in_place_are_told_apart():
    from cadence_fx.passes.capacity_ops import host_size
    aten = torch.ops.aten
    for op in (aten.unsqueeze_.default, aten.t_.default, aten.transpose_.default, aten.resize_.default,
               aten.as_strided_.default, aten.set_.source_Tensor, lambda x: x):  # (a callable: unknown)
        assert cap._changes_metadata(op), op
    import operator
    for op in (aten.add.Tensor, aten.copy_.default, aten.index_put_.default, aten.view.default,
               operator.getitem, host_size, torch._C._set_grad_enabled):
        assert not cap._changes_metadata(op), op


@pytest.mark.parametrize("case", sorted(REFUSED_CASES))
def test_reviewed_steps_refused_by_name(case):
    body, match = REFUSED_CASES[case]
    sym = one_step(body, buf=BUF)
    with pytest.raises(cap.CapacityRefused, match=match):
        cap.capacity_form(sym, {"p": 20})


def test_a_length_past_the_capacity_never_runs():
    sym = one_step(lambda x, c, b: c * 2)
    gm, _ = cap.capacity_form(sym, {"p": 20})
    with pytest.raises(ValueError, match="p = 21 is outside the capacity form's 0..20"), cap.at_dims({"p": 21}):
        gm(torch.zeros(1, 2), torch.tensor(21), torch.zeros(2, 20))
    with pytest.raises(RuntimeError, match=r"runs inside capacity_ops.at_dims naming \['p'\]"):
        gm(torch.zeros(1, 2), torch.tensor(5), torch.zeros(2, 20))  # no dims given: never a guess


def test_mini_token2wav_entries_exact_at_other_prompt_lengths(t2w_mini):
    """Every symbolic step the mini Token2Wav holds, rewritten once, against specialize at
    prompt lengths other than the one it was traced at (its guards permitting)."""
    from helpers.mini_token2wav import catalog_steps
    steps = list(catalog_steps(t2w_mini.opt).values())
    assert len(steps) == 3
    checked = 0
    for sym in steps:
        gm, plan = cap.capacity_form(sym, {"prompt_frames": 300})
        assert plan.counts()["capacity"].get("offset cat")  # the caches grow in place
        traced = sym.dims["prompt_frames"]
        for s in sorted({traced + 2, 150, 300} - {traced}):
            try:
                cap.check_dims(plan, sym, {"prompt_frames": s})
            except SpecializationRefused:
                continue
            assert_exact(sym, gm, plan, "prompt_frames", s, float("nan"), seed=s)
            checked += 1
    assert checked >= 2 * len(steps)


def test_the_rule_s_passes_take_a_capacity_graph_and_one_arena_serves_every_length(t2w_mini):
    """Architecture item 4's wiring, as far as it goes: each mini Token2Wav entry rewritten at a
    capacity of 160 prompt frames, its buffers bound to an arena laid out by the plan at the
    capacity, through the compiler's own rule-S passes (``StateRewrite`` puts the state in the
    arena, ``EarlyWriteback`` checks it by running the graph); then the one graph runs in that
    one arena at other prompt lengths (NaN past every live prefix) and leaves in the arena, and
    returns, the bits ``specialize``'s graph gives at each length."""
    from cadence_fx import step as meta
    from cadence_fx.compiler import build_plan, region_bindings, region_buffers, rewrite_pipeline
    from cadence_fx.integrations import stepaudio2 as s2
    from cadence_fx.runtime.arena import Arena
    from helpers.mini_token2wav import catalog_steps
    opt, capacity = t2w_mini.opt, 160
    spk = s2.synthetic_prompt(40, seed=3)[2]
    adapter = opt.adapter_for(capacity, spk)
    plan = build_plan(adapter)
    checked = 0
    for index, sym in catalog_steps(opt).items():
        entry = plan.catalog[index]
        arena = Arena(plan.layout, CPU)
        gm, cplan = cap.capacity_form(sym, {"prompt_frames": capacity},
                                      buffers=region_buffers(adapter.declaration, arena), keep_values=True)
        gm.meta[meta.EXAMPLE_INPUTS] = list(adapter.example_inputs().values()) + [torch.tensor(capacity)]
        with cap.at_dims({"prompt_frames": capacity}):
            gm, _ = rewrite_pipeline(region_bindings(plan, entry), "S", "cpu")(gm)
        regions = meta.arena_inputs(gm)
        for s in (sym.dims["prompt_frames"] + 2, 150):
            try:
                cap.check_dims(cplan, sym, {"prompt_frames": s})
            except SpecializationRefused:
                continue
            binding = cap._binding(sym, {"prompt_frames": s})
            g = torch.Generator().manual_seed(s)
            exact = {}
            for p in sym.placeholders:
                if p.name.startswith(("in_", "state_", "buf_")):
                    shape = [_value(x, binding, "a size") for x in p.shape]
                    exact[p.name] = ((torch.randn(shape, generator=g) * 0.5).to(p.dtype) if p.dtype.is_floating_point
                                     else torch.randint(1, 100, shape, generator=g).to(p.dtype))
            for r in regions:  # the old state and the buffers, live prefixes in the arena, NaN past them
                full = arena.full(r)
                full.fill_(float("nan"))
                src = exact.get(f"state_{r}", exact.get(f"buf_{r}"))
                full[tuple(slice(0, n) for n in src.shape)] = src
            inputs = {n: t for n, t in exact.items() if n.startswith("state_") or n.startswith("in_")}
            buffers = {n[4:]: t.clone() for n, t in exact.items() if n.startswith("buf_")}
            with torch.no_grad():
                torch.manual_seed(0)
                want = specialize(sym, {"prompt_frames": s}, inputs, buffers)(*inputs.values())
                torch.manual_seed(0)
                with cap.at_dims({"prompt_frames": s}):
                    got = gm(*[exact[f"in_{n}"] for n in meta.signature(sym.gm).inputs], torch.tensor(s),
                             *[arena.full(r) for r in regions])
            sig = meta.signature(sym.gm)
            assert len(got) == len(sig.outputs)
            for a, b in zip(want[:len(sig.outputs)], got):
                assert torch.equal(a, live(b, a)), (index, s)
            for r, new in zip(sig.regions, want[len(sig.outputs):]):  # the next state, in the arena
                assert torch.equal(new, live(arena.full(r), new)), (index, s, r)
            checked += 1
    assert checked >= 3


# ---------------------------------------------------------------- a second review's findings (session thirty-eight)

def test_a_masked_write_keeps_an_integer_destination_bit_for_bit():
    sym = one_step(lambda x, c, b: (b[:, :c.shape[1]].copy_(c * 0.5), b * 1)[1], buf=((2, ("p", 1, 5)), torch.int64))
    gm, plan = cap.capacity_form(sym, {"p": 20})
    s, x, c = 4, torch.randn(1, 2), torch.randn(2, 4)
    buf = torch.full((2, s + 5), 2 ** 40 + 1)  # past the written prefix: kept, not rounded through float
    want = specialize(sym, {"p": s}, {"in_x": x, "state_c": c}, {"buf": buf.clone()})(x, c)
    held = pad(buf, (2, 25), 0)
    with cap.at_dims({"p": s}):
        got = gm(*cap.arguments(gm, {"in_x": x, "state_c": pad(c, (2, 20), float("nan")), "buf_buf": held},
                                {"p": torch.tensor(s)}))
    assert torch.equal(want[0], live(got[0], want[0])) and torch.equal(live(held, buf), want[0])


def test_an_expanded_value_read_by_an_exact_op_and_3d_attention_stays_exact():
    sym = one_step(lambda x, c, b: c.unsqueeze(0).expand(3, 2, c.shape[1]).sum(-1))  # a stride-0 layout
    gm, plan = cap.capacity_form(sym, {"p": 20})
    for s in (3, 7):
        assert_exact(sym, gm, plan, "p", s, float("nan"), seed=s)

    def att3(x, c, b):  # [batch, tokens, channels]: not the measured form, so never masked
        q = x.reshape(1, 1, 2).expand(1, 3, 2) * 1
        k = c.t().unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, k * 2)
    sym = one_step(att3)
    gm, plan = cap.capacity_form(sym, {"p": 20}, masked_attention=True)
    assert ("scaled_dot_product_attention", "exact", "attention not over [batch, heads, tokens, channels]") in plan.modes
    assert_exact(sym, gm, plan, "p", 5, float("nan"), seed=5)


def test_the_graph_refuses_lengths_its_guards_refuse_and_disagreeing_lengths():
    sym = cache_step()  # guards: prompt + 5 > 8
    gm, plan = cap.capacity_form(sym, {"prompt": 40})
    x, c, buf = torch.randn(1, 2), torch.randn(1, 6), torch.randn(1, 13)
    args = cap.arguments(gm, {"in_x": x, "state_cache": pad(c, (1, 43), 0.0), "buf_buf": pad(buf, (1, 50), 0.0)},
                         {"prompt": torch.tensor(3)})
    with pytest.raises(ValueError, match=r"guard .*\+ 5 > 8 does not hold"), cap.at_dims({"prompt": 3}):
        gm(*args)
    args = cap.arguments(gm, {"in_x": x, "state_cache": pad(c, (1, 43), 0.0), "buf_buf": pad(buf, (1, 50), 0.0)},
                         {"prompt": torch.tensor(6)})
    with pytest.raises(ValueError, match="len_prompt is 6, the dims say 5"), cap.at_dims({"prompt": 5}):
        gm(*args)


def test_bound_buffers_and_input_names_checked_by_name():
    sym = cache_step()
    for buffers, match in (({}, "bound to nothing"), ({"buf": torch.zeros(1, 49)}, r"bound to \(1, 49\)"),
                           ({"buf": torch.zeros(1, 50, dtype=torch.int64)}, r"bound to \(1, 50\) torch.int64")):
        with pytest.raises(cap.CapacityRefused, match=f"buffer 'buf': {match}"):
            cap.capacity_form(sym, {"prompt": 40}, buffers=buffers)
    sig = StepSignature(inputs=("len_p",), regions=("c",), outputs=("y",))

    def bind(buffers, dims=None):
        return lambda i, s: ({"y": torch.cat([s["c"], i["len_p"]], 1)}, {"c": s["c"]})
    clash = trace_symbolic(bind, sig, {"p": 6}, {"len_p": ((1, 2), F32)}, {"c": ((1, ("p", 1, 0)), F32)}, {}, CPU)
    with pytest.raises(cap.CapacityRefused, match="an input named len_p"):
        cap.capacity_form(clash, {"p": 20})


def test_the_ops_schemas_and_fake_implementations():
    """torch.library.opcheck: each op's schema (what it writes), its fake implementation
    (shapes, dtypes, strides, storage offsets) and its dispatch, on small examples."""
    from cadence_fx.passes import capacity_ops as ops
    n = torch.tensor(3)
    cases = [
        (ops.faithful, (torch.randn(2, 3), [2, 3], [5, 1], 2)),
        (ops.device_size, ("s + 2", "s", [n])),
        (ops.offset_cat, ([torch.randn(1, 5), torch.randn(1, 2)], 1, [torch.tensor(0), n])),
        (ops.masked_copy, (torch.randn(2, 5), torch.randn(2, 5), [1], [n])),
        (ops.masked_attention, (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), n, None)),
        (ops.to_capacity, (torch.randn(2, 3), [2, 5])),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_a_step_with_its_chunk_length_bound_then_held_at_a_capacity_in_its_prompt():
    """``specialize.bind_dims``: an off-catalog chunk's step (symbolic in its chunk length and
    the prompt) at one chunk length is the step ``specialize`` makes at both, and its capacity
    form in the prompt alone is exact at other prompt lengths: one graph per chunk length,
    every voice."""
    from cadence_fx.passes.specialize import bind_dims
    sig = StepSignature(inputs=("x",), regions=("c",), outputs=("y",))

    def bind(buffers, dims=None):
        def step(inputs, state):
            cache = torch.cat([state["c"], inputs["x"]], dim=1)  # (1, p + q)
            y = inputs["x"] @ torch.ones(inputs["x"].shape[1], 3)  # over the chunk: its own length
            return {"y": y * cache.sum()}, {"c": cache}
        return step
    sym = trace_symbolic(bind, sig, {"p": 6, "q": 4}, {"x": ((1, ("q", 1, 0)), F32)},
                         {"c": ((1, ("p", 1, 0)), F32)}, {}, CPU)
    bound = bind_dims(sym, {"q": 5})
    assert bound.dims == {"p": 6} and set(sym.dims) == {"p", "q"}  # the original untouched
    x, c = torch.randn(1, 5), torch.randn(1, 9)
    t = {"in_x": x, "state_c": c}
    with torch.no_grad():
        want = specialize(sym, {"p": 9, "q": 5}, t, {})(x, c)
        got = specialize(bound, {"p": 9}, t, {})(x, c)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    gm, plan = cap.capacity_form(bound, {"p": 30})
    for s in (2, 9, 30):
        for fill in FILLS:
            assert_exact(bound, gm, plan, "p", s, fill, seed=s)
    with pytest.raises(SpecializationRefused, match="does not hold at"):
        bind_dims(sym, {"q": 1})  # the trace's own guard: q >= 2
    with pytest.raises(SpecializationRefused, match="all of them: specialize"):
        bind_dims(sym, {"p": 6, "q": 5})


def test_sizes_function_computes_what_size_at_computes_for_every_size():
    """``capacity_ops.sizes_function`` (the prepare's reports read every extent at every prompt
    length through it) gives ``size_at``'s value for each text at each binding, ints as they
    are (a float is left for the caller to refuse, as ``size_at`` refuses it), and refuses
    symbol names that are not Python names."""
    from cadence_fx.passes.capacity_ops import size_at, sizes_function
    texts = ("2*s0 + 99", "s0 + s1", "(s0 + 99)//25", "-s1 + 3*s0", "max(s0, s1) - 1")
    names = ("s0", "s1")
    f = sizes_function(texts, names)
    for values in [(0, 0), (1, 7), (176, 3), (500, 28), (13, 999)]:
        got = f(*values)
        assert got == tuple(size_at(t, names, *values) for t in texts), values
        assert all(type(v) is int for v in got)
    assert sizes_function((), names)(5, 6) == ()
    assert sizes_function(("s0 / 2",), names)(5, 6) == (2.5,)  # not an int: the caller refuses it
    with pytest.raises(ValueError, match="not an int"):
        size_at("s0 / 2", names, 5, 6)
    with pytest.raises(ValueError, match="not Python names"):
        sizes_function(("1",), ("s-0",))
