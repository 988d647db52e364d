"""An owner's elastic jobs: the resizes it has under way, and the events that say them.

An elastic job (``resources.gpus_max_per_node``: a range of GPUs on one node) changes size only
by restarting from its checkpoint: it is stopped (cause ``shrink`` when a runner gives its GPUs to
a job that waits, :mod:`agent.policy.shrink`), requeued by its owner, and placed again by the
policy with as many GPUs as then fit. The owner notes the size it ran at and why when it stops,
and says ``resized`` (from N to M GPUs, why) when it starts again.
"""

from __future__ import annotations

from typing import Protocol


class EventLog(Protocol):
    def add(self, kind: str, message: str, *, job_id: str | None = None) -> None: ...


class Resizes:
    """The elastic jobs an owner is restarting at another size."""

    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._from: dict[str, tuple[int, str]] = {}

    def stopping(self, job_id: str, gpus: int, why: str) -> None:
        """``job_id`` stops at ``gpus`` GPUs to be resized, because ``why``."""
        self._from[job_id] = (gpus, why)

    def started(self, job_id: str, devices: tuple[str, ...]) -> None:
        """It started again on ``devices``: say the resize (nothing for another job)."""
        held = self._from.pop(job_id, None)
        if held is None:
            return
        gpus, why = held
        self._events.add("resized", f"from {gpus} to {len(devices)} GPUs ({why})", job_id=job_id)

    def forget(self, job_id: str) -> None:
        """It ended, or will not restart at another size."""
        self._from.pop(job_id, None)


def shrink_reason(shrunk_for: str | None) -> str:
    return f"shrunk for {shrunk_for[:8]}" if shrunk_for else "shrunk"
