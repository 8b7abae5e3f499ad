# Session fifty-one, 2026-12-06, this machine's CPU (2 cores, torch 2.13.0+cpu), library at 4f999c1
# plus benchmarks/working_copies.py; the two runs one after the other, nothing else running.
# Capture faked (tests/helpers/fake_capture.py), rules SRc, the released Token2Wav at 2 flow steps,
# capacity 500 with shared captures, windows of 8-9 tokens (+3) and flushes of 1-2 prepared,
# 2 conversations of 1 turn (2 steady chunks, a window, a flush), every chunk against stock.
A="--device cpu --rules SRc --n-timesteps 2 --conversations 2 --turns 1 --seed 0 --capacity 500 --prepare --shared-captures --window-range 8,9 --flush-range 1,2 --steady-range 2,2 --quiet"
python benchmarks/working_copies.py -- $A > one-copy-buffer.json           # since 4f999c1
python benchmarks/working_copies.py --clones -- $A > clones.json           # before: a clone per graph
# Capacity 500's working arena, 7 graphs (3 entries, 4 shapes), both runs exact (program_share
# and replayed_share 1.0, 8 chunks):
#   static inputs summed graph by graph  2,209.9 MiB in both (largest graph 378.6 MiB)
#   held (the storages they lie in)      clones 2,209.9 MiB (3,305 storages)
#                                        one copy buffer 1,199.6 MiB (15 storages: the buffer
#                                        doubled 14 times over the first entries; the earlier
#                                        buffers stay with the graphs captured on them)
#   peak RSS                             clones 20,760 MiB, one copy buffer 18,031 MiB
# The held bytes of clones grow with every graph; the copy buffers' stop once a buffer holds
# the largest graph's (each buffer twice the last: under four times that in all).  Not measured on a GPU: the traffic with the
# fix was cut by the device's limit (h100-2026-12-06-session51/command.sh, call 4).
