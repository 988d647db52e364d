"""What the executor reports about each attempt: one frozen dataclass per event.

``Exited`` is always the last event of an attempt. ``agent.execution.executor`` re-exports all of
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

from agent.execution.progress import ProgressReport

StopCause = Literal["cancel", "preempt", "shrink", "migrate", "drain", "fenced", "shutdown", "disk"]
"""Why the agent stopped a job: the operator cancelled it, a higher-priority job preempted it,
an elastic job gives back GPUs (it restarts with fewer), it moves elsewhere, its node drains, a
newer attempt runs elsewhere, the agent shuts down, or the job filled the agent's disk
(``agent.running.diskguard``)."""
ExitCause = Literal[
    "exit",
    "timeout",
    "cancel",
    "preempt",
    "shrink",
    "migrate",
    "drain",
    "fenced",
    "shutdown",
    "disk",
]
"""``exit``: the job ended on its own; ``timeout``: it hit ``max_runtime_s``; else a StopCause."""


@dataclass(frozen=True, slots=True)
class Started:
    """The attempt's process runs."""

    job_id: str
    attempt: int
    pid: int
    pgid: int | None
    """Its process group (equal to ``pid`` on POSIX); ``None`` on Windows."""
    started_at: float
    """Epoch seconds."""
    log_path: Path


@dataclass(frozen=True, slots=True)
class ProgressChanged:
    """The job reported progress."""

    job_id: str
    attempt: int
    progress: ProgressReport


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The attempt reached its ``max_runtime_s``; stopping it has begun."""

    job_id: str
    attempt: int
    max_runtime_s: float


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The agent asked the attempt to stop; its group got ``signal``, SIGKILL follows after
    ``grace_s`` if it is still there."""

    job_id: str
    attempt: int
    cause: StopCause
    signal: str
    grace_s: float


@dataclass(frozen=True, slots=True)
class Exited:
    """The attempt is over and its process group is gone. Always the attempt's last event."""

    job_id: str
    attempt: int
    exit_code: int | None
    """The process's exit status; ``None`` when a signal ended it."""
    signal: str | None
    """The signal that ended it (``"SIGKILL"``), when one did."""
    cause: ExitCause
    started_at: float
    finished_at: float
    """Epoch seconds."""
    runtime_s: float
    """Measured on the monotonic clock."""

    @property
    def ok(self) -> bool:
        """Ended on its own with status 0."""
        return self.cause == "exit" and self.exit_code == 0


ExecEvent: TypeAlias = Started | ProgressChanged | TimedOut | Cancelled | Exited
