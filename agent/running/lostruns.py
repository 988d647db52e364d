"""The runs a runner's restart lost (:class:`agent.running.runner.Runner`): killed, fenced,
reported.

A process recorded before the restart (``agent.storage.store.reconcile``) that still lives is killed
with its process group and recorded as ended by ``SIGKILL``; every one, alive or gone, is fenced
(its attempt never starts here again), logged, and reported to the job's owner as ``lost`` (through
``agent.running.reports``), so the owner requeues it.

What it uses of the runner is named in :class:`RestartedRunner`; it never imports
``agent.running.runner``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Protocol

from agent.running.fencing import Fences
from agent.running.reports import attempt_result
from agent.storage.store import ResultRecord, process_alive, reconcile

if TYPE_CHECKING:
    from agent.mesh.events import EventLog
    from agent.running.runs import UsageSink
    from agent.storage.store import Store
    from agent.wire.calls import AttemptResult


def reconcile_lost(runner: RestartedRunner) -> None:
    """Processes recorded before a restart: kill survivors, report every one as lost."""
    found = reconcile(runner.store, process_alive, now=time.time())
    for run in found.alive:
        _kill_group(run.pid, run.pgid)
        runner.store.finish_run(
            ResultRecord(
                run.job_id, run.attempt, None, "SIGKILL", "lost", run.started_at, time.time()
            )
        )
    for run in (*found.alive, *found.gone):
        runner.fence.raise_to(run.job_id, run.attempt)
        runner.events.add("lost", f"attempt {run.attempt} lost in a restart", job_id=run.job_id)
        lost = ResultRecord(
            run.job_id, run.attempt, None, None, "lost", run.started_at, time.time()
        )
        if runner.usage is not None:
            runner.usage.closed(run.job_id, run.attempt, lost.started_at, lost.finished_at)
        runner.queue_report(attempt_result(lost), None)


def _kill_group(pid: int, pgid: int | None) -> None:
    if sys.platform == "win32":
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid is not None:
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


class RestartedRunner(Protocol):
    """What the lost runs use of the runner: its store, fences, events and reports."""

    store: Store
    fence: Fences
    events: EventLog
    usage: UsageSink | None

    def queue_report(self, report: AttemptResult, owner_hint: str | None) -> None: ...
