"""Fencing: the attempts a runner must not start (again), and when a job record it hears stops
the attempt it runs.

:class:`Fences` holds, for each job, the highest attempt this runner must not start: one it
started, or one a stop, a preemption or an abort named. It keeps the newest ``FENCES_KEPT`` jobs
in memory (every job it ever ran, before: ~150 bytes each, for good) and, for a job it holds no
more, falls back to the attempts its store says ran here (``Store.last_attempt_run``), which a
restart keeps too; those go when the job leaves the disk (``agent.storage.purging``).

Through gossip:
A gossiped job record naming a newer attempt, or the same attempt placed on other nodes while it
is placed or running, fences the local copy (cause ``fenced``); one saying the attempt was
cancelled stops it (cause ``cancel``). A gang's attempt is placed here when the record names this
node among its ``members``. Sans-I/O: :class:`agent.running.runner.Runner` acts on the answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.execution.executor import StopCause


def fence_cause(doc: dict[str, Any], attempt: int, node_id: str) -> StopCause | None:
    """Why the gossiped job record ``doc`` stops attempt ``attempt`` running on ``node_id``, or
    ``None`` when it does not."""
    recorded = doc.get("attempt")
    if not isinstance(recorded, int):
        return None
    state = doc.get("state")
    if recorded > attempt or (
        recorded == attempt and not placed_here(doc, node_id) and state in ("placing", "running")
    ):
        return "fenced"
    if recorded == attempt and state == "cancelled":
        return "cancel"
    return None


def placed_here(doc: dict[str, Any], node_id: str) -> bool:
    """Whether a gossiped job record places its attempt on ``node_id`` (its runner, or one of
    a gang's members), or names no node at all."""
    members = doc.get("members")
    if isinstance(members, list) and members:
        return any(isinstance(m, dict) and m.get("node") == node_id for m in members)
    return doc.get("runner") in (None, node_id)


FENCES_KEPT = 10_000
"""Jobs whose fence a runner holds in memory, the most recently fenced (a stop that named an
attempt before it started here is held only there: it races a start by seconds)."""


class Fences:
    """The highest attempt of each job this runner must not start (0: none)."""

    def __init__(self, ran_here: Callable[[str], int], kept: int = FENCES_KEPT) -> None:
        self._ran_here = ran_here
        self._kept = kept
        self._held: OrderedDict[str, int] = OrderedDict()

    def get(self, job_id: str) -> int:
        held = self._held.get(job_id)
        return held if held is not None else self._ran_here(job_id)

    def raise_to(self, job_id: str, attempt: int) -> None:
        """Fence ``attempt`` of the job and every earlier one."""
        self._held[job_id] = max(self._held.get(job_id, 0), attempt)
        self._held.move_to_end(job_id)
        while len(self._held) > self._kept:
            self._held.popitem(last=False)

    def forget(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._held.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._held)
