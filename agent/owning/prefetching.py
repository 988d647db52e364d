"""Pre-fetch, the owner's side: while a job that names datasets waits, the node the policy's
forecast starts it on stages them already.

Each time the owner finds no room for such a job (at most every :data:`PREFETCH_EVERY_S`), it asks
the placement where the job's p50 forecast starts it (:meth:`Placement.likely_nodes`, the forecast
``agent.policy.forecast`` makes over the mesh's queue and what runs: one node, or a gang's every
member) and sends each of those nodes the internal call ``prefetch`` with the operator's signed
submission (the node checks it, and that this owner may own the job: ``agent.running.prefetch``).
When the forecast moves a node away, the stale pre-fetch is cancelled there (what it fetched
stays as cache) and the new node is asked; when the job starts, a pre-fetch on a node it did not
start on is cancelled. A node that refused (its bounds) is asked again at the next look, one that
took it every :data:`PREFETCH_RENEW_S` (so the node keeps the job's data from eviction while it
waits).

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
    """One node asked to pre-fetch a job."""

    sent_at: float
    ok: bool = False


@dataclass(slots=True)
class _Forecast:
    """Where a job's pre-fetch was last asked for, and when the forecast was last asked."""

    at: float
    nodes: dict[str, _Asked]


class Prefetcher:
    """The pre-fetches one owner asked for its waiting jobs (see the module docstring)."""

    def __init__(self, o: OwnerSteps, clock: Callable[[], float] = time.monotonic) -> None:
        self.o = o
        self.clock = clock
        self.asked: dict[str, _Forecast] = {}
        self.counts: Counter[str] = Counter()

    def waiting(
        self, job: OwnedJob, nodes: Sequence[NodeView], queue: MeshQueue, live: Collection[str]
    ) -> None:
        """``job`` found no room now: have its likely nodes stage its datasets and pull its
        image."""
        if not (job.spec.datasets or job.spec.image or job.spec.python_env):
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
        likely = o.placement.likely_nodes(job.spec, nodes, queue, running)
        if not likely:
            return
        if prev is None:
            prev = self.asked[job.job_id] = _Forecast(now, {})
        prev.at = now
        for node in [n for n in prev.nodes if n not in likely]:
            self.counts["moved"] += 1
            o.events.add(
                "prefetch", f"forecast moved off {node[:8]} -> {likely[0][:8]}", job_id=job.job_id
            )
            del prev.nodes[node]
            o.spawn(self._send(job, node, cancel=True))
        for node in likely:
            held = prev.nodes.get(node)
            if held is not None and held.ok and now - held.sent_at < PREFETCH_RENEW_S:
                continue
            if held is None:
                held = prev.nodes[node] = _Asked(now)
            held.sent_at = now
            o.spawn(self._send(job, node, cancel=False))

    def placed(self, job: OwnedJob, nodes: Collection[str]) -> None:
        """The job started on ``nodes`` (none: it ended): a pre-fetch elsewhere is stale."""
        prev = self.asked.pop(job.job_id, None)
        if prev is None:
            return
        for node in prev.nodes:
            if node not in nodes:
                self.o.spawn(self._send(job, node, cancel=True))

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
        forecast = self.asked.get(job.job_id)
        held = forecast.nodes.get(node) if forecast is not None else None
        if refused:
            self.counts["refused"] += 1
            log.info("job %s: prefetch on %s refused: %s", job.job_id[:8], node[:8], refused)
            if held is not None:
                held.ok = False
        elif held is not None:
            held.ok = True
            started = answer.get("started") if isinstance(answer, dict) else None
            if started:
                self.o.events.add(
                    "prefetch", f"{', '.join(map(str, started))} on {node[:8]}", job_id=job.job_id
                )
