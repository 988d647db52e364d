"""The job and drain state machines, row by row: every legal move, and every other one refused."""

from __future__ import annotations

import itertools

import pytest

from agent.job.jobstate import (
    DRAIN_TRANSITIONS,
    JOB_TRANSITIONS,
    DrainEvent,
    IllegalTransition,
    JobEvent,
    JobState,
    NodeDrainState,
    accepts_work,
    drain_transition,
    is_terminal,
    transition,
)

# Written out by hand from the design, not derived from the table under test.
JOB_ROWS: list[tuple[str, str, str]] = [
    ("pending", "placed", "placing"),
    ("pending", "cancel", "cancelled"),
    ("pending", "give_up", "failed"),
    ("placing", "reserved", "placing"),
    ("placing", "declined", "pending"),
    ("placing", "requeue", "pending"),
    ("placing", "started", "running"),
    ("placing", "runner_dead", "lost"),
    ("placing", "cancel", "cancelled"),
    ("running", "exited_ok", "succeeded"),
    ("running", "exited_error", "failed"),
    ("running", "retry", "pending"),
    ("running", "requeue", "pending"),
    ("running", "migrate", "migrating"),
    ("running", "runner_dead", "lost"),
    ("running", "cancel", "cancelled"),
    ("migrating", "started", "running"),
    ("migrating", "exited_ok", "succeeded"),
    ("migrating", "requeue", "pending"),
    ("migrating", "runner_dead", "lost"),
    ("migrating", "cancel", "cancelled"),
    ("lost", "requeue", "pending"),
    ("lost", "give_up", "failed"),
    ("lost", "exited_ok", "succeeded"),
    ("lost", "exited_error", "failed"),
    ("lost", "cancel", "cancelled"),
]

DRAIN_ROWS: list[tuple[str, str, str]] = [
    ("schedulable", "cordon", "cordoned"),
    ("schedulable", "drain", "draining"),
    ("schedulable", "undrain", "schedulable"),
    ("cordoned", "cordon", "cordoned"),
    ("cordoned", "drain", "draining"),
    ("cordoned", "undrain", "schedulable"),
    ("draining", "drain", "draining"),
    ("draining", "drained", "drained"),
    ("draining", "undrain", "schedulable"),
    ("drained", "drain", "drained"),
    ("drained", "undrain", "schedulable"),
]


def test_state_and_event_names() -> None:
    assert [s.value for s in JobState] == [
        "pending",
        "placing",
        "running",
        "migrating",
        "succeeded",
        "failed",
        "cancelled",
        "lost",
    ]
    assert [s.value for s in NodeDrainState] == ["schedulable", "cordoned", "draining", "drained"]
    assert [e.value for e in DrainEvent] == ["cordon", "drain", "drained", "undrain"]


@pytest.mark.parametrize(("state", "event", "after"), JOB_ROWS)
def test_job_legal_row(state: str, event: str, after: str) -> None:
    assert transition(JobState(state), JobEvent(event)) == JobState(after)


def test_job_table_has_exactly_these_rows() -> None:
    table = {
        (s.value, e.value, n.value) for s, row in JOB_TRANSITIONS.items() for e, n in row.items()
    }
    assert table == set(JOB_ROWS)
    assert set(JOB_TRANSITIONS) == set(JobState)


ILLEGAL_JOB = sorted(
    {(s.value, e.value) for s, e in itertools.product(JobState, JobEvent)}
    - {(s, e) for s, e, _ in JOB_ROWS}
)


@pytest.mark.parametrize(("state", "event"), ILLEGAL_JOB)
def test_job_illegal_row(state: str, event: str) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(JobState(state), JobEvent(event))
    assert info.value.machine == "job"
    assert info.value.state == state
    assert info.value.event == event
    assert str(info.value) == f"job in state {state!r} cannot take event {event!r}"


def test_some_illegal_moves_by_name() -> None:
    # A late report for a cancelled job, a start without a placement, a second success.
    for state, event in [
        (JobState.CANCELLED, JobEvent.STARTED),
        (JobState.PENDING, JobEvent.STARTED),
        (JobState.SUCCEEDED, JobEvent.EXITED_OK),
        (JobState.PENDING, JobEvent.EXITED_ERROR),
        (JobState.MIGRATING, JobEvent.MIGRATE),
    ]:
        with pytest.raises(IllegalTransition):
            transition(state, event)


def test_unknown_names_are_illegal_transitions() -> None:
    with pytest.raises(IllegalTransition):
        transition("sleeping", JobEvent.CANCEL)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition):
        transition(JobState.RUNNING, "explode")  # type: ignore[arg-type]


def test_terminal_states() -> None:
    assert {s for s in JobState if is_terminal(s)} == {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
    }
    for state in JobState:
        assert bool(JOB_TRANSITIONS[state]) != is_terminal(state)


def test_a_whole_life_with_a_lost_runner_and_a_migration() -> None:
    state = JobState.PENDING
    for event in ["placed", "declined", "placed", "reserved", "started", "runner_dead", "requeue",
                  "placed", "started", "migrate", "started", "exited_ok"]:  # fmt: skip
        state = transition(state, JobEvent(event))
    assert state is JobState.SUCCEEDED


@pytest.mark.parametrize(("state", "event", "after"), DRAIN_ROWS)
def test_drain_legal_row(state: str, event: str, after: str) -> None:
    assert drain_transition(NodeDrainState(state), DrainEvent(event)) == NodeDrainState(after)


def test_drain_table_has_exactly_these_rows() -> None:
    table = {
        (s.value, e.value, n.value) for s, row in DRAIN_TRANSITIONS.items() for e, n in row.items()
    }
    assert table == set(DRAIN_ROWS)


ILLEGAL_DRAIN = sorted(
    {(s.value, e.value) for s, e in itertools.product(NodeDrainState, DrainEvent)}
    - {(s, e) for s, e, _ in DRAIN_ROWS}
)


@pytest.mark.parametrize(("state", "event"), ILLEGAL_DRAIN)
def test_drain_illegal_row(state: str, event: str) -> None:
    with pytest.raises(IllegalTransition, match=f"node in state '{state}' cannot take event"):
        drain_transition(NodeDrainState(state), DrainEvent(event))


def test_illegal_drain_rows_are_the_expected_ones() -> None:
    assert ILLEGAL_DRAIN == [
        ("cordoned", "drained"),
        ("drained", "cordon"),
        ("drained", "drained"),
        ("draining", "cordon"),
        ("schedulable", "drained"),
    ]


def test_only_schedulable_nodes_accept_work() -> None:
    assert [s.value for s in NodeDrainState if accepts_work(s)] == ["schedulable"]
    assert accepts_work(NodeDrainState("schedulable"))
