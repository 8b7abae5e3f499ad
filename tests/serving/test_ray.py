"""The optimized Token2Wav tail on a local Ray Serve instance (issue 18): two tail
replicas (rule S, 2 flow steps, CPU; the mini Token2Wav of tests/helpers/mini_token2wav.py,
registered in every Ray worker through ``CADENCE_FX_MODELS``) behind the router, over the
Python handle, HTTP and WebSocket.  Every chunk of every conversation is checked against that
conversation run alone on the stock tail in this process (helpers/streams.py): the
float waveform with ``torch.equal``, SHA-256 of every live state tensor, and the PCM
bytes.  The replicas run this process's torch thread count (CPU bits depend on it) and
read the programs this process traced from its disk cache.

Cost: one Ray instance and one deployment for the file (~30 s on 2 cores), 5-token
prompts (one prompt length: one set of programs per replica), short streams, and one
replica restart (the killed-replica test, last).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import urllib.error
import urllib.request

import pytest
import torch

from cadence_fx.errors import InputError
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.pcm import pcm_bytes
from cadence_fx.serving import ReplicaFull, ReplicaLost, UnknownConversation
from cadence_fx.serving import wire
from cadence_fx.serving.replica import rank

from helpers import mini_token2wav as mini
from helpers.streams import STEPS, assert_chunk_exact, reference, seed_of

ray = pytest.importorskip("ray", reason="the [ray] extra (README's test command installs it)")
serve = pytest.importorskip("ray.serve")

from cadence_fx.serving import ray as cray  # noqa: E402  (after the skip: it imports ray)
from cadence_fx.tools import registry  # noqa: E402

PER_REPLICA = 2
NAMES = ["tail-0", "tail-1"]
PROMPT_TOKENS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def t2w(t2w_mini):
    """This file's Token2Wav is the mini one (tests/conftest.py ``t2w_mini``)."""
    return t2w_mini


@pytest.fixture(scope="module")
def cluster(t2w):
    """A local Ray instance with the app deployed: (handle, base URL)."""
    threads = torch.get_num_threads()
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers/ importable in the workers
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "CADENCE_FX_CACHE_DIR": os.environ["CADENCE_FX_CACHE_DIR"],
           "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p),
           registry.PLUGINS_ENV: "helpers.mini_models"}
    mini.register()  # in this process (serve-sim's stock side); Ray's workers import helpers.mini_models
    # the prompt length's programs, traced here once: both replicas load them from the disk cache
    t2w.opt.set_stream_cache(*s2.synthetic_prompt(PROMPT_TOKENS, seed=1))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20,
             runtime_env={"env_vars": env})
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    options = dict(model=mini.MODEL, rules="S", seed=0, checkpoint=None, n_timesteps=STEPS,
                   prompt_tokens=PROMPT_TOKENS, dtype="float32", device="cpu")
    app = cray.app(functools.partial(registry.build_optimized, options), replicas=2, max_conversations=PER_REPLICA,
                   torch_threads=threads, batch_wait_s=0.2, health_check_period_s=1)
    handle = serve.run(app, name="cadence", route_prefix="/cadence")
    try:
        yield handle, f"http://127.0.0.1:{port}/cadence"
    finally:
        serve.shutdown()
        ray.shutdown()
        registry.unregister(mini.MODEL)


def conversation(n: int, turns: int = 1, steady: int = 2):
    """Conversation ``n``: a 5-token prompt (seed 200 + n); per turn ``steady`` chunks and a flush."""
    prompt = s2.synthetic_prompt(PROMPT_TOKENS, seed=200 + n)
    return prompt, [s2.synthetic_chunks(steady, seed=200 + 10 * n + t, final_tokens=7) for t in range(turns)]


def assert_placed_by_rank(placed: dict, names=NAMES, full: int = PER_REPLICA) -> None:
    """Each conversation sits on its first replica in rendezvous order unless that one was
    full (holds ``full`` of the others); none holds more than ``full``.  (Opened
    concurrently, which of two rivals got the room is the replica's order of arrival.)"""
    for name in names:
        assert list(placed.values()).count(name) <= full, placed
    for c, name in placed.items():
        first = names[rank(c, names)[0]]
        assert name == first or list(placed.values()).count(first) == full, (c, placed)


