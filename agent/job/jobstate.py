"""The job and node-drain state machines, each a table of legal moves (after h11's ``_state.py``).

Nothing here performs I/O or reads the clock: the owner of a job feeds it events and stores the
state it gets back. An event that the table does not allow raises ``IllegalTransition``, so a
protocol slip (a late "started" for a cancelled job, a "drained" before "drain") is caught where
it happens instead of corrupting a record.

Job lifecycle::

    pending --placed--> placing --reserved--> placing --started--> running
       ^                   |  declined / requeue                      |
       +-------------------+                                          |
       +---------------------------- retry / requeue -----------------+
    running --exited_ok--> succeeded      running --exited_error--> failed
    running --migrate--> migrating --started--> running
    placing / running / migrating --runner_dead--> lost --requeue--> pending (new attempt)
    any live state --cancel--> cancelled

``succeeded``, ``failed`` and ``cancelled`` are terminal. Whether a failed attempt is retried is the
owner's decision (it knows the retry budget): it sends ``retry`` instead of ``exited_error``.
A report that arrives for a job already in a terminal state is stale (attempt fencing) and the
caller drops it; the table refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class JobState(StrEnum):
    PENDING = "pending"
    """Waiting for a placement."""
    PLACING = "placing"
    """The owner asked a node for a reservation and awaits its answer or the start."""
    RUNNING = "running"
    MIGRATING = "migrating"
    """Told to checkpoint on its source; will restart on a target node."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    """Its runner was declared dead (or lost it on restart); the owner requeues or gives up."""


class JobEvent(StrEnum):
    PLACED = "placed"
    """The owner chose a node and asked it for a reservation."""
    RESERVED = "reserved"
    """The node admitted the job against its local state and holds the resources."""
    DECLINED = "declined"
    """The node refused the reservation; the owner tries another."""
    STARTED = "started"
    """The process runs (first start, or restart on the migration target)."""
    EXITED_OK = "exited_ok"
    EXITED_ERROR = "exited_error"
    """The attempt failed and no retry is left."""
    RETRY = "retry"
    """The attempt failed and the retry budget allows another."""
    CANCEL = "cancel"
    RUNNER_DEAD = "runner_dead"
    MIGRATE = "migrate"
    REQUEUE = "requeue"
    """Back to the queue: reservation timed out, preempted, drained, migration failed, lost."""
    GIVE_UP = "give_up"
    """Fail without running (deadline passed, infeasible, lost with no retry left)."""


TERMINAL_JOB_STATES: Final = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
"""The states a job ends in. A ``StrEnum``'s members equal their values, so a state as a job
document spells it (``"succeeded"``) is found in it too."""
UNENDED_JOB_STATES: Final = tuple(s for s in JobState if s not in TERMINAL_JOB_STATES)
LIVE: Final = (JobState.PLACING, JobState.RUNNING, JobState.MIGRATING)
"""The states of a job whose attempt may run somewhere: its owner follows, stops or fences it."""

_S = JobState
_E = JobEvent

JOB_TRANSITIONS: Final[Mapping[JobState, Mapping[JobEvent, JobState]]] = {
    _S.PENDING: {
        _E.PLACED: _S.PLACING,
        _E.CANCEL: _S.CANCELLED,
        _E.GIVE_UP: _S.FAILED,
    },
    _S.PLACING: {
        _E.RESERVED: _S.PLACING,
        _E.DECLINED: _S.PENDING,
        _E.REQUEUE: _S.PENDING,
        _E.STARTED: _S.RUNNING,
        _E.RUNNER_DEAD: _S.LOST,
        _E.CANCEL: _S.CANCELLED,
    },
    _S.RUNNING: {
        _E.EXITED_OK: _S.SUCCEEDED,
        _E.EXITED_ERROR: _S.FAILED,
        _E.RETRY: _S.PENDING,
        _E.REQUEUE: _S.PENDING,
        _E.MIGRATE: _S.MIGRATING,
        _E.RUNNER_DEAD: _S.LOST,
        _E.CANCEL: _S.CANCELLED,
    },
    _S.MIGRATING: {
        _E.STARTED: _S.RUNNING,
        _E.EXITED_OK: _S.SUCCEEDED,
        _E.REQUEUE: _S.PENDING,
        _E.RUNNER_DEAD: _S.LOST,
        _E.CANCEL: _S.CANCELLED,
    },
    _S.LOST: {
        _E.REQUEUE: _S.PENDING,
        _E.GIVE_UP: _S.FAILED,
        _E.EXITED_OK: _S.SUCCEEDED,
        _E.EXITED_ERROR: _S.FAILED,
        _E.CANCEL: _S.CANCELLED,
    },
    _S.SUCCEEDED: {},
    _S.FAILED: {},
    _S.CANCELLED: {},
}
"""Every legal move: ``JOB_TRANSITIONS[state][event]`` is the next state."""


class NodeDrainState(StrEnum):
    SCHEDULABLE = "schedulable"
    CORDONED = "cordoned"
    """Takes no new work; running jobs stay."""
    DRAINING = "draining"
    """Takes no new work; running jobs are migrated or stopped within a grace period."""
    DRAINED = "drained"
    """Holds no job; safe to take down."""


class DrainEvent(StrEnum):
    CORDON = "cordon"
    DRAIN = "drain"
    DRAINED = "drained"
    """The last job left a draining node."""
    UNDRAIN = "undrain"


_N = NodeDrainState
_D = DrainEvent

DRAIN_TRANSITIONS: Final[Mapping[NodeDrainState, Mapping[DrainEvent, NodeDrainState]]] = {
    # Operator commands repeated (cordon a cordoned node) are harmless no-ops; "drained" is an
    # internal event and only a draining node can take it.
    _N.SCHEDULABLE: {
        _D.CORDON: _N.CORDONED,
        _D.DRAIN: _N.DRAINING,
        _D.UNDRAIN: _N.SCHEDULABLE,
    },
    _N.CORDONED: {
        _D.CORDON: _N.CORDONED,
        _D.DRAIN: _N.DRAINING,
        _D.UNDRAIN: _N.SCHEDULABLE,
    },
    _N.DRAINING: {
        _D.DRAIN: _N.DRAINING,
        _D.DRAINED: _N.DRAINED,
        _D.UNDRAIN: _N.SCHEDULABLE,
    },
    _N.DRAINED: {
        _D.DRAIN: _N.DRAINED,
        _D.UNDRAIN: _N.SCHEDULABLE,
    },
}
"""Every legal move of a node's drain state."""


class IllegalTransition(Exception):
    """An event that the state machine does not allow in the current state."""

    def __init__(self, machine: str, state: str, event: str) -> None:
        super().__init__(f"{machine} in state {state!r} cannot take event {event!r}")
        self.machine = machine
        self.state = state
        self.event = event


def transition(state: JobState, event: JobEvent) -> JobState:
    """The job state after ``event``; raises ``IllegalTransition`` when the table forbids it."""
    try:
        return JOB_TRANSITIONS[JobState(state)][JobEvent(event)]
    except (KeyError, ValueError):
        raise IllegalTransition("job", str(state), str(event)) from None


def drain_transition(state: NodeDrainState, event: DrainEvent) -> NodeDrainState:
    """The drain state after ``event``; raises ``IllegalTransition`` when the table forbids it."""
    try:
        return DRAIN_TRANSITIONS[NodeDrainState(state)][DrainEvent(event)]
    except (KeyError, ValueError):
        raise IllegalTransition("node", str(state), str(event)) from None


def is_terminal(state: JobState) -> bool:
    return state in TERMINAL_JOB_STATES


def accepts_work(state: NodeDrainState) -> bool:
    """Whether a node in this drain state may be offered new jobs."""
    return state == NodeDrainState.SCHEDULABLE
