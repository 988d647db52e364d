"""The publisher's timing: what is due when, so an idle agent sleeps instead of polling."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.daemon.config import AgentConfig
from agent.daemon.devices import HostDevices
from agent.daemon.publisher import (
    EVENTS_EVERY_S,
    PLACE_EVERY_S,
    PROGRESS_EVERY_S,
    UNMEASURED_LOOK_S,
    Publisher,
    quiet_every_s,
    spacing_s,
)
from agent.mesh.events import EventLog
from agent.wire.codec import unpack
from agent.wire.records import MAX_TELEMETRY_EVERY_S, EventsRecord, NodeRecord, TelemetryRecord
from gossip.vivaldi import Coordinate

MEASURED = Coordinate(vec=(0.001, 0.0), error=0.2, adjustment_s=0.0, height_s=0.0001)


class Fleet:
    """What the publisher reads, as the test sets it, and what it sent."""

    def __init__(self) -> None:
        self.doc = NodeRecord(drain="schedulable", queue=0, running=(), free=("gpu0",))
        self.coord: Coordinate | None = None
        self.sent: list[str] = []
        self.payloads: list[bytes] = []
        self.wakes = 0
        self.live = 1
        self.clock_s = 100.0
        self.devices: HostDevices | None = None
        self.events = EventLog("n" * 32, clock=lambda: self.clock_s)

    def publish(self, kind: str, payload: bytes) -> None:
        self.sent.append(kind)
        self.payloads.append(payload)


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Fleet, Publisher]:
    f = Fleet()
    f.devices = HostDevices(sim="linux-a100", sim_seed=0)
    pub = Publisher(
        f.publish,
        AgentConfig(data_dir=tmp_path),
        f.devices,
        f.events,
        lambda: f.doc,
        lambda: f.coord,
        live_agents=lambda: f.live,
    )

    def woke() -> None:
        f.wakes += 1

    pub.wake = woke
    return f, pub


def test_a_quiet_node_is_due_only_to_look_for_its_first_coordinate(
    fleet: tuple[Fleet, Publisher],
) -> None:
    f, pub = fleet
    pub.tick(100.0)
    assert f.sent == ["node"]
    assert pub.due_in_s(100.0) == UNMEASURED_LOOK_S
    f.coord = MEASURED
    pub.tick(101.0)
    assert f.sent == ["node", "place"]
    assert pub.due_in_s(101.0) == pytest.approx(PLACE_EVERY_S)


@pytest.mark.parametrize(("live", "every_s"), [(8, 120.0), (32, 240.0), (128, 960.0)])
def test_a_wandering_coordinate_is_republished_the_less_often_the_larger_the_mesh(
    fleet: tuple[Fleet, Publisher], live: int, every_s: float
) -> None:
    """A busy host's coordinate wanders past 1 ms; past 16 agents its record waits longer, so the
    mesh's coordinate records stay near 16 per 120 s."""
    f, pub = fleet
    f.live = live
    f.coord = MEASURED
    pub.tick(100.0)
    assert f.sent.count("place") == 1
    assert pub.due_in_s(100.0) == pytest.approx(every_s)
    f.coord = Coordinate(vec=(0.005, 0.0), error=0.2, adjustment_s=0.0, height_s=0.0001)
    pub.tick(100.0 + every_s - 1.0)
    assert f.sent.count("place") == 1
    pub.tick(100.0 + every_s)
    assert f.sent.count("place") == 2


def test_a_placement_change_is_due_at_once_and_wakes_the_loop(
    fleet: tuple[Fleet, Publisher],
) -> None:
    f, pub = fleet
    pub.tick(100.0)
    f.doc = f.doc._replace(running=("j1",), free=())
    pub.node_changed()
    assert f.wakes == 1
    assert pub.due_in_s(100.01) == 0.0
    pub.tick(100.01)
    assert f.sent == ["node", "node"]


