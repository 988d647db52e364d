"""A job whose offer waits on its runner for its datasets: the owner's side.

A runner stages a job's datasets before it starts it (``agent.running.datastage``), inside the
``start`` call; an offer of a job that names datasets may therefore take as long as
:data:`STAGE_TIMEOUT_S`. Meanwhile the runner's ``node`` record says how far the staging is
(``staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)``) and :func:`watch_staging` makes that
line the job's reason, so ``shoal jobs`` and the TUI say what the job waits for.

A job naming a dataset no live member holds whole (no whole version of ``NAME``, or no whole copy
of ``NAME@DIGEST``, in any ``place`` record) is not offered at all: it waits, saying so
(:func:`unheld_reason`), until a member holds one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Final

from agent.job.jobspec import JobSpec
from agent.job.jobstate import JobState
from agent.mesh.view import ClusterView
from agent.owning.ownedjob import OwnedJob
from agent.owning.ownersteps import OwnerSteps

STAGE_TIMEOUT_S: Final = 3600.0
"""How long an offer of a job that names datasets may take to answer (its runner stages them
first); past it the offer is unanswered: fenced, and the job placed again (what was fetched stays
in that node's store, so the next try there goes on from it)."""
WATCH_S: Final = 1.0
STAGING_PREFIX: Final = "staging "


async def watch_staging(o: OwnerSteps, job: OwnedJob, node_id: str, attempt: int) -> None:
    """Copy the runner's staging line into the job's reason until the offer is answered."""
    while True:
        await asyncio.sleep(WATCH_S)
        if job.attempt != attempt or job.state != JobState.PLACING:
            return
        node = o.view.nodes.get(node_id)
        status = node.status if node is not None else None
        line = status.staging.get(job.job_id) if status is not None else None
        if line and line != job.reason:
            job.reason = line
            o._save(job, replicate=False)


def stages(spec: JobSpec) -> bool:
    """Whether a runner stages content before it starts ``spec``: its datasets, its working
    folder (``agent.running.workstage``)."""
    return bool(spec.datasets) or spec.workdir_digest is not None


def clear_staging(job: OwnedJob) -> None:
    """Once the job started, the staging line is no longer its reason."""
    if job.reason is not None and job.reason.startswith(STAGING_PREFIX):
        job.reason = None


def unheld_reason(spec: JobSpec, view: ClusterView, live: Collection[str]) -> str | None:
    """Why the job cannot start anywhere now for want of its data, or ``None``: some dataset it
    names has no whole copy on a live member (a runner stages from members, and a partial copy
    alone cannot finish a stage; the reason says how much of it the fullest copy holds)."""
    if not spec.datasets:
        return None
    names: set[str] = set()
    digests: set[str] = set()
    partial: dict[str, float] = {}
    for node_id in live:
        node = view.nodes.get(node_id)
        if node is None:
            continue
        names.update(node.datasets)  # whole versions' sizes, by name
        for v in node.place.versions if node.place is not None else ():
            if v.complete:
                names.add(v.name)
                digests.add(v.digest)
            elif v.held_bytes > 0:
                share = v.held_bytes / v.total_bytes
                for key in (v.name, v.digest):
                    partial[key] = max(partial.get(key, 0.0), share)
    for ref in spec.datasets:
        name, _, digest = ref.partition("@")
        if (digest and digest not in digests) or (not digest and name not in names):
            line = f"waiting: dataset {ref[:80]}: no member holds it"
            fullest = partial.get(digest or name)
            return line if fullest is None else f"{line} whole (the fullest copy: {fullest:.0%})"
    return None
