"""The checkpoints of the jobs a runner (:class:`agent.running.runner.Runner`) runs, on its side.

An attempt starts from the checkpoint its offer names (fetched from the holders the offer names
into this node's store, then copied into the job's folder, with ``SHOAL_RESUME=1``) or from an
empty folder, never from what an earlier attempt left on this node. While a job runs, its
checkpoint folder is looked at every ``CHECKPOINT_SCAN_S``; a change is noted (``saved_at``,
gossiped in the node record) and told to the job's owner (``checkpointed``), which pulls a copy
(``agent.checkpoints.ckptstore``, ``agent.owning.collecting``). The folders and the last attempt
run here are what ``agent.checkpoints.ckptstore.LocalJobs`` reads of the runner. What this uses
of the runner is named in :class:`CheckpointingRunner` (as ``agent.running.reports`` does), so it
never imports ``agent.running.runner``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from agent.checkpoints.ckptfiles import clear_folder, stamp
from agent.execution.jobuser import prepare_job_folder
from agent.mesh.peers import PeerError, PeerRefused
from agent.wire.ckptcalls import CheckpointNote

if TYPE_CHECKING:
    from collections.abc import Coroutine, Mapping
    from pathlib import Path

    from agent.checkpoints.ckptstore import Checkpoints
    from agent.execution.executor import ProcessExecutor
    from agent.mesh.peers import PeerClient
    from agent.storage.store import Store
    from agent.wire.calls import ResumeFrom

log = logging.getLogger("shoal.runner")

CHECKPOINT_SCAN_S = 1.0
"""How often the checkpoint folders of running jobs are looked at (names, sizes, times)."""


class RunHere(Protocol):
    """What is read of a job running here (``agent.running.runs.LocalRun``)."""

    @property
    def attempt(self) -> int: ...
    @property
    def owner(self) -> str: ...
    @property
    def started_at(self) -> float | None: ...


class CheckpointingRunner(Protocol):
    """What the checkpoints use of the runner: its executor, store, peers, running jobs and
    checkpoint mover, and where it notes when a job's checkpoint last changed."""

    executor: ProcessExecutor
    store: Store
    peers: PeerClient
    checkpoints: Checkpoints | None
    saved_at: dict[str, float]

    @property
    def runs(self) -> Mapping[str, RunHere]: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def owner_for(self, job_id: str, hint: str | None) -> str | None: ...
    def _on_change(self) -> None: ...
    def _addr_of(self, node: str) -> str | None: ...


class RunnerCheckpoints:
    """The runner's side of its jobs' checkpoints (module doc)."""

    def __init__(self, runner: CheckpointingRunner) -> None:
        self.r = runner
        self._stamps: dict[tuple[str, int], object] = {}

    async def prepare(self, job_id: str, resume: ResumeFrom | None, ours: bool) -> bool:
        """Put the checkpoint the offer names in the job's folder, or empty it: what an earlier
        attempt left here is never resumed. ``ours``: Shoal's folder (a spec's own
        ``checkpoint_dir`` is left alone). Whether the attempt resumes."""
        if not ours:
            return False
        job_dir = self.r.executor.job_dir(job_id)
        user = self.r.executor.user
        prepare_job_folder(job_dir, user)
        dest = self.folder(job_id)
        if resume is None or self.r.checkpoints is None:
            await asyncio.to_thread(clear_folder, dest, user)
            return False
        await self.r.checkpoints.restore(job_id, resume, dest, user)
        return True

    def folder(self, job_id: str) -> Path:
        return self.r.executor.job_dir(job_id) / "checkpoint"

    def last_attempt(self, job_id: str) -> tuple[int, str | None] | None:
        """The attempt that ran here last and its owner. An attempt still launching is not
        yet it: its folder holds what an earlier attempt left, or the checkpoint being put
        there, never one of its own."""
        run = self.r.runs.get(job_id)
        if run is not None and run.started_at is not None:
            return run.attempt, run.owner
        results = self.r.store.results(job_id)
        return (results[-1].attempt, None) if results else None

    async def watch(self) -> None:
        """Tell each running job's owner when its checkpoint folder changed."""
        while True:
            await asyncio.sleep(CHECKPOINT_SCAN_S)
            if self.r.checkpoints is None:
                continue
            for job_id, run in list(self.r.runs.items()):
                if run.started_at is None:  # launching: the folder is not its own yet
                    continue
                folder = self.folder(job_id)
                now = await asyncio.to_thread(stamp, folder)
                key = (job_id, run.attempt)
                if not now or self._stamps.get(key) == now:
                    continue
                self._stamps[key] = now
                self.r.saved_at[job_id] = time.time()
                self.r._on_change()
                self.r.spawn(self._tell_checkpointed(job_id, run))
            for key in [k for k in self._stamps if k[0] not in self.r.runs]:
                del self._stamps[key]
                self.r.saved_at.pop(key[0], None)

    async def _tell_checkpointed(self, job_id: str, run: RunHere) -> None:
        owner = self.r.owner_for(job_id, run.owner)
        addr = self.r._addr_of(owner) if owner else None
        if addr is None:
            return
        try:
            await self.r.peers.call(
                addr, "checkpointed", CheckpointNote(job_id, run.attempt).to_wire()
            )
        except (
            PeerError
        ) as exc:  # 404: a guess of the owner, as for reports (``agent.running.reports``)
            level = (
                logging.DEBUG
                if isinstance(exc, PeerRefused) and exc.status == 404
                else logging.INFO
            )
            log.log(level, "checkpoint of %s told to %s: %s", job_id[:8], (owner or "")[:8], exc)
