"""The core in the simulator: convergence, detection, refutation, loss, starvation, partitions,
restarts. All time is simulated; nothing sleeps."""

from __future__ import annotations

from gossip.events import Event, MemberDead, MemberJoined
from gossip.messages import MemberDigest, MemberState, Ping, PushPull
from gossip.sim import _RELIABLE, Simulation, fast_config
from tests.gossip.helpers import KEYRING, suspect


def _views_full(sim: Simulation, ids: list[str]) -> bool:
    for nid in ids:
        p = sim.peer(nid)
        alive = {m.node for m in p.members() if m.state == MemberState.ALIVE}
        if alive != set(ids):
            return False
    return True


def test_cold_join_of_50_converges() -> None:
    sim = Simulation(n=50, seed=3, warm=False)
    ids = sorted(sim.nodes)
    t = 0.0
    while not _views_full(sim, ids) and t < 60.0:
        t += 1.0
        sim.run_until(t)
    assert _views_full(sim, ids), "50 nodes did not converge from one seed within 60 s"
    assert t <= 20.0


def test_crash_is_detected_by_all() -> None:
    dead_at: dict[str, float] = {}

    def on(nid: str, ev: Event) -> None:
        if isinstance(ev, MemberDead) and ev.node == "n0007":
            dead_at[nid] = ev.at

    sim = Simulation(n=50, seed=4, on_event=on)
    sim.run_until(5.0)
    sim.crash("n0007")
    sim.run_until(25.0)
    live = [i for i in sim.nodes if i != "n0007"]
    assert set(dead_at) == set(live)
    assert max(dead_at.values()) - 5.0 < 10.0
    for nid in live:
        info = sim.peer(nid).member("n0007")
        assert info is not None and info.state == MemberState.DEAD


def test_false_suspicion_is_refuted() -> None:
    deaths: list[MemberDead] = []
    sim = Simulation(n=30, seed=5, on_event=lambda n, e: deaths.extend(
        [e] if isinstance(e, MemberDead) else []))  # fmt: skip
    sim.run_until(2.0)
    victim = sim.peer("n0003")
    inc = victim.incarnation
    # n0009 accuses n0003 (signed by n0009) to a third node
    sim.peer("n0020").receive("n0009", suspect("n0003", inc, "n0009"), sim.now)
    sim.run_until(30.0)
    assert victim.incarnation == inc + 1
    assert victim.stats.refutations == 1
    assert deaths == []
    for nid in sim.nodes:
        info = sim.peer(nid).member("n0003")
        assert info is not None and info.state == MemberState.ALIVE and info.incarnation == inc + 1


def test_no_false_deaths_under_loss_and_starvation() -> None:
    deaths: list[tuple[str, MemberDead]] = []
    sim = Simulation(n=60, seed=6, loss=0.05, on_event=lambda n, e: deaths.extend(
        [(n, e)] if isinstance(e, MemberDead) else []))  # fmt: skip
    for nid in ("n0001", "n0002", "n0003"):
        sim.starve(nid, period_s=1.0, stall_s=0.4)
    sim.run_until(180.0)
    assert deaths == []
    assert sum(sim.peer(i).stats.probes_failed for i in sim.nodes) > 0  # loss did bite
    assert sim.peer("n0001").health_score >= 0


def test_partition_heals_within_30s() -> None:
    sim = Simulation(n=40, seed=7)
    ids = sorted(sim.nodes)
    left, right = ids[:20], ids[20:]
    sim.run_until(2.0)
    sim.partition(left, right)
    sim.run_until(60.0)
    p = sim.peer(left[0])
    dead = {m.node for m in p.members() if m.state == MemberState.DEAD}
    assert dead == set(right)
    sim.heal()
    healed = sim.now
    while not _views_full(sim, ids) and sim.now < healed + 30.0:
        sim.run_for(0.5)
    assert _views_full(sim, ids), "partition did not heal within 30 simulated s"


