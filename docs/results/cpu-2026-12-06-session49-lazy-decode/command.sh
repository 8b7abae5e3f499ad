# Session forty-nine, 2026-12-06, this 2-core CPU machine, torch 2.13.0+cpu: a decoded runnable graph
# (a capacity graph and its folded-constant recipe, programs/serialize.decode_graph) built as torch's
# lazy GraphModule, its Python code generated when it first runs, not at decode.  Run one after the
# other, nothing else running, each on a program cache of its own (the sources' digest is in the key):
git worktree add /tmp/old fee9412   # before
cd /tmp/old && PYTHONPATH=/tmp/old python benchmarks/capacity_restart.py --loads 2 --cache /tmp/cfx-old > restart-before-fee9412.txt
cd /work/main && PYTHONPATH=/work/main python benchmarks/capacity_restart.py --loads 2 --cache /tmp/cfx-new > restart-after.txt
# Released Token2Wav, 5 steps, rule S, capacity 500, windows 11 and 13, flush 3, a 111-token voice
# streamed against stock in every process.  Restarts (every graph loaded from disk):
#   before: prepare 10.04 and 10.66 s (median 10.35);  after: 6.91 and 6.52 s (median 6.71): 0.65x.
#   All six processes exact.  The process totals do not change on the CPU (rule S runs the graph,
#   so its code is generated at its first chunk instead); under SRc on a GPU the loaded graph is
#   split into pieces and never runs as itself, so its code is never generated.
# A cProfile of a restart's prepare_capacity before the change: 16.3 s under the profiler, of which
# GraphModule code generation and compile for the 12 runnable decoded graphs 5.1 s.
