"""The agent's background loops (:class:`agent.daemon.daemon.Agent` starts them as tasks):
telemetry, history, the sweep (publishing, the stored jobs, retiring ended ones), purging ended
jobs from disk, the disk guard, and the datasets rescan. Each takes the agent it runs for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from agent.common.eachjob import one_job
from agent.execution.containment import attempt_key
from agent.history.hint_notices import HintNotices
from agent.history.history_hints import Hint
from agent.history.history_sample import link_readings
from agent.mesh import retiring
from agent.running import diskguard
from agent.storage import purging
from agent.storage.sqlitefile import StoreError
from agent.storage.store import StoreFull
from agent.wire.records import JOB_PREFIX, SUB_PREFIX

if TYPE_CHECKING:
    from agent.daemon.daemon import Agent

log = logging.getLogger("shoal.agent")

SWEEP_S = 1.0
TICK_SPACING_S = 0.1
"""Changes that come closer together than this are published together (one record, not many)."""


async def telemetry(agent: Agent) -> None:
    while True:
        await asyncio.sleep(agent.config.probe_interval_s)
        await agent.devices.refresh()
        agent.publisher.telemetry()
        now = time.time()
        power = {d.static.key: d.sample.power_mw for d in agent.devices.report.devices}
        agent.usage.sample(now, power)


async def history(agent: Agent) -> None:
    """Sample every layer into the node's history on each whole second
    (:mod:`agent.history.history_sample`, :mod:`agent.history.history_store`)."""
    while True:
        await asyncio.sleep(1.0 - time.time() % 1.0)
        runs = agent.runner.runs
        progress = {j: agent.runner.progress.get(j, (None, None))[0] for j in runs}
        cage = agent.executor.cage
        folders = {
            j: (procs.parent if (procs := cage.cgroup_procs(attempt_key(j, r.attempt))) else None)
            for j, r in runs.items()
        }
        try:
            readings = agent.sampler.sample(agent.devices.report.devices, progress, folders)
            readings.update(link_readings(agent.mesh.link_rtts()))
            agent.history.sample(time.time(), readings)
        except Exception:  # history must never stop: the next second tries again
            failures = agent.history.write_failures = agent.history.write_failures + 1
            if failures & (failures - 1) == 0:  # the 1st, 2nd, 4th, 8th... not every second
                log.exception("history sampling failed (%d times)", failures)


async def hints(agent: Agent) -> None:
    """Tell each job running here the bottleneck hints that fire on its GPUs, once each, as
    events (:mod:`agent.history.hint_notices`): ``shoal jobs JOB`` and the TUI show them."""
    notices = HintNotices()
    while True:
        await asyncio.sleep(agent.config.hints_every_s)
        gpus = agent.gpu_facts()
        holders = {key: facts.job_id for key, facts in gpus.items()}
        now = time.time()
        fired: list[tuple[str, Hint]] = []
        if any(holders.values()):
            try:
                agent.history.flush(now)
                fired = await asyncio.to_thread(agent.history.hints, now, gpus)
            except Exception:  # a hint is advice: the next round tries again
                log.exception("judging the bottleneck hints failed")
                continue
        for notice in notices.update(fired, holders, now):
            agent.events.add("hint", notice.line(), job_id=notice.job_id)


async def sweep(agent: Agent) -> None:
    """Publish what is due as soon as it is (changes closer than ``TICK_SPACING_S`` go out
    together) and sweep the stored jobs every ``SWEEP_S``; asleep in between, so an idle
    agent wakes about once a second, not ten times."""
    wake = asyncio.Event()
    agent.publisher.wake = wake.set
    swept = ticked = retired = time.monotonic()
    while True:
        now = time.monotonic()
        wait_s = min(agent.publisher.due_in_s(now), swept + SWEEP_S - now)
        if wait_s > 0:
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await wake.wait()
        await asyncio.sleep(max(0.0, ticked + TICK_SPACING_S - time.monotonic()))
        now = ticked = time.monotonic()
        agent.publisher.tick(now)
        if now - swept >= SWEEP_S:
            swept = now
            with one_job(agent.owner.job_errors, "sweep_all", "(every job)"):
                agent.owner.sweep()  # an error here must not end publishing
        if now - retired >= retiring.RETIRE_EVERY_S:
            retired = now
            retire_ended(agent)


def retire_ended(agent: Agent) -> None:
    """Forget the jobs that ended long enough ago (:mod:`agent.mesh.retiring`)."""
    config = agent.config
    job_ids = retiring.due(
        agent.view.jobs, time.time(), config.ended_jobs_keep_s, config.ended_jobs_kept
    )
    if not job_ids:
        return
    for job_id in job_ids:
        agent.view.retire(job_id)
    agent.owner.forget(job_ids)
    agent.authority.forget(job_ids)
    agent.node.retire({JOB_PREFIX + j for j in job_ids} | {SUB_PREFIX + j for j in job_ids})


async def purge(agent: Agent) -> None:
    """Let ended jobs go from disk once they are old enough (:mod:`agent.storage.purging`)."""
    keep_s = agent.config.ended_jobs_disk_keep_s
    strays_at = time.monotonic()
    executor = agent.executor
    folders = (executor.job_dir,)
    while True:
        await asyncio.sleep(purging.PURGE_EVERY_S)
        agent.usage.purge(time.time())  # accounting rows past a year and a month
        if time.monotonic() - strays_at >= purging.strays_every_s(keep_s):
            strays_at = time.monotonic()
            jobs = executor.jobs_folder
            old = await asyncio.to_thread(purging.old_folders, jobs, time.time() - keep_s)
            strays = purging.stray_folders(agent.store, old, agent.view.jobs, agent.runner.runs)
            await asyncio.to_thread(purging.remove_folders, strays, folders)
            await asyncio.to_thread(_forget_checkpoints, agent, strays)
        job_ids = purging.due(agent.store, agent.view.jobs, time.time(), keep_s)
        if not job_ids:
            continue
        await asyncio.to_thread(purging.remove_folders, job_ids, folders)
        await asyncio.to_thread(_forget_checkpoints, agent, job_ids)
        agent.runner.forget_fences(job_ids)
        try:
            agent.store.forget_jobs(job_ids)
        except StoreFull as exc:  # their folders went: the next pass frees the rows
            log.warning("could not let go of ended jobs' records: %s", exc)
            continue
        log.debug("let go of %d ended job(s) from disk", len(job_ids))


def _forget_checkpoints(agent: Agent, job_ids: list[str]) -> None:
    """The checkpoints the store holds of jobs let go of (blocking)."""
    for job_id in job_ids:
        agent.checkpoints.forget(job_id)


async def disk(agent: Agent) -> None:
    """Stop a job that fills this agent's disk, and free it (:mod:`agent.running.diskguard`)."""
    executor = agent.executor
    jobs = executor.jobs_folder
    while True:
        await asyncio.sleep(diskguard.CHECK_S)
        try:
            found = await asyncio.to_thread(diskguard.look, jobs, executor.running())
        except OSError as exc:
            log.warning("cannot look at the disk of %s: %s", jobs, exc)
            continue
        if found is None:
            continue
        job_id, held_bytes, free_bytes = found
        why = f"its folder filled the disk ({held_bytes >> 20} MiB; {free_bytes >> 10} KiB free)"
        log.warning("job %s: %s: stopped, its files removed", job_id[:8], why)
        await executor.stop(job_id, cause="disk", grace_s=0.0)
        freed = await asyncio.to_thread(diskguard.clear, executor.job_dir(job_id))
        line = f"stopped: {why}; its files here were removed, its log kept"
        await asyncio.to_thread(diskguard.note, executor.log_path(job_id), line)
        agent.disk_stops += 1
        agent.events.add("disk_full", f"{line} ({freed >> 20} MiB freed)", job_id=job_id)


async def datasets(agent: Agent) -> None:
    while True:
        await datasets_rescan(agent)
        await asyncio.sleep(agent.config.datasets_rescan_s)


async def datasets_rescan(agent: Agent) -> None:
    """Index this host's datasets again (off the loop) and publish what is held."""
    try:
        sizes, versions = await asyncio.to_thread(agent.data.scan)
    except (StoreError, OSError) as exc:  # a full disk, say: the next scan tries again
        log.warning("datasets: scan failed: %s", exc)
        return
    agent.publisher.datasets_scanned(sizes, versions)
