"""The owner's side of moving checkpoints (``agent.checkpoints.ckptstore``): what it collects, and
when.

When a runner says a job's checkpoint changed, the owner pulls a copy into its store (once more
when it changed again during the pull), and, when it is itself the runner, has the job's replica
fetch that copy, so a copy outlives the node. Before each new attempt it pulls what the last
attempt left, if its node is alive (once per ended attempt: nothing newer can come), then names
the newest copy it holds, and its holders, in the offer: the chosen node fetches it and the
attempt resumes from it (``SHOAL_RESUME=1``); when that node is this one, the replica fetches the
copy first. With no copy, the attempt starts afresh. A job handed to its next owner: the next
owner fetches the copy held here.

A gang's members keep their checkpoints (``agent.owning.gang``): nothing is collected for them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from agent.content.fetch import FetchError
from agent.content.manifest import ContentError
from agent.job.jobstate import LIVE
from agent.job.ownership import replica_of
from agent.mesh.peers import PeerError
from agent.storage.sqlitefile import StoreError
from agent.wire.calls import ResumeFrom
from agent.wire.ckptcalls import CheckpointNote

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from agent.checkpoints.ckptstore import Checkpoints
    from agent.owning.ownedjob import OwnedJob

log = logging.getLogger("shoal.owner")


class CollectingOwner(Protocol):
    """What checkpoint collection uses of the owner it works for
    (:class:`agent.owning.owner.Owner`): its checkpoint mover, its jobs and the live agents."""

    node_id: str
    checkpoints: Checkpoints | None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def _owned(self, job_id: str) -> OwnedJob: ...
    def _live(self) -> list[str]: ...


class Collector:
    """The checkpoints an :class:`agent.owning.owner.Owner` collects from its jobs' runners and
    hands on (module doc)."""

    def __init__(self, owner: CollectingOwner) -> None:
        self.o = owner
        self._collecting: dict[str, bool] = {}
        """Jobs whose checkpoint is being pulled; True: pull again once done (it changed)."""
        self._collected: set[tuple[str, str, int]] = set()
        """(job, node, attempt) pulled once the attempt had ended: nothing newer can come."""
        self._on_replica: dict[str, tuple[str, int, str]] = {}
        """Job run here -> the replica its checkpoint copy was last handed to, with that copy's
        attempt and digest (``0, ""``: there was none)."""

    def checkpointed(self, runner: str, note: CheckpointNote) -> dict[str, Any]:
        """The runner of the current attempt says the job's checkpoint changed: pull a copy."""
        job = self.o._owned(note.job_id)
        stale = runner != job.runner or note.attempt != job.attempt or job.state not in LIVE
        if stale or job.members:  # a gang's members keep their checkpoints (``agent.owning.gang``)
            return {"ok": True, "stale": True}
        if job.job_id in self._collecting:
            self._collecting[job.job_id] = True
        else:
            self._collecting[job.job_id] = False
            self.o.spawn(self._collect_while_running(job.job_id, runner, note.attempt))
        return {"ok": True}

    async def _collect_while_running(self, job_id: str, runner: str, attempt: int) -> None:
        try:
            while True:
                self._collecting[job_id] = False
                await self.collect(job_id, runner, attempt)
                if not self._collecting.get(job_id):
                    return
        finally:
            self._collecting.pop(job_id, None)

    async def collect(self, job_id: str, node: str, attempt: int) -> None:
        """Pull the checkpoint ``attempt`` left on ``node``; when that is this very node, push
        the copy to the replica, where it outlives the node."""
        cp = self.o.checkpoints
        if cp is None:
            return
        try:
            got = await cp.pull(job_id, node, attempt)
        except (PeerError, FetchError, ContentError, StoreError, OSError) as exc:
            log.info("job %s: checkpoint pull from %s: %s", job_id[:8], node[:8], exc)
            return
        if got is None or node != self.o.node_id:
            return
        await self._copy_to_replica(job_id)

    async def collect_last(self, job: OwnedJob) -> None:
        """Before a new attempt: pull what the last attempt left, if its node is alive."""
        last = job.attempts[-1] if job.attempts else None
        if last is None or last.node is None or last.node not in self.o._live():
            return
        key = (job.job_id, last.node, last.attempt)
        if key in self._collected:
            return
        await self.collect(job.job_id, last.node, last.attempt)
        self._collected.add(key)
        if len(self._collected) > 10_000:
            self._collected.clear()

    async def hand_copy(self, job_id: str, node: str) -> bool:
        """Have ``node`` (the job's replica, its next owner) fetch the copy held of the job's
        checkpoint; whether it got there (or there was none to hand on)."""
        assert self.o.checkpoints is not None
        try:
            await self.o.checkpoints.hand(job_id, node)
        except (PeerError, ContentError, OSError) as exc:
            log.info("job %s: checkpoint copy to %s: %s", job_id[:8], node[:8], exc)
            return False
        return True

    async def replicated(self, job: OwnedJob, replica: str) -> None:
        """The job's record went to ``replica``. When the job runs here, its checkpoint copy
        goes there too, once per replica, now rather than with the job's next checkpoint (which
        a job may write hours apart): the replica is who takes the job over if this node dies."""
        if job.runner != self.o.node_id or job.members or job.state not in LIVE:
            return
        handed = self._on_replica.get(job.job_id)
        if self.o.checkpoints is not None and (handed is None or handed[0] != replica):
            await self._copy_to_replica(job.job_id, replica)

    async def _copy_to_replica(self, job_id: str, replica: str | None = None) -> None:
        """Hand the copy held to the job's replica (the current one unless named), unless that
        very copy went there already."""
        assert self.o.checkpoints is not None
        if replica is None:
            replica = replica_of(job_id, self.o._live(), self.o.node_id)
        if replica is None:
            return
        held = self.o.checkpoints.held(job_id)
        handed = (replica, *((held.attempt, held.digest) if held else (0, "")))
        if self._on_replica.get(job_id) != handed and await self.hand_copy(job_id, replica):
            self._on_replica[job_id] = handed

    def forget(self, job_id: str) -> None:
        """The job is no longer owned here."""
        self._on_replica.pop(job_id, None)

    async def resume_from(self, job: OwnedJob, node: str) -> ResumeFrom | None:
        """What the offer to ``node`` names: the newest copy held and its holders (``node``
        fetches it from them before it starts the attempt).

        When ``node`` is this very one, the replica fetches the copy first, before the
        attempt starts: an owner killed as it starts the job would otherwise take with it the
        only copy of what the attempt resumes from (a moved job's checkpoint, pulled here from
        a runner that may clear it next)."""
        if self.o.checkpoints is None:
            return None
        if node == self.o.node_id:
            await self._copy_to_replica(job.job_id)
        return await self.o.checkpoints.offer_to(job.job_id, node)
