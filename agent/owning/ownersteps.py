"""What the parts of a job's owner use of it (:class:`agent.owning.owner.Owner`): its view, policy
and peers, and its steps of one job's life (save, move, replicate, stop, requeue, give up).

The parts (``agent.owning.gang``, ``agent.owning.placing``, ``agent.owning.handover``) each name
what more they use in a protocol of their own built on :class:`OwnerSteps`
(``agent.owning.collecting``, which uses less, names its own alone), and depend on that, not on the
``Owner`` class: no import circle back to ``agent.owning.owner``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable, Coroutine

    from agent.job.jobstate import JobEvent
    from agent.mesh.events import EventLog
    from agent.mesh.peers import PeerClient
    from agent.mesh.view import ClusterView
    from agent.owning.meshqueue import MeshQueues
    from agent.owning.ownedjob import OwnedJob
    from agent.owning.placement import Placement
    from agent.wire.policy import PolicyBody


class OwnerSteps(Protocol):
    """The owner's view, policy and peers, and its steps of one job's life."""

    node_id: str
    view: ClusterView
    peers: PeerClient
    events: EventLog
    placement: Placement
    offers: Counter[str]
    queues: MeshQueues
    policy: Callable[[], PolicyBody | None]
    """The team policy held now (quotas, who is in which team)."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def _live(self) -> list[str]: ...
    def _addr_of(self, node: str) -> str | None: ...
    def _save(self, job: OwnedJob, *, replicate: bool = True) -> None: ...
    def _move(self, job: OwnedJob, event: JobEvent) -> bool: ...
    async def _replicate(self, job: OwnedJob) -> str | None: ...
    async def _stop_until_done(
        self, job_id: str, runner: str, attempt: int, cause: str
    ) -> str | None: ...
    def _requeue(self, job: OwnedJob, reason: str) -> None: ...
    def _give_up(self, job: OwnedJob, reason: str) -> None: ...
