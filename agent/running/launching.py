"""What a runner (:class:`agent.running.runner.Runner`) prepares before it launches an admitted
attempt, and books once it started: the job's datasets staged (``agent.running.datastage``), its
working folder staged and its environment built (``agent.running.workstage``), the launch made
from the spec with them, and the attempt's accounting row opened
(:mod:`agent.history.usage_book`). What this uses of the runner is named in
:class:`LaunchingRunner`, so it never imports ``agent.running.runner``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agent.execution.launch import Launch
from agent.running.datastage import StagingFailed, dataset_paths
from agent.running.workstage import Workdir, prepare_workdir

if TYPE_CHECKING:
    from agent.execution.executor import ProcessExecutor
    from agent.execution.pinning import GangRank
    from agent.job.jobspec import JobSpec
    from agent.running.datastage import JobData
    from agent.running.pyenvs import PythonEnvs
    from agent.running.runs import LocalRun, UsageSink


class LaunchingRunner(Protocol):
    """What the preparation of a launch uses of the runner: its executor, the job data stager
    and Python environments it was given, and whether an attempt was stopped meanwhile."""

    executor: ProcessExecutor
    data: JobData | None
    envs: PythonEnvs | None

    def stopped_since(self, job_id: str, attempt: int) -> bool: ...


async def prepare_launch(
    r: LaunchingRunner,
    job_id: str,
    attempt: int,
    spec: JobSpec,
    devices: Sequence[Any],
    gang: GangRank | None,
    resumed: bool,
    share_bytes: int,
) -> Launch:
    """The launch of an admitted attempt on ``devices`` (their statics), with its datasets and
    working folder staged (``StagingFailed`` when it could not, or was stopped meanwhile)."""
    data_env = await stage_data(r, job_id, attempt, spec)
    work = await stage_workdir(r, job_id, attempt, spec)
    launch = Launch.from_spec(
        job_id,
        spec,
        attempt=attempt,
        devices=list(devices),
        gang=gang,
        resume=resumed,
        share_bytes=share_bytes,
        data_env=data_env,
        read_only=dataset_paths(data_env),
    )
    if work is not None:
        launch = dataclasses.replace(
            launch,
            cwd=work.cwd,
            env={**launch.env, **work.env},
            path_prefix=work.path_prefix,
        )
    return launch


async def stage_data(
    r: LaunchingRunner, job_id: str, attempt: int, spec: JobSpec
) -> dict[str, str]:
    """The job's datasets staged and exposed (``agent.running.datastage``): their variables.
    ``StagingFailed`` also when the attempt was fenced, or the agent began to shut down,
    while they staged."""
    if not spec.datasets or r.data is None:
        return {}
    env = await r.data.prepare(job_id, spec.datasets, r.executor.job_dir(job_id))
    if r.stopped_since(job_id, attempt):
        raise StagingFailed(f"attempt {attempt} was stopped while its data staged")
    return env


async def stage_workdir(
    r: LaunchingRunner, job_id: str, attempt: int, spec: JobSpec
) -> Workdir | None:
    """The job's working folder staged and copied, its environment built
    (``agent.running.workstage``); ``None`` when the spec names no working folder."""
    if spec.workdir_digest is None:
        return None
    if r.data is None:
        raise StagingFailed("this agent keeps no content store: no working folder here")
    ex = r.executor
    where = await prepare_workdir(r.data, r.envs, job_id, spec, ex.job_dir(job_id), ex.user)
    if r.stopped_since(job_id, attempt):
        raise StagingFailed(f"attempt {attempt} was stopped while its working folder staged")
    return where


def book_opened(
    usage: UsageSink | None,
    submitter: str | None,
    run: LocalRun,
    keys: tuple[str, ...],
    statics: Mapping[str, Any],
    at: float,
) -> None:
    """Open the attempt's accounting row (:mod:`agent.history.usage_book`)."""
    if usage is None:
        return
    models = sorted({statics[k].name for k in keys if k in statics})
    gpus = float(len(keys))
    if run.share_bytes and keys and keys[0] in statics:
        total = statics[keys[0]].mem_total_bytes or 0
        gpus = run.share_bytes / total if total else 1.0
    model = "+".join(models) or "cpu"
    usage.opened(run.job_id, run.attempt, submitter, model, gpus, keys, at)