def stream_together(handle, refs: dict, chunks: dict, start: dict) -> None:
    """One chunk of every conversation per round, all sent before any is read (the
    replica batches them into one tick); each chunk and state checked against stock."""
    rounds = max(len(c) for c in chunks.values())
    for k in range(rounds):
        live = [c for c in chunks if k < len(chunks[c])]
        sent = {c: handle.send.remote(c, torch.tensor(chunks[c][k][0]), chunks[c][k][1],
                                      seed_of(start[c], k), True) for c in live}
        for c in live:
            wave = torch.from_numpy(sent[c].result().copy())
            state = handle.state.remote(c).result()
            assert_chunk_exact(refs[c], k, wave, state, f"conversation {c!r}, chunk {k}")


def test_conversations_are_sticky_batched_and_each_exact_as_alone(cluster, t2w):
    handle, _ = cluster
    # turn 1: the first chunk (warm-up) and a flush; a reset (the state right after the
    # prompt's set-up); turn 2: the first chunk again, of other tokens
    convs = {c: conversation(n, turns=2, steady=1) for n, c in enumerate(["alpha", "bravo", "charlie"])}
    opening = {c: handle.open.remote(c, list(p)) for c, (p, _) in convs.items()}
    refs = [{c: reference(t2w.tail, p, turns[turn][:2 - turn], session=10 * n + turn)  # while they open
             for n, (c, (p, turns)) in enumerate(convs.items())} for turn in range(2)]
    placed = {c: r.result() for c, r in opening.items()}
    assert_placed_by_rank(placed)
    assert handle.placement.remote().result() == placed
    for turn in range(2):
        start = {c: 10 * n + turn for n, c in enumerate(convs)}
        stream_together(handle, refs[turn], {c: turns[turn][:2 - turn] for c, (_, turns) in convs.items()}, start)
        if turn == 0:
            for c in convs:
                handle.reset.remote(c).result()
    loads = {ld["replica"]: ld for ld in handle.load.remote().result()}
    shared = [n for n in NAMES if list(placed.values()).count(n) == 2]
    assert shared and loads[shared[0]]["largest"] == 2, loads  # two conversations' chunks in one tick
    for c in convs:
        assert handle.close.remote(c).result()["steps"] == 3
    assert all(ld["conversations"] == 0 for ld in handle.load.remote().result())


def test_a_full_deployment_refuses_before_set_up_and_bad_input_loses_nothing(cluster, t2w):
    handle, _ = cluster
    ids = [f"full-{n}" for n in range(2 * PER_REPLICA)]
    prompt, [chunks] = conversation(7, steady=1)
    opening = [handle.open.remote(c, list(prompt)) for c in ids]
    ref = reference(t2w.tail, prompt, chunks, session=70)  # while they open
    for r in opening:
        r.result()
    assert_placed_by_rank(handle.placement.remote().result())
    with pytest.raises(ReplicaFull, match="every replica is full"):
        handle.open.remote("one-too-many", list(prompt)).result()
    with pytest.raises(InputError, match="already open"):
        handle.open.remote(ids[0], list(prompt)).result()
    with pytest.raises(UnknownConversation, match="no conversation 'nobody' is open"):
        handle.send.remote("nobody", torch.tensor(chunks[0][0])).result()
    with pytest.raises(InputError, match="hashable"):
        handle.send.remote(["a", "list"], torch.tensor(chunks[0][0])).result()
    c = ids[0]
    with pytest.raises(InputError, match="speech tokens"):  # refused on the host: nothing ran
        handle.send.remote(c, torch.tensor([s2.VOCAB + 5] * 28)).result()
    # chunk 0 in a tick request beside an unknown id (refused alone), the flush as a send
    got = handle.tick.remote({"nobody": torch.tensor(chunks[0][0]), ids[1]: {"chunk": [1], "lasts": True},
                              c: {"chunk": torch.tensor(chunks[0][0]), "seed": seed_of(70, 0)}}, True).result()
    assert isinstance(got["nobody"], UnknownConversation)
    assert isinstance(got[ids[1]], InputError) and "got keys ['chunk', 'lasts']" in str(got[ids[1]])
    assert_chunk_exact(ref, 0, torch.from_numpy(got[c].copy()), handle.state.remote(c).result(),
                       "a tick after a refused chunk, chunk 0")
    tokens, last = chunks[1]
    wave = torch.from_numpy(handle.send.remote(c, torch.tensor(tokens), last, seed_of(70, 1), True).result().copy())
    assert_chunk_exact(ref, 1, wave, handle.state.remote(c).result(), "the flush")
    for c in ids:
        handle.close.remote(c).result()
    with pytest.raises(UnknownConversation):
        handle.reset.remote(ids[0]).result()
    # one id opened twice at once: one conversation, the other open refused
    twice = [handle.open.remote("twice", list(prompt)) for _ in range(2)]
    outcomes = []
    for r in twice:
        try:
            outcomes.append(r.result())
        except InputError as e:
            outcomes.append(e)
    assert sum(isinstance(o, InputError) and "already open" in str(o) for o in outcomes) == 1, outcomes
    assert sum(ld["conversations"] for ld in handle.load.remote().result()) == 1
    handle.close.remote("twice").result()