def test_progress_alone_waits_for_its_interval(fleet: tuple[Fleet, Publisher]) -> None:
    f, pub = fleet
    f.coord = MEASURED
    pub.tick(100.0)
    assert f.sent == ["node", "place"]
    f.sent.clear()
    f.doc = f.doc._replace(progress={"j1": (0.5, None)})
    pub.node_changed()
    assert pub.due_in_s(100.5) == pytest.approx(PROGRESS_EVERY_S - 0.5)
    pub.tick(100.5)
    assert f.sent == []
    pub.tick(100.0 + PROGRESS_EVERY_S)
    assert f.sent == ["node"]


def test_the_owners_queue_alone_waits_and_a_job_placed_meanwhile_says_nothing(
    fleet: tuple[Fleet, Publisher],
) -> None:
    """Placement does not read the queue's length: a submission (queue 1) placed within the
    interval (queue 0 again) republishes nothing; one still waiting is said once it is up."""
    f, pub = fleet
    f.coord = MEASURED
    pub.tick(100.0)
    f.sent.clear()
    f.doc = f.doc._replace(queue=1)
    pub.node_changed()
    assert pub.due_in_s(100.1) == pytest.approx(PROGRESS_EVERY_S - 0.1)
    pub.tick(100.1)
    f.doc = f.doc._replace(queue=0)
    pub.node_changed()
    pub.tick(100.0 + PROGRESS_EVERY_S)
    assert f.sent == []
    f.doc = f.doc._replace(queue=2)  # the last node record went out over the interval ago
    pub.node_changed()
    pub.tick(100.0 + PROGRESS_EVERY_S + 0.1)
    assert f.sent == ["node"]
    f.doc = f.doc._replace(queue=1)
    pub.node_changed()
    pub.tick(100.0 + PROGRESS_EVERY_S + 0.2)
    assert f.sent == ["node"]
    pub.tick(100.0 + 2 * PROGRESS_EVERY_S + 0.1)
    assert f.sent == ["node", "node"]


def test_events_go_out_at_most_every_interval(fleet: tuple[Fleet, Publisher]) -> None:
    f, pub = fleet
    pub.tick(100.0)
    pub.events_changed()
    assert pub.due_in_s(100.0) == 0.0
    pub.tick(100.0)
    pub.events_changed()
    assert pub.due_in_s(100.2) == pytest.approx(EVENTS_EVERY_S - 0.2)
    assert f.wakes == 2


def test_a_dataset_scan_that_finds_a_change_is_due_at_once(
    fleet: tuple[Fleet, Publisher],
) -> None:
    f, pub = fleet
    pub.tick(100.0)
    pub.datasets_scanned({"imagenet": 1024})
    assert pub.due_in_s(100.0) == 0.0
    pub.tick(100.0)
    assert f.sent[-1] == "place"
    pub.datasets_scanned({"imagenet": 1024})  # the same again: nothing to say
    assert f.wakes == 1


def busy(f: Fleet, on: bool) -> None:
    """A job starts (or ends) on the first GPU: its utilization moves by 90 points."""
    assert f.devices is not None
    key = f.devices.statics()[0].key
    f.devices.set_load(key, [0] if on else [])
    f.devices.report = f.devices.probe.refresh()


@pytest.mark.parametrize(("live", "every_s"), [(1, 1.0), (16, 1.0), (64, 4.0), (256, 16.0)])
def test_telemetry_changes_are_spaced_by_the_meshs_size(
    fleet: tuple[Fleet, Publisher], live: int, every_s: float
) -> None:
    """Each agent applies every agent's telemetry: past 16 agents an agent's changes go out
    no more often than the mesh's size over 16 seconds, so the mesh's rate stays the same."""
    f, pub = fleet
    f.live = live
    assert spacing_s(1.0, live) == every_s
    pub.telemetry(100.0)
    assert f.sent == ["telemetry"]
    on = False
    t = 100.0
    while t < 100.0 + 4 * every_s - 0.05:  # the load flips every 0.25 s
        t += 0.25
        on = not on
        busy(f, on)
        pub.telemetry(t)
    assert f.sent.count("telemetry") == 4  # at 100 + every_s, 2 * every_s, 3 * every_s


