"""One sweep of the passes' op classifiers (is_view, returns_written, written_args, is_mutating) over the
released Token2Wav's three rewritten 10-step graphs: as written before the per-operator schema cache
(each call reads ``t._schema``) and through ``passes.base`` (median of 3, twice).

    OMP_NUM_THREADS=1 python benchmarks/op_classify.py   (needs a program cache: the first run traces)
"""
import time, torch, statistics
torch.set_num_threads(1)
import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.passes import base
flow, hift = s2.build_modules(0)
tail = s2.Token2WavTail(flow, hift, n_timesteps=10)
opt = cadence_fx.optimize(tail, cache=True)
opt.set_stream_cache(*s2.synthetic_prompt(7, seed=3))
gms = [p.run for p in opt.session.executable.programs.values()]
print("nodes", [len(g.graph.nodes) for g in gms])
def old_is_view(node):
    t = node.target
    import operator
    if t is operator.getitem: return True
    if not isinstance(t, torch._ops.OpOverload): return False
    schema = t._schema
    if schema.is_mutable or not schema.returns: return False
    info = schema.returns[0].alias_info
    return info is not None and not info.is_write
def old_rw(node):
    t = node.target
    if not isinstance(t, torch._ops.OpOverload) or not t._schema.returns or not t._schema.arguments: return False
    ret, first = t._schema.returns[0].alias_info, t._schema.arguments[0].alias_info
    return (ret is not None and ret.is_write and first is not None and first.is_write and ret.before_set == first.before_set)
def old_written(node):
    t = node.target
    if not isinstance(t, torch._ops.OpOverload): return []
    out = []
    for i, arg in enumerate(t._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            val = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(val, torch.fx.Node): out.append(val)
    return out
def old_mut(node):
    t = node.target
    return t._schema.is_mutable if isinstance(t, torch._ops.OpOverload) else False
def run(v, r, w, m):
    t0 = time.perf_counter()
    for gm in gms:
        for n in gm.graph.nodes:
            v(n); r(n); w(n); m(n)
    return time.perf_counter() - t0
for k in range(2):
    print("old", round(statistics.median(run(old_is_view, old_rw, old_written, old_mut) for _ in range(3)), 3),
          "new", round(statistics.median(run(base.is_view, base.returns_written, base.written_args, base.is_mutating) for _ in range(3)), 3))
