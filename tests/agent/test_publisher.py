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
)
from agent.mesh.events import EventLog
from agent.wire.records import NodeRecord
from gossip.vivaldi import Coordinate

MEASURED = Coordinate(vec=(0.001, 0.0), error=0.2, adjustment_s=0.0, height_s=0.0001)


class Fleet:
    """What the publisher reads, as the test sets it, and what it sent."""

    def __init__(self) -> None:
        self.doc = NodeRecord(drain="schedulable", queue=0, running=(), free=("gpu0",))
        self.coord: Coordinate | None = None
        self.sent: list[str] = []
        self.wakes = 0


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Fleet, Publisher]:
    f = Fleet()
    pub = Publisher(
        lambda kind, payload: f.sent.append(kind),
        AgentConfig(data_dir=tmp_path),
        HostDevices(sim="linux-a100", sim_seed=0),
        EventLog("n" * 32),
        lambda: f.doc,
        lambda: f.coord,
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
