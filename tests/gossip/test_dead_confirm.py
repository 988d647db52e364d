"""One member's word cannot kill a live node: a Dead signed by another member is applied only once
an independent accuser confirms it, or once the suspicion it belongs to has stood its minimum
timeout. Single cores fed signed updates, then the simulator."""

from __future__ import annotations

from gossip.events import Event, MemberDead, MemberSuspect
from gossip.messages import Compound, Dead, MemberState, PushPull, Suspect
from gossip.peer import Peer
from gossip.sim import Simulation
from tests.gossip.helpers import alive, dead, make_peer, suspect

A, S, D = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
INC = 10


def _peer() -> Peer:
    """``me`` holding ``x`` alive at INC, with accusers ``a``, ``b`` and bystander ``c``."""
    p = make_peer()
    p.preload([alive(n, INC if n == "x" else 1) for n in ("x", "a", "b", "c")], 0.0)
    p.events()
    return p


def _state(p: Peer) -> MemberState:
    info = p.member("x")
    assert info is not None
    return info.state


def _relayed(p: Peer, now: float) -> list[Suspect | Dead]:
    """The accusations about ``x`` that ``p`` gossips on at its next rounds."""
    out: list[Suspect | Dead] = []
    for _ in range(3):
        now += p.config.gossip_interval_s
        p.handle_timer(now)
        for _, msg in p.messages_to_send():
            parts = msg.parts if isinstance(msg, Compound) else (msg,)
            out += [u for u in parts if isinstance(u, Suspect | Dead) and u.node == "x"]
    return out


def test_one_members_dead_about_a_live_node_only_makes_it_a_suspect() -> None:
    p = _peer()
    forged = dead("x", INC, "a")
    p.receive("a:1", forged, 1.0)
    assert _state(p) is S
    assert p.stats.dead_deferred == 1 and p.stats.dead_confirmed == 0
    events = p.events()
    assert [type(e) for e in events] == [MemberSuspect]
    assert isinstance(events[0], MemberSuspect) and events[0].accuser == "a"  # not us
    assert forged in _relayed(p, 1.0)  # relayed as a's accusation, so x hears it and refutes
    p.receive("a:1", dead("x", INC, "a"), 2.0)  # again, and again: still a's word alone
    p.receive("c:1", forged, 2.5)
    assert _state(p) is S
    assert p.stats.duplicates >= 2 and p.stats.dead_deferred == 1
    p.receive("x:1", alive("x", INC + 1), 3.0)  # the refutation
    assert _state(p) is A
    assert not any(isinstance(e, MemberDead) for e in p.events())


def test_a_second_accusers_dead_is_applied() -> None:
    p = _peer()
    p.receive("a:1", dead("x", INC, "a"), 1.0)
    p.receive("b:1", dead("x", INC, "b"), 1.5)
    assert _state(p) is D
    dead_events = [e for e in p.events() if isinstance(e, MemberDead)]
    assert [e.accuser for e in dead_events] == ["b"]


def test_a_dead_confirming_another_members_suspicion_is_applied() -> None:
    p = _peer()
    p.receive("b:1", suspect("x", INC, "b"), 1.0)
    p.receive("a:1", dead("x", INC, "a"), 1.5)
    assert _state(p) is D
    assert p.stats.dead_deferred == 0


def test_the_accusers_own_dead_waits_for_the_minimum_suspicion_timeout() -> None:
    p = _peer()
    min_s = p.config.suspicion_min_s(p.live_count())
    p.receive("a:1", suspect("x", INC, "a"), 1.0)
    p.receive("a:1", dead("x", INC, "a"), 1.0 + min_s - 0.1)
    assert _state(p) is S and p.stats.dead_deferred == 1
    q = _peer()
    q.receive("a:1", suspect("x", INC, "a"), 1.0)
    q.receive("a:1", dead("x", INC, "a"), 1.0 + min_s)  # x had min_s to refute, and did not
    assert _state(q) is D and q.stats.dead_deferred == 0


def test_a_held_back_dead_is_applied_when_an_independent_accuser_arrives() -> None:
    p = _peer()
    p.receive("a:1", dead("x", INC, "a"), 1.0)
    assert _state(p) is S
    p.receive("a:1", suspect("x", INC, "a"), 1.2)  # the same accuser again: nothing new
    assert _state(p) is S
    p.receive("b:1", suspect("x", INC, "b"), 1.5)
    assert _state(p) is D
    assert p.stats.dead_deferred == 1 and p.stats.dead_confirmed == 1
    dead_events = [e for e in p.events() if isinstance(e, MemberDead)]
    assert [(e.accuser, e.at) for e in dead_events] == [("a", 1.5)]


def test_a_held_back_dead_about_an_older_life_is_not_applied() -> None:
    p = _peer()
    p.receive("a:1", dead("x", INC, "a"), 1.0)
    p.receive("b:1", suspect("x", INC + 1, "b"), 1.5)  # x lives on at INC + 1
    assert _state(p) is S


