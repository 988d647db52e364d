"""Probe rings (gossip/rings.py): every member probed by one observer per ring, a bounded set of
ring neighbours per member whatever N is, and so a flat count of stream handshakes per member
in the simulator (its stream model counts them as the real transport holds streams)."""

from __future__ import annotations

import random

import pytest

from bench.gossip import run
from gossip.config import GossipConfig
from gossip.messages import PushPull
from gossip.peer import Peer
from gossip.probing import neighbourhood
from gossip.rings import Rings
from gossip.sim import Simulation, StreamModel
from gossip.simkeys import SimSigner, SimTrust
from tests.gossip.helpers import KEYRING, alive

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


def _formed(sim: Simulation) -> bool:
    n = len(sim.nodes)
    return all(node.peer.live_count() == n for node in sim.nodes.values())


@pytest.mark.slow
def test_a_mesh_starting_at_once_opens_a_bounded_number_of_streams_per_member() -> None:
    """128 members start at once, all joining through one seed: each opens streams to its ring
    neighbours and the catch-up push-pulls ride them, so formation costs each member a bounded
    number of handshakes (SWIM's order: ~77 each by the full view, ~230 30 s later)."""
    model = StreamModel(64)
    sim = Simulation(n=128, seed=1, warm=False, streams=model)
    now = 0.0
    while not _formed(sim):
        assert now < 30.0, "no full view everywhere within 30 simulated seconds"
        now += 0.25
        sim.run_until(now)
    sim.run_until(now + 30.0)  # the catch-up window and the first regular push-pulls
    ends_per_member = 2 * model.handshakes / len(sim.nodes)
    assert ends_per_member <= 4 * K + 8, ends_per_member
    held = sorted(model.open_counts(sim.nodes))
    assert held[-2] < 64  # only the seed, which every member joined through, filled its pool


def _starting_peer(health: int) -> Peer:
    cfg = GossipConfig(
        node_id="me",
        addr="me:1",
        boot_incarnation=100,
        start_health_score=health,
        probe_interval_s=1000.0,  # no probe in the window (nobody here would answer one)
    )
    peer = Peer(cfg, SimSigner("me", KEYRING), SimTrust(KEYRING), [], 0.0, random.Random(1))
    for i in range(40):
        peer.receive("x:1", alive(f"m{i:02d}", 1), 0.0)
    peer.take_outgoing()
    return peer


def test_catch_up_push_pulls_go_to_ring_neighbours_and_back_off_when_slow() -> None:
    """A member still catching up push-pulls a neighbour (its stream is open), every 1.5 s
    while healthy and slower while its local health says it is slow."""
    paces: dict[int, float] = {}
    for health in (0, 3):
        peer = _starting_peer(health)
        nb = neighbourhood(peer)
        assert nb is not None and len(nb.contacts) <= 2 * K
        neighbours = {m.addr for m in nb.contacts}
        sends = 0
        now = 0.0
        while now < 20.0:
            now = max(now + 0.01, min(peer.get_timer() or now + 0.1, now + 0.1))
            peer.handle_timer(now)
            for addr, msg in peer.take_outgoing()[0]:
                if isinstance(msg, PushPull) and msg.phase == 0:
                    assert addr in neighbours
                    sends += 1
        paces[health] = sends
    assert paces[0] >= 6 and paces[3] <= paces[0] / 2, paces


def test_a_hint_moves_only_a_ring_neighbour_to_the_front_of_the_probes() -> None:
    """A stream that ended is a hint to probe its peer next; on the rings only a neighbour's
    counts (a non-neighbour's observers hold its streams and got the same hint)."""
    peer = _starting_peer(0)
    nb = neighbourhood(peer)
    assert nb is not None
    near = nb.subjects[0].node
    far = next(m.node for m in peer._others if m not in nb.contacts)
    assert not peer.probe_soon(far, 1.0)
    assert peer.probe_soon(near, 1.0)


def test_the_measured_round_trips_kept_are_the_ring_neighbours_only() -> None:
    """A member once probed keeps RTT samples after the rings moved it away; the history's link
    series (``measured_nodes``) are the neighbours', a few whatever N, not every member's."""
    peer = _starting_peer(0)
    nb = neighbourhood(peer)
    assert nb is not None
    near = nb.subjects[0]
    far = next(m for m in peer._others if m not in nb.contacts)
    for m in (near, far):  # samples to both: ``far`` was a neighbour before the others joined
        peer._vivaldi.update(m.node, peer._vivaldi.coord, 0.002)
    assert peer.measured_nodes() == [near.node]