def test_newcomers_that_joined_only_each_other_find_the_mesh_through_their_seed() -> None:
    """Three agents started at once, each seeding the mesh's agent and the other two: while the
    mesh's agent cannot be reached they join each other, an island; once it can, the island
    finds it (their push-pulls go to the seed none of them has met) and the views merge."""
    sim = Simulation(n=2, seed=11)
    mesh = sorted(sim.nodes)
    new = ["n0100", "n0101", "n0102"]
    sim.partition(mesh, new)  # a busy seed: the newcomers' joins to it are lost
    for i, nid in enumerate(new):
        sim.restart(nid, [mesh[0], *(new[(i + k) % 3] for k in (1, 2))])
    sim.run_until(sim.now + 20.0)
    assert _views_full(sim, new), "the newcomers did not join each other"
    sim.heal()
    healed = sim.now
    ids = [*mesh, *new]
    while not _views_full(sim, ids) and sim.now < healed + 60.0:
        sim.run_for(0.5)
    assert _views_full(sim, ids), "the island never joined the mesh"


def test_restart_with_new_boot_beats_stale_reports() -> None:
    joined: list[tuple[str, MemberJoined]] = []
    sim = Simulation(n=20, seed=8, on_event=lambda n, e: joined.extend(
        [(n, e)] if isinstance(e, MemberJoined) else []))  # fmt: skip
    sim.run_until(2.0)
    old_inc = sim.peer("n0004").incarnation
    sim.crash("n0004")
    sim.run_until(20.0)
    assert sim.peer("n0000").member("n0004").state == MemberState.DEAD  # type: ignore[union-attr]
    sim.restart("n0004", ["n0000"])
    sim.run_until(35.0)
    new_inc = sim.peer("n0004").incarnation
    assert new_inc > old_inc
    for nid in sim.nodes:
        info = sim.peer(nid).member("n0004")
        assert info is not None and info.state == MemberState.ALIVE and info.incarnation == new_inc
    assert {n for n, e in joined if e.node == "n0004"} == set(sim.nodes) - {"n0004"}


def test_a_restart_soon_after_refuting_past_the_next_boot_starts_above_it() -> None:
    sim = Simulation(n=10, seed=8)
    sim.run_until(2.0)
    victim = sim.peer("n0004")
    far = victim.incarnation + 3000  # past the boot time of its next life (+1000)
    victim.receive("n0000", suspect("n0004", far, "n0000"), sim.now)
    assert victim.incarnation == far + 1
    sim.run_until(6.0)
    sim.crash("n0004")
    sim.restart("n0004", ["n0000"])
    assert sim.peer("n0004").incarnation == far + 2  # not taken for its older self
    sim.peer("n0004").publish("inventory", b"after", sim.now)
    sim.run_until(20.0)
    for nid in sim.nodes:
        got = sim.peer(nid).record("n0004", "inventory")
        assert got is not None and got.record.payload == b"after"


def test_graceful_leave() -> None:
    sim = Simulation(n=20, seed=9)
    sim.run_until(1.0)
    sim.peer("n0005").leave(sim.now)
    sim.run_until(5.0)
    for nid in sim.nodes:
        if nid != "n0005":
            assert sim.peer(nid).member("n0005").state == MemberState.LEFT  # type: ignore[union-attr]


def test_codec_roundtrip_duplication_and_delay() -> None:
    sim = Simulation(n=20, seed=10, codec_roundtrip=True, duplicate=0.2, delay_max_s=0.05)
    sim.run_until(1.0)
    sim.peer("n0002").publish("inventory", b"gpus=8", sim.now)
    sim.run_until(6.0)
    for nid in sim.nodes:
        got = sim.peer(nid).record("n0002", "inventory")
        assert got is not None and got.record.payload == b"gpus=8"
    assert sim.net.bytes > 0
    assert KEYRING is not None


def _heavy_loss(wait_s: float) -> tuple[int, int, int, int]:
    deaths: list[MemberDead] = []
    sim = Simulation(n=40, seed=11, loss=0.2, config=fast_config(reliable_probe_wait_s=wait_s),
                     on_event=lambda n, e: deaths.extend(
        [e] if isinstance(e, MemberDead) else []))  # fmt: skip
    sim.run_until(60.0)
    stats = [sim.peer(i).stats for i in sim.nodes]
    return (
        sum(s.probes_failed for s in stats),
        sum(s.probes_rescued for s in stats),
        sum(s.suspicions_raised for s in stats),
        len(deaths),
    )


