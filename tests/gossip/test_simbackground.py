"""Background members (gossip/simbackground.py): a few real cores among light members that speak
the protocol over one shared view. What the observers count must agree with a mesh of real cores
of the same size; crashes, records and refutations must travel through background members."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from bench.gossip import main, run
from gossip.events import Event, MemberDead, RecordChanged
from gossip.messages import Alive, MemberState, PushPull
from gossip.sim import Simulation
from gossip.simbackground import BackgroundPeer
from tests.gossip.helpers import suspect

TOLERANCE = 0.10
"""Observer counts of the light mesh against the full one: within 10% (seen: within 3%)."""
HANDSHAKES_SLACK_PER_S = 0.1
"""Handshakes are rare events on the probe rings (push-pulls, crashes: ~0.2 per member per
second, a few hundred in the light run), so they agree within 10% or this much (0.1 handshakes
a second cost ~0.04% of a core)."""

COUNTS = (
    "observer_messages_out_per_s",
    "observer_messages_in_per_s",
    "observer_bytes_in_per_s",
    "observer_bytes_out_per_s",
    "observer_handshakes_per_s",
)


@pytest.mark.slow
def test_observer_counts_agree_with_a_mesh_of_real_cores() -> None:
    args = {"nodes": 200, "loss": 0.01, "seconds": 60.0, "seed": 1, "streams": 64}
    full = run(**args)  # type: ignore[arg-type]
    light = run(**args, observers=20)  # type: ignore[arg-type]
    assert full["observers"] == 200 and light["observers"] == 20
    for key in COUNTS:
        a, b = full[key], light[key]
        assert isinstance(a, float) and isinstance(b, float) and a > 0
        slack = HANDSHAKES_SLACK_PER_S if key == "observer_handshakes_per_s" else 0.0
        assert abs(b - a) <= max(TOLERANCE * a, slack), f"{key}: {b:.2f} light, {a:.2f} full"
    # bound 64, ~200 peers: the ring neighbours (at most 8) and a few push-pull partners
    opened = (light["observer_open_streams_mean"], full["observer_open_streams_mean"])
    assert all(10 < x < 40 for x in opened), opened
    # crashes and records reach every observer through the background members
    assert light["crashes"] == full["crashes"] and light["undetected"] == 0
    assert light["dissemination_samples"] > 0 and light["dissemination_undelivered"] == 0
    assert light["false_deaths"] == 0


def test_a_crashed_background_member_is_declared_dead_by_every_observer() -> None:
    dead: dict[str, float] = {}

    def on(nid: str, ev: Event) -> None:
        if isinstance(ev, MemberDead) and ev.node == "n0101":
            dead[nid] = ev.at

    sim = Simulation(n=300, seed=2, observers=10, on_event=on)
    assert isinstance(sim.nodes["n0101"].peer, BackgroundPeer)
    sim.run_until(3.0)
    sim.crash("n0101")
    sim.run_until(20.0)
    assert set(dead) == set(sim.observer_ids)
    assert max(dead.values()) - 3.0 < 12.0
    # background members signed the accusations the observers verified and applied
    declared = sum(n.peer.stats.deaths_declared for n in sim.nodes.values())
    assert declared > 0


def test_a_background_member_refutes_an_accusation_and_spreads_its_records() -> None:
    deaths: list[MemberDead] = []
    got: dict[str, bytes] = {}

    def on(nid: str, ev: Event) -> None:
        if isinstance(ev, MemberDead):
            deaths.append(ev)
        elif isinstance(ev, RecordChanged) and ev.origin == "n0051":
            got[nid] = ev.payload

    sim = Simulation(n=200, seed=3, observers=8, on_event=on)
    sim.run_until(2.0)
    victim = sim.nodes["n0051"].peer
    assert isinstance(victim, BackgroundPeer)
    inc = victim.incarnation
    # an observer accuses the background member n0051, on another member's signature
    sim.peer("n0000").receive("n0077", suspect("n0051", inc, "n0077"), sim.now)
    sim.run_until(20.0)
    assert victim.incarnation == inc + 1 and victim.stats.refutations == 1
    assert deaths == []
    for nid in sim.observer_ids:
        info = sim.peer(nid).member("n0051")
        assert info is not None and info.state == MemberState.ALIVE and info.incarnation == inc + 1
    victim.publish("bench", b"from the background", sim.now)
    sim.run_until(25.0)
    assert got == {nid: b"from the background" for nid in sim.observer_ids}


def test_observers_are_refused_where_background_members_cannot_follow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ValueError, match="warm start"):
        Simulation(n=20, observers=4, warm=False)
    with pytest.raises(ValueError, match="observers must be"):
        Simulation(n=20, observers=0)
    sim = Simulation(n=20, observers=4)
    with pytest.raises(TypeError, match="background member"):
        sim.peer("n0001")
    with pytest.raises(SystemExit):
        main(["--nodes", "20", "--observers", "4", "--starved", "0.1"])
    assert "local health" in capsys.readouterr().err


def test_bench_emits_observer_counts(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--nodes", "60", "--seconds", "20", "--seed", "2", "--observers", "6"]
    assert main([*args, "--streams", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["observers"] == 6 and out["nodes"] == 60
    for key in COUNTS:
        assert out[key] > 0
    assert 0 < out["observer_open_streams_mean"] <= 8


def test_a_background_member_answers_a_push_pull_with_what_the_observer_lacks() -> None:
    sim = Simulation(n=100, seed=4, observers=4)
    sim.run_until(1.0)
    origin = sim.nodes["n0010"].peer
    assert isinstance(origin, BackgroundPeer)
    rec = origin.publish("bench", b"x" * 16, sim.now)
    bg = sim.nodes["n0011"].peer
    assert isinstance(bg, BackgroundPeer)
    observer = sim.peer("n0000")
    assert observer.record("n0010", "bench") is None  # not reached it yet
    ask = PushPull("n0000", 0, observer._member_digest(), tuple(observer._records.digest()), ())
    bg.receive("n0000", ask, sim.now)
    out = bg.take_output()
    assert out is not None
    (addr, reply), *_ = out[0]
    assert addr == "n0000" and isinstance(reply, PushPull) and reply.phase == 1
    assert rec in reply.updates  # the shared view's newer record, and nothing the observer holds
    assert all(type(u) is not Alive for u in reply.updates)
    observer.receive("n0011", reply, sim.now)
    held = observer.record("n0010", "bench")
    assert held is not None and held.record == rec


def _traced_bytes(n: int) -> int:
    gc.collect()
    tracemalloc.start()
    sim = Simulation(n=n, seed=1, observers=4)
    sim.run_until(2.0)
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del sim
    return size


@pytest.mark.slow
def test_background_members_hold_no_row_per_member() -> None:
    """Twice the members, about twice the memory (real cores alone: four times)."""
    small, large = _traced_bytes(1000), _traced_bytes(2000)
    assert large < 2.5 * small, f"{large / small:.2f}x the memory for 2x the members"
