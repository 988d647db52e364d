"""When a gossiped job record stops the attempt a runner runs (``agent.running.fencing``)."""

from __future__ import annotations

from typing import Any

from agent.running.fencing import Fences, fence_cause

HERE, THERE = "node-here", "node-there"


def record(**fields: Any) -> dict[str, Any]:
    return {"job_id": "j", "state": "running", "attempt": 2, "runner": HERE, **fields}


def test_a_newer_attempt_fences_the_one_here_whatever_its_state() -> None:
    assert fence_cause(record(attempt=3), 2, HERE) == "fenced"
    assert fence_cause(record(attempt=3, state="pending"), 2, HERE) == "fenced"


def test_the_same_attempt_placed_elsewhere_is_fenced_only_while_placed_or_running() -> None:
    assert fence_cause(record(runner=THERE), 2, HERE) == "fenced"
    assert fence_cause(record(runner=THERE, state="placing"), 2, HERE) == "fenced"
    assert fence_cause(record(runner=THERE, state="pending"), 2, HERE) is None


def test_a_gang_attempt_is_placed_here_when_its_members_name_this_node() -> None:
    members = [{"node": THERE, "rank": 0}, {"node": HERE, "rank": 1}]
    assert fence_cause(record(runner=THERE, members=members), 2, HERE) is None
    assert fence_cause(record(runner=HERE, members=members[:1]), 2, HERE) == "fenced"


def test_a_cancelled_attempt_is_stopped_as_cancelled() -> None:
    assert fence_cause(record(state="cancelled"), 2, HERE) == "cancel"
    assert fence_cause(record(state="cancelled"), 3, HERE) is None


def test_a_record_of_this_attempt_here_an_older_one_or_no_attempt_stops_nothing() -> None:
    assert fence_cause(record(), 2, HERE) is None
    assert fence_cause(record(runner=None), 2, HERE) is None
    assert fence_cause(record(attempt=1), 2, HERE) is None
    assert fence_cause(record(attempt="2"), 2, HERE) is None


def test_fences_hold_the_newest_jobs_and_fall_back_to_the_attempts_that_ran_here() -> None:
    ran_here = {"old": 3}
    fences = Fences(lambda job_id: ran_here.get(job_id, 0), kept=2)
    fences.raise_to("old", 4)
    fences.raise_to("old", 2)  # never lowered
    assert fences.get("old") == 4
    fences.raise_to("a", 1)
    fences.raise_to("old", 5)  # fenced again: the most recent
    fences.raise_to("b", 1)  # past the bound: "a", the least recently fenced, goes
    assert len(fences) == 2 and fences.get("a") == 0
    assert (fences.get("old"), fences.get("b")) == (5, 1)
    fences.forget(["old"])
    assert fences.get("old") == 3  # what its store says ran here
    assert fences.get("never") == 0
