"""Probe rings (gossip/rings.py): every member probed by one observer per ring, a bounded set of
ring neighbours per member whatever N is, and so a flat count of stream handshakes per member
in the simulator (its stream model counts them as the real transport holds streams)."""

from __future__ import annotations

import random

import pytest

from bench.gossip import run
from gossip.rings import Rings

K = 4


def _rings(n: int, seed: int) -> tuple[Rings, list[str]]:
    rng = random.Random(seed)
    ids = [f"{rng.getrandbits(64):016x}" for _ in range(n)]
    rings = Rings(K)
    for node in ids:
        rings.add(node)
    return rings, ids


@pytest.mark.parametrize("n", [2, 3, 9, 64, 300])
def test_every_member_is_probed_and_neighbours_are_bounded(n: int) -> None:
    rings, ids = _rings(n, n)
    subjects = {me: rings.neighbours(me, lambda x, me=me: x != me)[0] for me in ids}
    observers = {me: rings.neighbours(me, lambda x, me=me: x != me)[1] for me in ids}
    probed = {s for subs in subjects.values() for s in subs}
    assert probed == set(ids)  # nobody left out of every probe cycle
    for me in ids:
        assert 1 <= len(subjects[me]) <= K and 1 <= len(observers[me]) <= K
        assert me not in subjects[me] and me not in observers[me]
        for s in subjects[me]:  # a subject's observers name us: one stream serves the pair
            assert me in observers[s]


def test_dead_members_are_skipped_and_each_pinged_by_a_few() -> None:
    rings, ids = _rings(200, 7)
    dead = set(random.Random(3).sample(ids, 60))
    pingers: dict[str, int] = {}
    for me in ids:
        if me in dead:
            continue
        subs, obs, after = rings.neighbours(me, lambda x, me=me: x != me and x not in dead)
        assert not dead & set(subs + obs)
        assert set(after) <= dead
        for d in after:
            pingers[d] = pingers.get(d, 0) + 1
    assert set(pingers) == dead  # each dead member has someone to ping it
    assert max(pingers.values()) <= K  # and never the whole mesh


def test_removed_members_leave_every_ring() -> None:
    rings, ids = _rings(20, 1)
    gone = ids[5]
    rings.remove(gone)
    for me in ids:
        if me != gone:
            subs, obs, _ = rings.neighbours(me, lambda x: True)
            assert gone not in subs + obs


@pytest.mark.slow
def test_handshakes_per_member_stay_flat_past_the_stream_bound() -> None:
    """SWIM's order probes every member in turn: past the 64-stream bound each probe opened
    and evicted a stream (~12 handshakes per member per second at 256). On the rings a member
    keeps its neighbours' streams, so only push-pulls and crashes open one."""
    small = run(nodes=64, loss=0.01, seconds=40.0, seed=2, streams=64)
    large = run(nodes=256, loss=0.01, seconds=40.0, seed=2, streams=64)
    for r in (small, large):
        assert r["false_deaths"] == 0 and r["undetected"] == 0
        assert isinstance(r["open_streams_max"], int) and r["open_streams_max"] < 64
    hs_small, hs_large = small["handshakes_per_node_per_s"], large["handshakes_per_node_per_s"]
    assert isinstance(hs_small, float) and isinstance(hs_large, float)
    assert hs_large <= 0.5 and hs_large <= 1.5 * hs_small + 0.1, (hs_small, hs_large)


@pytest.mark.slow
def test_without_rings_handshakes_grow_with_n() -> None:
    """The same mesh in SWIM's own order: what the rings take away."""
    r = run(nodes=256, loss=0.01, seconds=30.0, seed=2, streams=64, probe_rings=0)
    assert isinstance(r["handshakes_per_node_per_s"], float)
    assert r["handshakes_per_node_per_s"] > 5.0
