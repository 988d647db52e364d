"""The reports of ended attempts a runner (:class:`agent.running.runner.Runner`) owes the jobs'
owners.

Each ended attempt is queued and told to the job's current owner (``report``), re-resolving the
owner each time (the job's gossiped record, the runner's hint, else the rendezvous order), with a
growing pause between tries, until the owner has heard, gossip shows the job past the attempt, or
``REPORT_GIVE_UP_S`` has passed. Also the attempt results the runner answers with, from an exit or
from its store.

An owner that answers "stale" holds another attempt or runner than the report's. After a healed
partition that can be the other side's owner, whose record fenced this run, while the owner that
offered the run (the hint) still counts on it: it is told too, once, so that it requeues the
attempt rather than wait for a run that was stopped.

It depends on a protocol of what it uses of the runner (:class:`ReportingRunner`), not on
``agent.running.runner``: no import circle back to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from agent.job.jobstate import TERMINAL_JOB_STATES
from agent.job.ownership import owner_of
from agent.mesh.peers import PeerError, PeerRefused
from agent.wire.calls import AttemptResult

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from agent.execution.executor import Exited
    from agent.mesh.peers import PeerClient
    from agent.mesh.view import ClusterView
    from agent.storage.store import ResultRecord

log = logging.getLogger("shoal.runner")

REPORT_GIVE_UP_S = 300.0


class ReportingRunner(Protocol):
    """What the reports use of the runner that owes them: its view, peers and the live agents."""

    view: ClusterView
    peers: PeerClient

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def _live(self) -> list[str]: ...
    def _addr_of(self, node: str) -> str | None: ...


class Reports:
    """The reports a runner has yet to deliver (module doc)."""

    def __init__(self, runner: ReportingRunner) -> None:
        self.r = runner
        self.pending: dict[tuple[str, int], AttemptResult] = {}

    def queue(self, report: AttemptResult, owner_hint: str | None) -> None:
        key = (report.job_id, report.attempt)
        self.pending[key] = report
        self.r.spawn(self._deliver(key, owner_hint))

    def owner_for(self, job_id: str, hint: str | None) -> str | None:
        live = self.r._live()
        doc = self.r.view.jobs.get(job_id)
        if doc is not None and doc.get("owner") in live:
            return str(doc["owner"])
        if hint is not None and hint in live:
            return hint
        return owner_of(job_id, live)

    def moved_on(self, job_id: str, attempt: int) -> bool:
        """Whether the job's record, as gossip brings it, is past ``attempt``: ended, or at a
        later attempt. The owner has then no use for a report of it (it would answer "stale")."""
        doc = self.r.view.jobs.get(job_id)
        if doc is None:
            return False
        newer = isinstance(doc.get("attempt"), int) and doc["attempt"] > attempt
        return newer or doc.get("state") in TERMINAL_JOB_STATES

    async def _deliver(self, key: tuple[str, int], hint: str | None) -> None:
        """Tell the job's owner how an attempt ended, until it has heard, or has moved on.

        After a restart, the runner's view of the mesh is still forming: the owner it finds
        (by rendezvous over the members it knows so far) may not be the job's, and answers
        404 "not owned". That is the expected answer of a guess, said at debug level; the
        report waits for the view to name the owner. Nothing depends on such a report being
        heard: an owner that misses it learns the attempt's end from its own status check."""
        deadline = time.monotonic() + REPORT_GIVE_UP_S
        delay = 0.2
        while time.monotonic() < deadline:
            report = self.pending.get(key)
            if report is None:
                return
            if self.moved_on(*key):
                self.pending.pop(key, None)
                log.debug("report of %s attempt %d: the owner has moved on", key[0][:8], key[1])
                return
            owner = self.owner_for(key[0], hint)
            addr = self.r._addr_of(owner) if owner else None
            if addr is not None:
                try:
                    answer = await self.r.peers.call(addr, "report", report.to_wire())
                except PeerRefused as exc:
                    level = logging.DEBUG if exc.status == 404 else logging.INFO
                    log.log(level, "report of %s to %s: %s", key[0][:8], (owner or "")[:8], exc)
                except PeerError as exc:
                    log.info("report of %s to %s: %s", key[0][:8], (owner or "")[:8], exc)
                else:
                    self.pending.pop(key, None)
                    if answer.get("stale") and hint is not None and hint != owner:
                        await self._tell_offerer(hint, report)
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        log.warning("gave up reporting job %s attempt %d", key[0][:8], key[1])

    async def _tell_offerer(self, offerer: str, report: AttemptResult) -> None:
        """One try to tell the owner that offered the run, when the record's owner found the
        report stale (module doc); an owner that has moved on answers stale or 404 in turn."""
        addr = self.r._addr_of(offerer) if offerer in self.r._live() else None
        if addr is None:
            return
        try:
            await self.r.peers.call(addr, "report", report.to_wire())
        except PeerError as exc:
            log.debug("report of %s to %s: %s", report.job_id[:8], offerer[:8], exc)


def attempt_result(r: Exited | ResultRecord) -> AttemptResult:
    """How an attempt ended, as an owner is told: from its exit, or as the store recorded it."""
    return AttemptResult(
        job_id=r.job_id,
        attempt=r.attempt,
        exit_code=r.exit_code,
        signal=r.signal,
        cause=r.cause,
        started_at=r.started_at,
        finished_at=r.finished_at,
    )