def test_reliable_fallback_probe_turns_lost_probes_into_late_ones() -> None:
    failed, rescued, suspicions, deaths = _heavy_loss(0.85)
    assert failed > 0 and rescued > 0  # 20% loss bites the datagram probes...
    assert rescued >= failed - suspicions  # ...and the reliable ping answers for most of them
    assert deaths == 0
    _, rescued_off, suspicions_off, _ = _heavy_loss(0.0)
    assert rescued_off == 0
    assert suspicions_off > 5 * max(1, suspicions)  # without it, lost probes become suspicions


def test_reliable_channel_delays_instead_of_dropping() -> None:
    sim = Simulation(n=2, seed=12, loss=0.5)
    sim.run_until(0.1)
    a = sim.nodes["n0000"]
    a.peer._out_reliable.extend([("n0001", Ping(1000 + i, "n0000", "n0001")) for i in range(40)])
    sim._flush(a)
    queued = [e for e in sim._heap if e[2] == _RELIABLE and e[3] == "n0001"]
    assert len(queued) == 40 and sim.net.reliable_sent == 40  # none lost at 50% loss...
    assert sim.net.retransmits > 0
    assert max(e[0] for e in queued) >= sim.now + 0.2  # ...some a retransmit timeout late
    sim.crash("n0001")
    dropped = sim.net.dropped
    a.peer._out_reliable.append(("n0001", Ping(2000, "n0000", "n0001")))
    sim._flush(a)
    assert sim.net.dropped == dropped + 1  # a crashed node gets nothing, reliably or not


def test_push_pull_digests_follow_every_change() -> None:
    """Digests are patched line by line as members change; they must always equal a digest
    built from scratch, through crashes, suspicions, a restart and a graceful leave."""
    sim = Simulation(n=30, seed=11, loss=0.05, config=fast_config(push_pull_interval_s=1.0))
    ids = sorted(sim.nodes)
    seen: list[PushPull] = []
    for step, t in enumerate((2.0, 6.0, 12.0, 20.0, 30.0)):
        if step == 1:
            sim.crash(ids[3])
        if step == 2:
            sim.restart(ids[3], ids[:2])
            sim.peer(ids[4]).leave(sim.now)
        sim.run_until(t)
        for nid in ids:
            peer = sim.peer(nid)
            pp = peer._push_pull(0, ())
            truth = tuple(
                sorted(MemberDigest(m.node, m.incarnation, m.state) for m in peer.members())
            )
            assert pp.members == truth, f"{nid} at {t}"
            seen.append(pp)
    assert any(d.state != MemberState.ALIVE for pp in seen for d in pp.members)


def test_nodes_whose_seed_starts_last_join_within_seconds() -> None:
    """Agents started together: the one everybody joins through may listen last. Until a node
    has found a live member it retries its seeds every few seconds, not every push-pull."""
    sim = Simulation(n=6, seed=2, warm=False)
    ids = sorted(sim.nodes)
    sim.crash(ids[0])  # the seed is not up yet: every join attempt goes nowhere
    sim.run_until(8.0)
    assert all(len(sim.peer(n).members()) == 1 for n in ids[1:])
    sim.restart(ids[0], [])
    t = 8.0
    while not _views_full(sim, ids) and t < 20.0:
        t += 0.5
        sim.run_until(t)
    assert _views_full(sim, ids)
    assert t - 8.0 <= 3.0, f"took {t - 8.0:.1f} s after the seed came up"


def test_catch_up_pace_ends_once_push_pulls_find_nothing_to_repair() -> None:
    """A cold start push-pulls at the catch-up pace only while the exchanges still repair
    something: once two in a row find both views the same, a member falls back to the regular
    interval (a catch-up exchange of the whole view costs more than the probes), and every
    view is still full."""

    def start(quiet: int) -> tuple[int, bool]:
        sim = Simulation(
            n=30, seed=5, warm=False, config=fast_config(catch_up_quiet_exchanges=quiet)
        )
        ids = sorted(sim.nodes)
        sim.run_until(30.0)
        return sum(sim.peer(i).stats.push_pulls for i in ids), _views_full(sim, ids)

    for_the_window, full_then = start(0)
    until_quiet, full_now = start(2)
    assert full_then and full_now
    assert until_quiet < for_the_window / 2, (until_quiet, for_the_window)
