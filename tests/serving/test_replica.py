"""``serving.Replica`` and ``serving.Router`` (issue 18's in-process core): conversations
by id on an optimized model, admission control, sticky routing, a lost replica.  Rule S
on the CPU on the shared ``t2w`` model (tests/conftest.py); every chunk is compared
with the conversation streamed alone on the stock tail (waveform, PCM, state)."""

from __future__ import annotations

import pytest
import torch

import cadence_fx
from cadence_fx.integrations import stepaudio2 as s2
from cadence_fx.pcm import pcm_bytes
from cadence_fx.serving import Replica, ReplicaFull, ReplicaLost, Router, UnknownConversation
from cadence_fx.serving.replica import rank

from test_multi_session import assert_chunk_exact, reference, snapshot, assert_unchanged  # noqa: E402


def seed_of(session: int, chunk: int) -> int:  # what test_multi_session.reference seeds
    return 1000 * session + chunk


def conversation(n: int):
    """Conversation ``n``: a 5-token prompt (seed 90 + n) and 2 steady chunks."""
    return s2.synthetic_prompt(5, seed=90 + n), s2.synthetic_chunks(2, seed=90 + n)


def test_a_replica_serves_conversations_by_id_and_refuses_when_full(t2w):
    convs = {n: conversation(n) for n in (1, 2)}
    refs = {1: reference(t2w.tail, *convs[1], 1), 2: reference(t2w.tail, convs[2][0], convs[2][1][:1], 2)}
    replica = Replica(t2w.opt, max_conversations=2, name="gpu0")
    for n, (prompt, _) in convs.items():
        replica.open(f"c{n}", *prompt)
    with pytest.raises(ReplicaFull, match=r"gpu0 holds 2 conversations, its maximum .*refused rather than served late"):
        replica.open("c3", *convs[1][0])
    with pytest.raises(cadence_fx.InputError, match="'c1' is already open on gpu0"):
        replica.open("c1", *convs[1][0])
    with pytest.raises(UnknownConversation, match="no conversation 'c9' is open on gpu0"):
        replica.send("c9", convs[1][1][0][0])
    assert replica.load() == {"replica": "gpu0", "conversations": 2, "max": 2}

    torch.manual_seed(seed_of(1, 0))
    pcm = replica.send("c1", convs[1][1][0][0], return_waveform=True)
    assert_chunk_exact(refs[1], 0, replica._sessions["c1"].last_speech, replica._sessions["c1"].state(), "c1 chunk 0")
    assert pcm.shape == refs[1]["waves"][0].shape
    # a tick: c2's first chunk and c1's second, launched together; each seeded as stock was for it
    seeds = {"c2": seed_of(2, 0), "c1": seed_of(1, 1)}
    out = replica.tick({"c2": convs[2][1][0][0], "c1": convs[1][1][1][0]},
                       before_submit=lambda c: torch.manual_seed(seeds[c]))
    assert_chunk_exact(refs[2], 0, replica._sessions["c2"].last_speech, replica._sessions["c2"].state(), "c2 chunk 0")
    assert_chunk_exact(refs[1], 1, replica._sessions["c1"].last_speech, replica._sessions["c1"].state(), "c1 chunk 1")
    assert list(out) == ["c2", "c1"] and out["c2"] == pcm_bytes(refs[2]["waves"][0].numpy())

    # a bad chunk: refused with the library's error, the conversation unchanged
    before = snapshot(replica._sessions["c2"])
    with pytest.raises(cadence_fx.InputError, match="speech tokens must be ints"):
        replica.send("c2", [6561] * 28)
    assert_unchanged(before, [replica._sessions["c2"]])
    stats = replica.close("c1")
    assert stats["steps"] == 2 and replica.conversations() == ["c2"] and replica.load()["conversations"] == 1
    with pytest.raises(UnknownConversation, match="no conversation 'c1' is open on gpu0"):
        replica.reset("c1")  # closed
    replica.close("c2")
    with pytest.raises(cadence_fx.InputError, match="max_conversations must be an int >= 1"):
        Replica(t2w.opt, 0)


def test_the_router_keeps_each_conversation_on_its_replica_and_a_lost_one_fails_only_its_own(t2w):
    names = ["gpu0", "gpu1"]
    ids = [f"conv-{i}" for i in range(12)]
    homes = {c: names[rank(c, names)[0]] for c in ids}
    assert set(homes.values()) == set(names)  # the hash spreads ids over both
    assert all(rank(c, names) == rank(c, names) for c in ids)  # and is stable
    # a third replica takes some conversations and moves no other (rendezvous hashing)
    three = names + ["gpu2"]
    assert all(three[rank(c, three)[0]] in (homes[c], "gpu2") for c in ids)

    router = Router([Replica(t2w.opt, 1, "gpu0"), Replica(t2w.opt, 1, "gpu1")])
    a, b = (c for c in ids if homes[c] == "gpu0"), (c for c in ids if homes[c] == "gpu1")
    on0, on1 = next(a), next(b)
    (p0, chunks0), (p1, chunks1) = conversation(4), conversation(5)
    refs = {on0: reference(t2w.tail, p0, chunks0, 4), on1: reference(t2w.tail, p1, chunks1, 5)}
    assert router.open(on0, *p0) == "gpu0" and router.open(on1, *p1) == "gpu1"
    with pytest.raises(ReplicaFull, match="every live replica is full \\(gpu"):
        router.open(next(a), *conversation(6)[0])
    torch.manual_seed(seed_of(4, 0))
    router.send(on0, chunks0[0][0])
    torch.manual_seed(seed_of(5, 0))
    router.send(on1, chunks1[0][0])
    for c, n in ((on0, 0), (on1, 1)):
        s = router.replicas[n]._sessions[c]
        assert_chunk_exact(refs[c], 0, s.last_speech, s.state(), f"{c} chunk 0")
    assert router.placement() == {on0: "gpu0", on1: "gpu1"}

    assert router.mark_lost("gpu0", "dead (its process exited)") == [on0]
    with pytest.raises(ReplicaLost, match=f"'{on0}' was on gpu0, which is dead \\(its process exited\\)"):
        router.send(on0, chunks0[1][0])
    out = router.tick({on0: chunks0[1][0], on1: chunks1[1][0], "nobody": chunks1[1][0]})
    assert isinstance(out[on0], ReplicaLost) and isinstance(out["nobody"], UnknownConversation)
    assert isinstance(out[on1], bytes)  # the other conversation streamed on (its seed: whatever stands)
    with pytest.raises(ReplicaFull, match="every live replica is full \\(gpu1\\)"):
        router.open("new", *conversation(7)[0])  # gpu0 is lost, gpu1 full
    router.close(on1)
    assert router.open("new", *conversation(7)[0]) == "gpu1"
    with pytest.raises(cadence_fx.InputError, match="replica names must be distinct"):
        Router([Replica(t2w.opt, 1, "x"), Replica(t2w.opt, 1, "x")])
    for r in router.replicas:
        for c in r.conversations():
            r.close(c)