def _http(method: str, url: str, body=None) -> tuple[int, bytes, str]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def test_http_and_websocket_stream_the_same_bytes_and_name_errors(cluster, t2w):
    _, url = cluster
    prompt, [chunks] = conversation(8, steady=1)
    ref = reference(t2w.tail, prompt, chunks, session=80)
    body = {"prompt": [wire.encode(prompt[0], raw=False), wire.encode(prompt[1]), wire.encode(prompt[2])]}
    status, out, _ = _http("POST", f"{url}/conversations/web", body)
    assert status == 200 and json.loads(out)["replica"] in NAMES
    status, out, _ = _http("POST", f"{url}/conversations/web", body)
    assert status == 400 and json.loads(out)["error"] == "InputError"
    status, out, _ = _http("POST", f"{url}/conversations/web/chunk", {"chunk": {"dtype": "int64", "data": "x"}})
    assert status == 400 and "is not a rectangular array" in json.loads(out)["message"]
    status, out, _ = _http("POST", f"{url}/conversations/web/chunk", b"not json")
    assert status == 400 and json.loads(out)["message"] == "the request body is not JSON"
    status, out, _ = _http("POST", f"{url}/conversations/nobody/chunk", {"chunk": wire.encode(torch.tensor([1]))})
    assert status == 404 and json.loads(out)["error"] == "UnknownConversation"
    for k, (tokens, last) in enumerate(chunks):
        status, pcm, kind = _http("POST", f"{url}/conversations/web/chunk",
                                  {"chunk": {"dtype": "int64", "data": tokens}, "last": last, "seed": seed_of(80, k)})
        assert status == 200 and kind == "audio/L16"
        assert pcm == pcm_bytes(ref["waves"][k].numpy()), f"HTTP chunk {k}: PCM differs from stock"
    status, out, _ = _http("DELETE", f"{url}/conversations/web")
    assert status == 200 and json.loads(out)["steps"] == len(chunks)

    from websockets.sync.client import connect
    prompt, [chunks] = conversation(9, steady=1)
    ref = reference(t2w.tail, prompt, chunks, session=90)
    with connect(url.replace("http", "ws") + "/conversations/socket/stream", open_timeout=60) as ws:
        ws.send(json.dumps({"op": "open", "prompt": [wire.encode(t) for t in prompt]}))
        assert json.loads(ws.recv(timeout=120))["replica"] in NAMES
        ws.send(json.dumps({"op": "dance"}))
        assert json.loads(ws.recv(timeout=60))["error"] == "InputError"
        ws.send(json.dumps({"op": "chunk", "chunk": wire.encode(torch.tensor([0] * 5)), "last": "yes"}))
        assert "'last' must be true or false" in json.loads(ws.recv(timeout=60))["message"]
        for k, (tokens, last) in enumerate(chunks):  # the socket and the conversation went on
            ws.send(json.dumps({"op": "chunk", "chunk": wire.encode(torch.tensor(tokens)), "last": last,
                                "seed": seed_of(90, k)}))
            assert ws.recv(timeout=120) == pcm_bytes(ref["waves"][k].numpy()), f"WebSocket chunk {k}"
        ws.send(json.dumps({"op": "close"}))
        assert json.loads(ws.recv(timeout=60))["steps"] == len(chunks)


