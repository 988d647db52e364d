"""An operator's cancel, answered once the job has stopped.

A cancel moves the job to ``cancelled`` and asks each runner of its attempt (a gang: every
member) to stop it, as any stop is asked (``Owner._stop_until_done``: until the runner confirms,
is gone, or asking gives up). The answer waits for those stops, :data:`CANCEL_WAIT_S` at most:
"cancelled" only once every runner confirmed (or is gone); otherwise an ``OwnerError`` says the
job has not stopped yet (504, while the owner goes on asking) or could not be stopped (502, once
asking gave up), and why. A second cancel waits again; one of a job cancelled before, with no
stop under way, stops it again wherever a runner's node record still lists it.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from agent.job.jobstate import LIVE, JobEvent, JobState, is_terminal
from agent.owning.ownedjob import OwnerError

if TYPE_CHECKING:
    from agent.mesh.events import EventLog
    from agent.mesh.view import ClusterView
    from agent.owning.ownedjob import OwnedJob

CANCEL_WAIT_S = 10.0
"""How long a cancel waits for the runners to confirm that the attempt stopped before it answers
that the job has not stopped yet (below the 15 s an agent waits on a forwarded command)."""


class CancellingOwner(Protocol):
    """What a cancel uses of the owner (:class:`agent.owning.owner.Owner`): its view and events, the
    job it owns, its steps of saving and moving a job, and its stops on runners."""

    view: ClusterView
    events: EventLog
    stop_why: dict[str, str]
    _tasks: set[asyncio.Task[Any]]

    def _owned(self, job_id: str) -> OwnedJob: ...
    def _save(self, job: OwnedJob, *, replicate: bool = True) -> None: ...
    def _move(self, job: OwnedJob, event: JobEvent) -> bool: ...
    async def _stop_until_done(
        self, job_id: str, runner: str, attempt: int, cause: str
    ) -> str | None: ...


class Cancels:
    """The owner's cancels, and the stops each waits for."""

    def __init__(self, owner: CancellingOwner) -> None:
        self.o = owner
        self._stopping: dict[str, asyncio.Task[list[str]]] = {}
        """Cancelled jobs' stops on their runners: each answers the runners that did not
        confirm, each with why (empty: all stopped)."""

    def forget(self, job_id: str) -> None:
        self._stopping.pop(job_id, None)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job and answer once its attempt has stopped, within :data:`CANCEL_WAIT_S`
        (``OwnerError`` 504 or 502 otherwise, saying why)."""
        o = self.o
        job = o._owned(job_id)
        stopping = self._stopping.get(job_id)
        if not is_terminal(job.state):
            nodes = _runners_of(job)
            attempt, was_live = job.attempt, job.state in LIVE
            o._move(job, JobEvent.CANCEL)
            job.finished_at = time.time()
            job.reason = "cancelled by an operator"
            if was_live and nodes:  # under way before the save, which may fail
                stopping = self._stop(job_id, nodes, attempt)
            o._save(job)
            o.events.add("cancelled", f"attempt {attempt}", job_id=job_id)
        elif job.state == JobState.CANCELLED and (
            stopping is None or (stopping.done() and stopping.result())
        ):
            listed = [n for n in _runners_of(job) if self._lists_running(n, job_id)]
            if listed:  # a stop that gave up, a cancel whose save failed, a restart since
                stopping = self._stop(job_id, listed, job.attempt)
        if stopping is not None:
            try:
                async with asyncio.timeout(CANCEL_WAIT_S):
                    failed = await asyncio.shield(stopping)
            except TimeoutError:
                why = o.stop_why.get(job_id) or "still stopping"
                raise OwnerError(
                    504,
                    f"job {job_id} is cancelled but has not stopped yet: its runner did not "
                    f"confirm the stop within {CANCEL_WAIT_S:.0f} s ({why}); its owner keeps "
                    "asking (cancel again to wait again)",
                ) from None
            if failed:
                raise OwnerError(
                    502,
                    f"job {job_id} is cancelled but could not be stopped: "
                    f"{'; '.join(failed)} (cancel again to ask again)",
                )
        return {"job_id": job_id, "state": job.state.value}

    def _lists_running(self, node: str, job_id: str) -> bool:
        """Does ``node``'s last node record list the job among those it runs?"""
        view = self.o.view.nodes.get(node)
        status = view.status if view is not None else None
        return status is not None and job_id in status.running

    def _stop(self, job_id: str, nodes: list[str], attempt: int) -> asyncio.Task[list[str]]:
        """Stop a cancelled attempt on each of its runners, in a task of the owner's."""
        o = self.o

        async def stop_all() -> list[str]:
            answers = await asyncio.gather(
                *(o._stop_until_done(job_id, n, attempt, "cancel") for n in nodes),
                return_exceptions=True,
            )
            return [
                f"{n[:8]}: {why if isinstance(why, str) else type(why).__name__}"
                for n, why in zip(nodes, answers, strict=True)
                if why is not None
            ]

        o.stop_why.pop(job_id, None)
        task = asyncio.create_task(stop_all(), name=f"cancel-{job_id[:8]}")
        o._tasks.add(task)
        task.add_done_callback(o._tasks.discard)
        self._stopping[job_id] = task
        return task


def _runners_of(job: OwnedJob) -> list[str]:
    """The nodes that run (or last ran) the job's current attempt."""
    if job.members:
        return [m.node for m in job.members]
    return [job.runner] if job.runner is not None else []