def _promised(payload: bytes) -> float | None:
    return TelemetryRecord.decode(unpack(payload)).every_s


@pytest.mark.parametrize(("live", "every_s"), [(1, 60.0), (16, 60.0), (64, 240.0), (128, 480.0)])
def test_unchanged_telemetry_heartbeats_less_often_past_16_agents_and_says_how_often(
    fleet: tuple[Fleet, Publisher], live: int, every_s: float
) -> None:
    """An idle mesh's heartbeats were all it gossiped, each agent's share growing with the
    mesh: past 16 agents the heartbeat is the mesh's size over 16 times the configured 60 s,
    and each record names it (readers judge its age by it)."""
    f, pub = fleet
    f.live = live
    assert quiet_every_s(60.0, live) == every_s
    pub.telemetry(100.0, force=True)
    assert f.sent == ["telemetry"] and _promised(f.payloads[-1]) == every_s
    pub.telemetry(100.0 + every_s - 0.5)
    assert f.sent == ["telemetry"]
    pub.telemetry(100.0 + every_s)
    assert f.sent == ["telemetry", "telemetry"]


def test_a_heartbeat_comes_within_the_last_promise_when_the_mesh_grows(
    fleet: tuple[Fleet, Publisher],
) -> None:
    """A record said 60 s (16 agents); the mesh then grows to 64: the next heartbeat still comes
    60 s later (readers hold the node to what it said), and it promises 240 s."""
    f, pub = fleet
    f.live = 16
    pub.telemetry(100.0, force=True)
    f.live = 64
    pub.telemetry(159.0)
    assert f.sent == ["telemetry"]
    pub.telemetry(160.0)
    assert f.sent == ["telemetry", "telemetry"] and _promised(f.payloads[-1]) == 240.0


@pytest.mark.parametrize("live", [8, 64, 200])
def test_events_are_spaced_by_the_meshs_size_and_none_is_left_out(
    fleet: tuple[Fleet, Publisher], live: int
) -> None:
    """An event logged just after a version went out is in the next one, however far apart the
    mesh's size puts them."""
    f, pub = fleet
    f.live = live
    f.coord = MEASURED
    every_s = spacing_s(EVENTS_EVERY_S, live)
    events = f.events  # on the test's clock
    events.add("started", "first")
    pub.events_changed()
    pub.tick(f.clock_s)
    f.clock_s += 0.01
    events.add("exited", "second")
    pub.events_changed()
    assert pub.due_in_s(f.clock_s) == pytest.approx(every_s - 0.01)
    pub.tick(f.clock_s + every_s / 2)
    assert f.sent.count("events") == 1
    f.clock_s += every_s
    pub.tick(f.clock_s)
    assert f.sent.count("events") == 2
    last = EventsRecord.decode(unpack(f.payloads[-1])).events
    assert [e.message for e in last] == ["first", "second"]


def test_a_long_configured_heartbeat_in_a_large_mesh_says_what_a_record_may(
    tmp_path: Path,
) -> None:
    """2 h times 1,000 / 16 is past the day a record may name: it promises the day, so its
    telemetry is not refused as malformed everywhere."""
    f = Fleet()
    f.devices = HostDevices(sim="linux-a100", sim_seed=0)
    f.live = 1000
    config = AgentConfig(data_dir=tmp_path, telemetry_heartbeat_s=7200.0)
    pub = Publisher(
        f.publish, config, f.devices, f.events, lambda: f.doc, live_agents=lambda: f.live
    )
    pub.telemetry(100.0, force=True)
    assert _promised(f.payloads[-1]) == MAX_TELEMETRY_EVERY_S
