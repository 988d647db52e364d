"""A job's working folder on the runner: staged, checked, copied into the job's folder.

The signed spec names the folder by digest (``workdir_digest``). The runner stages that content
as it stages a dataset (``agent.running.datastage``: from the members that hold it, the owner and
replica among them, each chunk checked against its digest and the manifest against the one the
spec names), then copies it to ``<job folder>/work``, the job user's, where the job starts. Each
attempt gets a fresh copy; what the job writes elsewhere in its folder stays, as for any job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.content.store import DiskStore
from agent.content.workdir import WORK_DIR_NAME, chown_tree, copy_out
from agent.execution.jobuser import JobUser
from agent.job.jobspec import JobSpec
from agent.running.datastage import JobData, StagingFailed
from agent.running.pyenvs import NoBuilder, PythonEnvs

WORKDIR_NAME = "workdir"
"""The name the store keeps a working folder under (the job's reason: ``staging workdir``)."""


@dataclass(frozen=True, slots=True)
class Workdir:
    cwd: str
    """The job's copy of its working folder: its working directory."""
    env: Mapping[str, str]
    """``VIRTUAL_ENV`` of its Python environment, if it names one."""
    path_prefix: str | None
    """The environment's ``bin`` folder, first on the job's PATH."""


async def prepare_workdir(
    data: JobData,
    envs: PythonEnvs | None,
    job_id: str,
    spec: JobSpec,
    job_dir: Path,
    user: JobUser,
) -> Workdir | None:
    """The job's working folder copied and its Python environment built, when it names them.
    Raises :class:`StagingFailed` and :class:`NoBuilder` (declined: another node may),
    :class:`EnvBuildFailed` (the attempt fails)."""
    if spec.workdir_digest is None:
        return None
    cwd = await stage_workdir(data, data.store, job_id, spec.workdir_digest, job_dir, user)
    if spec.python_env is None:
        return Workdir(cwd, {}, None)
    if envs is None:
        raise NoBuilder("python_env: this agent builds no environments")
    env = await envs.prepare(job_id, spec.python_env, Path(cwd))
    return Workdir(cwd, env, str(Path(env["VIRTUAL_ENV"]) / "bin"))


async def stage_workdir(
    data: JobData, store: DiskStore, job_id: str, digest: str, job_dir: Path, user: JobUser
) -> str:
    """The job's copy of its working folder, ready: its path (the job's working directory).
    Raises :class:`StagingFailed` (the offer is declined: another node may hold it)."""
    await data.stage_content(job_id, WORKDIR_NAME, digest)
    manifest = await asyncio.to_thread(store.manifest, digest)
    if manifest is None or manifest.digest != digest or manifest.kind != "workdir":
        raise StagingFailed(f"working folder {digest[:12]}: not the content the job names")
    tree = await asyncio.to_thread(store.tree, digest)
    if tree is None:
        raise StagingFailed(f"working folder {digest[:12]}: the copy here is not complete")
    dest = job_dir / WORK_DIR_NAME

    def place() -> None:
        job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        copy_out(tree, dest)
        if user.switch:
            chown_tree(dest, user.uid, user.gid)

    try:
        await asyncio.to_thread(place)
    except OSError as exc:
        raise StagingFailed(f"working folder: cannot copy it for the job: {exc}") from None
    return str(dest)