def test_a_killed_replica_fails_only_its_own_conversations(cluster, t2w):
    handle, _ = cluster
    ids = ["k-0", "k-1", "k-2"]
    convs = {c: conversation(20 + n, steady=1) for n, c in enumerate(ids)}
    opening = {c: handle.open.remote(c, list(convs[c][0])) for c in ids}
    refs = {c: reference(t2w.tail, convs[c][0], convs[c][1][0], session=100 + n) for n, c in enumerate(ids)}
    placed = {c: r.result() for c, r in opening.items()}
    victim = placed[ids[0]]
    lost = [c for c in ids if placed[c] == victim]
    kept = [c for c in ids if placed[c] != victim]
    assert kept, placed  # a replica holds at most PER_REPLICA of the three
    start = {c: 100 + n for n, c in enumerate(ids)}
    stream_together(handle, refs, {c: convs[c][1][0][:1] for c in ids}, start)  # chunk 0 of every one
    pid = next(ld["pid"] for ld in handle.load.remote().result() if ld["replica"] == victim)
    os.kill(pid, signal.SIGKILL)
    # the others' next chunks are sent at once and come back exact while the victim restarts
    failing = {c: handle.send.remote(c, torch.tensor(convs[c][1][0][1][0]), True) for c in lost}
    k = 1  # the flush
    sent = {c: handle.send.remote(c, torch.tensor(convs[c][1][0][k][0]), True, seed_of(start[c], k), True)
            for c in kept}
    for c in kept:
        assert_chunk_exact(refs[c], k, torch.from_numpy(sent[c].result().copy()), handle.state.remote(c).result(),
                           f"{c} on the surviving replica, chunk {k}")
    for c in lost:
        with pytest.raises(ReplicaLost, match="its state is gone"):
            failing[c].result()
        with pytest.raises(ReplicaLost):  # and every later call, until closed
            handle.reset.remote(c).result()
        assert "lost" in handle.close.remote(c).result()
    # the restarted replica takes new conversations; the id is free again
    reopening = handle.open.remote(lost[0], list(convs[lost[0]][0]))
    ref = reference(t2w.tail, convs[lost[0]][0], convs[lost[0]][1][0][:1], session=130)
    again = reopening.result()
    wave = handle.send.remote(lost[0], torch.tensor(convs[lost[0]][1][0][0][0]), False, seed_of(130, 0), True)
    assert_chunk_exact(ref, 0, torch.from_numpy(wave.result().copy()), handle.state.remote(lost[0]).result(),
                       f"{lost[0]} reopened on {again}")
    for c in kept + [lost[0]]:
        handle.close.remote(c).result()


def test_serve_sim_through_ray_is_exact_against_stock(cluster, capsys):
    """``serve-sim --ray-replicas``: the sessions as conversations of its own app on this
    Ray instance; each session's PCM equal to its own stock model's."""
    from cadence_fx.tools import cli
    code = cli.main(["serve-sim", "--model", mini.MODEL, "--ray-replicas", "1", "--sessions", "2", "--seconds", "1",
                     "--warmup-ticks", "0",
                     "--n-timesteps", str(STEPS), "--prompt-tokens", str(PROMPT_TOKENS), "--device", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["exact"] is True and report["exact_sessions"] == [True, True]
    ray_report = report["modes"]["optimized"]["ray"]
    assert ray_report["sessions_per_replica"] == {"tail-0": 2}
    assert ray_report["replicas"][0]["largest"] == 2  # the tick's two chunks launched together
    assert "cadence-serve-sim" not in serve.status().applications  # closed after the run
