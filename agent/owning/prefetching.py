"""Pre-fetch, the owner's side: while a job that names datasets waits, the node the policy's
forecast starts it on stages them already.

Each time the owner finds no room for such a job (at most every :data:`PREFETCH_EVERY_S`), it asks
the placement where the job's p50 forecast starts it (:meth:`Placement.likely_node`, the forecast
``agent.policy.forecast`` makes over the mesh's queue and what runs) and sends that node the
internal call ``prefetch`` with the operator's signed submission (the node checks it, and that
this owner may own the job: ``agent.running.prefetch``). When the forecast moves to another node,
the stale pre-fetch is cancelled there (what it fetched stays as cache) and the new node is asked;
when the job starts, a pre-fetch on another node is cancelled. A node that refused (its bounds)
is asked again at the next look, one that took it every :data:`PREFETCH_RENEW_S` (so the node
keeps the job's data from eviction while it waits). Gangs are not pre-fetched (each member
stages as it starts).

Counted in ``shoal_prefetch_total`` by what happened: ``asked``, ``moved`` (the forecast moved and
the old node was told), ``refused``, ``failed`` (the call did not go through).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from agent.mesh.peers import PeerError
from agent.mesh.view import NodeView
from agent.owning.meshqueue import MeshQueue
from agent.owning.ownedjob import OwnedJob
from agent.owning.ownersteps import OwnerSteps
from agent.owning.preempting import saved_at
from agent.policy import adapt
from agent.wire.calls import PrefetchAsk

log = logging.getLogger("shoal.owner")

PREFETCH_EVERY_S: Final = 5.0
"""How often a waiting job's forecast is asked again (a decision pass with forecasts)."""
PREFETCH_TIMEOUT_S: Final = 10.0


PREFETCH_RENEW_S: Final = 600.0
"""A pre-fetch the node took is asked again this often while the job waits (the node forgets
one not renewed for ``agent.running.prefetch.PREFETCH_TTL_S``)."""


@dataclass(slots=True)
class _Asked:
    node: str
    at: float
    sent_at: float
    ok: bool = False


class Prefetcher:
    """The pre-fetches one owner asked for its waiting jobs (see the module docstring)."""

    def __init__(self, o: OwnerSteps, clock: Callable[[], float] = time.monotonic) -> None:
        self.o = o
        self.clock = clock
        self.asked: dict[str, _Asked] = {}
        self.counts: Counter[str] = Counter()

    def waiting(
        self, job: OwnedJob, nodes: Sequence[NodeView], queue: MeshQueue, live: Collection[str]
    ) -> None:
        """``job`` found no room now: have its likely node stage its datasets and pull its
        image."""
        if not (job.spec.datasets or job.spec.image or job.spec.python_env) or job.spec.is_gang:
            return
        now = self.clock()
        prev = self.asked.get(job.job_id)
        if prev is not None and now - prev.at < PREFETCH_EVERY_S:
            return
        o = self.o
        specs = {j: s.spec for j, s in o.view.submissions.items()}
        running = adapt.running_from_jobs(
            o.view.jobs, specs, live=live, checkpoints=saved_at(o.view)
        )
        node = o.placement.likely_node(job.spec, nodes, queue, running)
        if node is None:
            return
        if prev is not None and prev.node == node and prev.ok:
            prev.at = now
            if now - prev.sent_at < PREFETCH_RENEW_S:
                return
            prev.sent_at = now
            o.spawn(self._send(job, node, cancel=False))
            return
        if prev is not None and prev.node != node:
            self.counts["moved"] += 1
            o.events.add(
                "prefetch", f"forecast moved {prev.node[:8]} -> {node[:8]}", job_id=job.job_id
            )
            o.spawn(self._send(job, prev.node, cancel=True))
        self.asked[job.job_id] = _Asked(node, now, now)
        o.spawn(self._send(job, node, cancel=False))

    def placed(self, job: OwnedJob, node: str | None) -> None:
        """The job started on ``node`` (``None``: it ended): a pre-fetch elsewhere is stale."""
        prev = self.asked.pop(job.job_id, None)
        if prev is not None and prev.node != node:
            self.o.spawn(self._send(job, prev.node, cancel=True))

    async def _send(self, job: OwnedJob, node: str, *, cancel: bool) -> None:
        addr = self.o._addr_of(node)
        if addr is None:
            return
        ask = PrefetchAsk(job.job_id, self.o.node_id, job.submission, cancel)
        try:
            answer = await self.o.peers.call(
                addr, "prefetch", ask.to_wire(), timeout_s=PREFETCH_TIMEOUT_S
            )
        except PeerError as exc:
            self.counts["failed"] += 1
            log.info("job %s: prefetch on %s: %s", job.job_id[:8], node[:8], exc)
            return
        if cancel:
            return
        self.counts["asked"] += 1
        refused = answer.get("refused") if isinstance(answer, dict) else None
        held = self.asked.get(job.job_id)
        if refused:
            self.counts["refused"] += 1
            log.info("job %s: prefetch on %s refused: %s", job.job_id[:8], node[:8], refused)
        elif held is not None and held.node == node:
            held.ok = True
            started = answer.get("started") if isinstance(answer, dict) else None
            if started:
                self.o.events.add(
                    "prefetch", f"{', '.join(map(str, started))} on {node[:8]}", job_id=job.job_id
                )
