# CPU (this machine: 2 cores), torch 2.13.0+cpu, at f95e065 (the commit of this folder; since then
# --masked-attention is spelled --attention masked).
# Each entry the released Token2Wav (seed 0) builds for a 75-token prompt, rewritten once at
# a capacity of 500 prompt frames (passes/capacity.py), run at each length against specialize.
OMP_NUM_THREADS=1 CADENCE_FX_CACHE_DIR=$(mktemp -d) python benchmarks/capacity_form.py --n-timesteps 5 \
    --prompt-frames 100,150,222,376,500 --json exact-5steps.json
# the same with attention over padded keys masked (what a GPU build may choose where its probe finds it exact):
OMP_NUM_THREADS=1 CADENCE_FX_CACHE_DIR=$(mktemp -d) python benchmarks/capacity_form.py --n-timesteps 2 \
    --prompt-frames 150,500 --masked-attention --json masked-2steps.json
# again at 024c22b (after the review's fixes: exact nodes read copies in the step's own layout, a second
# shape check at the traced dims), the first command with --json exact-5steps-024c22b.json: the same
# verdicts (every admitted length exact, 376 refused by the guard), the same modes; rewrite 3.7-4.4 s.
# and at 5e3f282 (the host dims from capacity_ops.at_dims, the lengths as inputs, the ops as
# torch.ops.cadence_fx.*), --json exact-5steps-5e3f282.json: the same verdicts and modes.
# voices on one capacity executable against stock (rule S, the released model, 2 steps, capacity 500 frames,
# traced at 75 tokens; CPU, OMP_NUM_THREADS=2), --json sessions-cpu-2steps.json:
OMP_NUM_THREADS=2 python benchmarks/capacity_sessions.py --device cpu --n-timesteps 2 --prompt-tokens 75,111 \
    --chunks 3 --attention exact --json sessions-cpu-2steps.json
# both voices exact on every chunk (the flush eager); a chunk's median 1,021 and 972 ms against stock's 708 and
# 709 ms: on the CPU the capacity form's exact attention reads copies of its keys in the step's layout and its
# writes cover the capacity (a cost to measure on the GPU with the masked attention, where neither runs so).
# a CPU dry run of capacity_call.sh's three scripts at a43e9b5 (2 steps, --attention probe): each rc=0 and
# exact; the CPU's probe finds the masked attention unequal ("the masked call differs here"), so its DiT
# attention stays exact; capacity_sessions at 75 and 250 tokens (the capacity) exact on every chunk.
