"""Pre-fetch: a node stages a waiting job's datasets before the job is offered to it.

While a job waits, its owner asks the node where the policy's forecast starts it
(``agent.owning.prefetching``) to stage the job's datasets now: the internal call ``prefetch``
carries the operator's signed submission, and this node acts only when the caller may own the job
and the submission is the operator's, for that job (:meth:`Runner.authorised_spec`, as an offer):
a certificate alone moves no data. The same call with ``cancel`` set stops it (the forecast moved):
the stages it started end unless a job starting here waits for them, and what arrived stays in the
store as cache.

Bounds, so a pre-fetch never starves the jobs that start here:

- it is refused while a job starting here stages its own data (the owner asks again later), and
  the stages of those under way stop when such a job begins to fetch (what they fetched stays) and
  go on once no starting job fetches (:meth:`Prefetches.pause`, :meth:`Prefetches.resume`);
- at most :data:`MAX_PREFETCHES` jobs' pre-fetches at once;
- what all of them still lack may be at most :data:`PREFETCH_BUDGET_SHARE` of the store's budget;
- a pre-fetch is forgotten after :data:`PREFETCH_TTL_S` (its owner may be gone; the stage it
  started runs to its end).

The versions of a pre-fetch are kept from eviction while it is remembered (a job queued for
here). Counted in ``shoal_job_data_total``: ``prefetch_started``, ``prefetch_cancelled``,
``prefetch_refused``, ``prefetch_paused``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from agent.job.jobspec import JobSpec, check_job_id
from agent.running.datastage import (
    BadDatasets,
    JobData,
    StagingFailed,
    Version,
    check_names,
    resolve,
)
from agent.wire.calls import PrefetchAsk

MAX_PREFETCHES: Final = 4
PREFETCH_BUDGET_SHARE: Final = 0.5
PREFETCH_TTL_S: Final = 1800.0


class Authorises(Protocol):
    def authorised_spec(
        self, job_id: str, owner: str, caller: str, submission: bytes, verb: str
    ) -> JobSpec: ...


@dataclass(frozen=True, slots=True)
class Prefetch:
    owner: str
    versions: tuple[Version, ...]
    at: float


OFF: Final = "pre-fetch is off on this agent (prefetch = false)"


class Prefetches:
    """The pre-fetches this node runs for waiting jobs (see the module docstring)."""

    def __init__(
        self,
        runner: Authorises,
        data: JobData,
        clock: Callable[[], float] = time.monotonic,
        *,
        enabled: bool = True,
    ) -> None:
        """``enabled``: ``False`` refuses every ask (the agent's ``prefetch = false``)."""
        self.runner = runner
        self.enabled = enabled
        self.data = data
        self.clock = clock
        self.jobs: dict[str, Prefetch] = {}
        self.build_env: Callable[[JobSpec], bool] | None = None
        """Start building a waiting job's Python environment here (``agent.daemon.jobenvs``);
        whether a build began."""
        self.pull_image: Callable[[str], bool] | None = None
        """Start pulling a waiting job's image here (``agent.running.peerimages``); whether a
        pull began (not when held, already pulling, or no runtime)."""
        self._stopping: set[asyncio.Future[Any]] = set()
        data.prefetched = self.versions
        data.prefetch_done = self.started
        data.link_wanted = self.pause
        data.link_free = self.resume

    def versions(self) -> set[Version]:
        self._expire()
        return {v for p in self.jobs.values() for v in p.versions}

    def answer(self, ask: PrefetchAsk, caller: str) -> dict[str, Any]:
        """Start (or cancel) the pre-fetch ``ask`` names; ``NotAllowed`` (raised by the
        runner's check) for a caller that may not own the job or a submission that is not the
        operator's."""
        job_id = check_job_id(ask.job_id)
        spec = self.runner.authorised_spec(job_id, ask.owner, caller, ask.submission, "prefetch")
        if ask.cancel:
            return {"cancelled": self.cancel(ask.job_id)}
        self._expire()
        counts = self.data.counts
        refused = self._refusal(ask.job_id)
        if refused is not None:
            counts["prefetch_refused"] += 1
            return {"started": [], "refused": refused}
        try:
            parsed = check_names(spec.datasets)
            live = set(self.data.stager.mesh.live_agents())
            versions = tuple(resolve(r, self.data.view, self.data.store, live) for r in parsed)
        except (StagingFailed, BadDatasets, ValueError) as exc:
            counts["prefetch_refused"] += 1
            return {"started": [], "refused": str(exc)}
        lacking = [v for v in versions if not self._whole(v)]
        if self._lacking_bytes(lacking, but=ask.job_id) > self._budget():
            counts["prefetch_refused"] += 1
            share = f"{PREFETCH_BUDGET_SHARE:.0%}"
            return {"started": [], "refused": f"over the pre-fetch share ({share}) of the store"}
        self.jobs[ask.job_id] = Prefetch(ask.owner, versions, self.clock())
        for v in lacking:
            self.data.stager.start(v.name, v.digest, None, again=True)
        started = [v.name for v in lacking]
        if spec.image is not None and self.pull_image is not None and self.pull_image(spec.image):
            started.append(f"image {spec.image}")
        if spec.python_env is not None and self.build_env is not None and self.build_env(spec):
            started.append("environment")
        if started:
            counts["prefetch_started"] += 1
        return {"started": started, "held": [v.name for v in versions]}

    def cancel(self, job_id: str) -> list[str]:
        """Forget the job's pre-fetch; the stages no other job needs end (what arrived stays)."""
        gone = self.jobs.pop(job_id, None)
        if gone is None:
            return []
        keep = {v.digest for v in self.versions()} | self.data.waited_on()
        cancelled = [v.name for v in gone.versions if v.digest not in keep]
        for v in gone.versions:
            if v.digest not in keep:
                self._stop(v.digest)
        self.data.counts["prefetch_cancelled"] += 1
        return cancelled

    def pause(self) -> None:
        """A starting job fetches: the pre-fetches' stages stop (what they fetched stays),
        but those of a version a starting job waits for."""
        waited = self.data.waited_on()
        for digest in sorted({v.digest for v in self.versions()} - waited):
            if self._stop(digest):
                self.data.counts["prefetch_paused"] += 1

    def resume(self) -> None:
        """No starting job fetches any more: the pre-fetches still lacking data go on."""
        for v in sorted(self.versions(), key=lambda v: v.digest):
            if not self._whole(v):
                self.data.stager.start(v.name, v.digest, None, again=True)

    def _stop(self, digest: str) -> bool:
        """End the stage of ``digest`` if it runs (what it fetched stays); whether it ran."""
        state = self.data.stager.state(digest)
        if state is None or state.state != "staging":
            return False
        task = asyncio.ensure_future(self.data.stager.cancel(digest))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return True

    def started(self, job_id: str) -> None:
        """The job starts here: its own launch holds its versions from now on."""
        self.jobs.pop(job_id, None)

    def _refusal(self, job_id: str) -> str | None:
        if not self.enabled:
            return OFF
        if self.data.staging:
            return "a job starting here stages its data: later"
        if job_id not in self.jobs and len(self.jobs) >= MAX_PREFETCHES:
            return f"{MAX_PREFETCHES} pre-fetches run here already"
        return None

    def _whole(self, v: Version) -> bool:
        held = self.data.store.held(v.digest)
        return held is not None and held.complete

    def _budget(self) -> float:
        return PREFETCH_BUDGET_SHARE * self.data.store.rules.budget_bytes

    def _lacking_bytes(self, lacking: list[Version], but: str) -> int:
        mine = {v.digest for v in lacking}
        for job_id, p in self.jobs.items():
            if job_id != but:
                mine |= {v.digest for v in p.versions if not self._whole(v)}
        total = 0
        for digest in mine:
            held = self.data.store.held(digest)
            if held is not None:
                total += held.total_bytes - held.held_bytes
            else:
                total += self._size_in_view(digest)
        return total

    def _size_in_view(self, digest: str) -> int:
        for node in list(self.data.view.nodes.values()):
            for v in node.place.versions if node.place is not None else ():
                if v.digest == digest:
                    return v.total_bytes
        return 0

    def _expire(self) -> None:
        now = self.clock()
        for job_id in [j for j, p in self.jobs.items() if now - p.at > PREFETCH_TTL_S]:
            del self.jobs[job_id]
