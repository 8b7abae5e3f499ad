# CPU (this machine: 2 cores, torch 2.13.0), released Token2Wav, 5 steps, rule S, capacity 512, at ccb99d9
# (stream_checks.py's --idle added after; its measuring unchanged); nothing else running:
python benchmarks/stream_checks.py --idle --json checks-ccb99d9.json > stdout-ccb99d9.txt
# Each voice of N tokens (checks on the chunk) is paired with one of N+1 given session.idle() after its
# three steady chunks: the window's and flush's on_shared time (check_s) 22.2 ms p50 -> 3.4 ms p50
# (what is left: the shared graph's lookup, serves(), at_stream); idle 0.08-0.24 s for the 4 shapes;
# every chunk exact against stock.
