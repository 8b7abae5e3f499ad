"""A stand-in bench worker speaking ``cadence_fx.tools.bench.worker``'s protocol, with scripted failures.

``python fake_bench_worker.py VARIANT BEHAVIOUR TRACE_FILE``.  Behaviours: ``ok``,
``inexact`` (its PCM hash differs from B0's), ``noisy`` (prints non-protocol lines),
``setup-error``, ``setup-hang`` (never ready; leaves a child in its process group),
``crash-block1`` / ``hang-block1`` (in block 1), ``idle-crash`` (exits after block 0
while idle).  Each process appends JSON lines to TRACE_FILE: its pid, its children's
pids, and the wall-clock span of every block it runs.
"""

import json
import subprocess
import sys
import time

variant, behaviour, trace = sys.argv[1], sys.argv[2], sys.argv[3]


def log(**rec):
    with open(trace, "a") as f:
        f.write(json.dumps(rec) + "\n")


def send(**msg):
    print(json.dumps(msg), flush=True)


log(pid=__import__("os").getpid(), variant=variant)
if behaviour == "noisy":
    print("CUDA Graph initialized successfully for chunk decoder", flush=True)
if behaviour == "setup-error":
    print("Traceback ...\nRuntimeError: no kernel image", file=sys.stderr, flush=True)
    send(event="error", variant=variant, error="RuntimeError: no kernel image")
    sys.exit(2)
if behaviour == "setup-hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    log(child=child.pid)
    time.sleep(600)
send(event="ready", variant=variant, build_s=0.1, setup_s=0.2, setup_peak_bytes=None, gpu=None, torch="fake")
ms = 10.0 if variant == "B0" else 5.0
for line in sys.stdin:
    cmd = line.split()
    if cmd == ["finish"]:
        send(event="finish", variant=variant, peak_bytes=2 ** 20, kernel_ms=ms / 2, launches=7, compile_s=0.3,
             vocoder_ms=1.0, setup_s=0.2)
        sys.exit(0)
    b = int(cmd[1])
    if b == 1 and behaviour == "crash-block1":
        print("Segmentation fault (core dumped)", file=sys.stderr, flush=True)
        sys.exit(139)
    if b == 1 and behaviour == "hang-block1":
        time.sleep(600)
    start = time.time()
    time.sleep(0.05)
    log(name=variant, block=b, start=start, end=time.time())
    pcm = f"pcm{b}" + ("x" if behaviour == "inexact" else "")
    send(event="block", variant=variant, block=b, chunk_ms=[ms] * 3, pcm_sha256=pcm, wave_sha256=f"w{b}",
         state_sha256=f"s{b}")
    if behaviour == "idle-crash":
        sys.exit(1)
