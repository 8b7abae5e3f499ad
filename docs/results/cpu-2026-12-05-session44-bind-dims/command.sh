# CPU (this machine: 2 cores, torch 2.13.0), released Token2Wav, 2 steps, rule S, capacity 500, a warm
# program cache (the symbolic steps on disk from an earlier run): prepare_capacity of a 20-token window,
# then, under cProfile, of 21- and 22-token windows and a 7-token flush (prepare_profile.py, here).
# One run before (at 6239470) and one after (at 898dc7c, bind_dims' memo), nothing else running; not paired
# in one process: read as the size of the change, not a benchmark.
python prepare_profile.py <warm cache dir>
#   bind_dims, 4 calls:  3.59 s before, 2.24 s after (_rebind 2.45 s -> 1.17 s)
#   the three shapes:   22.9 s before, 21.0 s after ("built in" 7.6/8.3/7.7 s -> 6.6/7.1/7.2 s)
# The values bind_dims records are equal node by node with and without the memo (repr and type, 2,208
# nodes of the mini model's chunk-length step bound at 9 tokens).