def test_anti_entropy_plus_a_direct_dead_from_the_same_member_does_not_kill() -> None:
    """It used to: the push-pull Dead made the receiver suspect x itself, and the direct Dead
    then counted as a second, independent accuser."""
    p = _peer()
    forged = dead("x", INC, "a")
    p.receive("a:1", PushPull("a", 2, (), (), (alive("x", INC), forged)), 1.0)
    assert _state(p) is S
    suspected = [e for e in p.events() if isinstance(e, MemberSuspect)]
    assert [e.accuser for e in suspected] == ["a"]
    assert p.stats.suspicions_raised == 0  # not our own suspicion
    p.receive("a:1", dead("x", INC, "a"), 1.5)
    assert _state(p) is S
    assert p.stats.dead_deferred == 1


def test_a_graceful_leave_is_still_immediate() -> None:
    p = _peer()
    p.receive("x:1", dead("x", INC, "x"), 1.0)
    info = p.member("x")
    assert info is not None and info.state is MemberState.LEFT
    assert p.stats.dead_deferred == 0


def _deaths(sim_events: list[tuple[str, Event]]) -> list[tuple[str, MemberDead]]:
    return [(n, e) for n, e in sim_events if isinstance(e, MemberDead)]


def test_a_forged_dead_sent_to_every_member_kills_nobody_and_is_refuted() -> None:
    seen: list[tuple[str, Event]] = []
    sim = Simulation(n=30, seed=21, loss=0.01, on_event=lambda n, e: seen.append((n, e)))
    sim.run_until(2.0)
    victim, attacker = sim.peer("n0003"), "n0009"
    inc = victim.incarnation
    forged = dead("n0003", inc, attacker)
    for nid in sim.nodes:
        if nid not in ("n0003", attacker):
            sim.peer(nid).receive(attacker, forged, sim.now)
    sim.run_until(30.0)
    assert _deaths(seen) == []
    assert victim.incarnation == inc + 1 and victim.stats.refutations == 1
    for nid in sim.nodes:
        info = sim.peer(nid).member("n0003")
        assert info is not None and info.state is A and info.incarnation == inc + 1
    assert sum(sim.peer(n).stats.dead_deferred for n in sim.nodes) >= 28


def test_a_real_crash_is_still_detected_by_all_without_waiting() -> None:
    """In a crash many members accuse (their own probes fail), so their Deads are confirmed."""
    seen: list[tuple[str, Event]] = []
    sim = Simulation(n=60, seed=22, loss=0.01, on_event=lambda n, e: seen.append((n, e)))
    sim.run_until(5.0)
    sim.crash("n0011")
    sim.run_until(25.0)
    dead_at = {n: e.at for n, e in _deaths(seen) if e.node == "n0011"}
    live = set(sim.nodes) - {"n0011"}
    assert set(dead_at) == live
    assert max(dead_at.values()) - 5.0 < 8.0
    assert {e.node for _, e in _deaths(seen)} == {"n0011"}


LAST_INCARNATION = (1 << 63) - 1
"""The highest incarnation the wire carries: refuting an accusation at it needs one more."""


def test_an_accusation_about_a_life_too_far_ahead_is_refused_and_counted() -> None:
    p = _peer()
    lead = p.config.accusation_lead_max
    for lie in (suspect("x", LAST_INCARNATION, "a"), dead("x", INC + lead + 1, "a")):
        p.receive("a:1", lie, 1.0)
        assert _state(p) is A
    assert p.stats.rejected_ahead == 2 and p.stats.dead_deferred == 0
    assert _relayed(p, 1.0) == []  # not spread either
    p.receive("a:1", dead("x", INC + lead, "a"), 2.0)  # within the lead: a suspicion, as ever
    assert _state(p) is S and p.stats.dead_deferred == 1


def test_a_node_refutes_no_accusation_about_a_life_too_far_ahead_of_its_own() -> None:
    p = make_peer()
    p.preload([alive("a", 1)], 0.0)
    own = p.incarnation
    p.receive("a:1", dead(p.node_id, LAST_INCARNATION, "a"), 1.0)
    assert p.incarnation == own and p.stats.refutations == 0 and p.stats.rejected_ahead == 1
    p.receive("a:1", suspect(p.node_id, own, "a"), 2.0)
    assert p.incarnation == own + 1 and p.stats.refutations == 1


def test_one_accusation_at_the_last_incarnation_sent_to_every_member_kills_nobody() -> None:
    seen: list[tuple[str, Event]] = []
    sim = Simulation(n=30, seed=23, loss=0.01, on_event=lambda n, e: seen.append((n, e)))
    sim.run_until(2.0)
    victim, attacker = sim.peer("n0004"), "n0017"
    inc = victim.incarnation
    for nid in sim.nodes:
        if nid != attacker:  # the accused too
            for lie in (
                suspect("n0004", LAST_INCARNATION, attacker),
                dead("n0004", LAST_INCARNATION, attacker),
            ):
                sim.peer(nid).receive(attacker, lie, sim.now)
    sim.run_until(30.0)
    assert _deaths(seen) == []
    assert victim.incarnation == inc and victim.stats.refutations == 0
    assert sum(sim.peer(n).stats.rejected_ahead for n in sim.nodes) == 2 * 29
