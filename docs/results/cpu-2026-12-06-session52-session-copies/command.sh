# Session fifty-two, 2026-12-06, this machine's CPU (2 cores, torch 2.13.0+cpu), library at 7b23d19
# plus benchmarks/session_copies.py.  Capture faked (tests/helpers/fake_capture.py), rules SRc, the
# released Token2Wav at 2 flow steps, one conversation of one turn (2 steady chunks, a window of 8-9
# tokens + 3, a flush of 1-2), every chunk against its own stock tail.
# The question: would a session's own graph pool gain from session 51's one copy buffer
# (GraphPool(every_input=True), which cut a working arena's static inputs from 2,209.9 to 1,199.6 MiB)?
A="--device cpu --rules SRc --n-timesteps 2 --conversations 1 --turns 1 --seed 0 --window-range 8,9 --flush-range 1,2 --steady-range 2,2 --quiet"
python benchmarks/session_copies.py -- $A > per-voice.json                         # catalog graphs
python benchmarks/session_copies.py -- $A --capacity 500 > per-voice-capacity500.json  # capacity graphs, the voice's own
# Both exact, replayed_share 1.0, 4 chunks, 5 captured entries (the catalog's 3, the window's, the
# flush's).  Their regions' static inputs that are not the session's arena (clones of their own):
#   catalog graphs        4,228 bytes in 10 storages (largest entry 880 bytes)
#   capacity 500 graphs   4,268 bytes in 15 storages (largest entry 888 bytes)
# A voice's own graphs read what the eager islands give them from its own arena: nothing for a
# copy buffer to save, so per-session pools keep every_input off.  The control, the same count of
# the working arena's graphs (the voice's graphs are shared captures there):
python benchmarks/session_copies.py -- $A --capacity 500 --shared-captures > control-working-arena.json
#   exact, 5 entries, 1,500.0 MiB summed, largest 378.6 MiB, 1,199.6 MiB held in 15 storages (the
#   copy buffers): session 51's measurement (working_copies.py), so the count is not blind.
