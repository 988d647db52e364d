"""What the executor is asked to run and how: the ``Executor`` seam, ``ExecutorConfig``, ``Launch``
(one attempt of one job, built from its spec by ``Launch.from_spec``) and the errors of a launch.

The process executor behind the seam is ``agent.execution.executor.ProcessExecutor``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.execution.containers import (
    ContainerRuntime,
    DeviceView,
    ImageSource,
    RegistryPull,
    checked_path,
)
from agent.execution.containment import ContainmentChoice
from agent.execution.execevents import Exited, Started, StopCause
from agent.execution.logfiles import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, Earlier
from agent.execution.pinning import GangRank, job_env
from agent.execution.progress import ProgressReport
from agent.job.envnames import reserved_env
from agent.job.imageref import check_image_ref
from agent.job.jobspec import CHECKPOINT_SIGNALS, JobSpec, check_job_id
from probers.records import DeviceStatic


class LaunchError(Exception):
    """The job's process could not be started (command not found, bad working directory...)."""


class NoRoom(LaunchError):
    """The job's folder or log could not be written here (the disk is full): the job itself
    is not at fault, and may well start elsewhere."""


# -- configuration and launch description --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """How a ``ProcessExecutor`` runs jobs on this node."""

    data_dir: Path
    """The agent's data folder; jobs live under ``data_dir/jobs/<job_id>/``."""
    grace_s: float = 10.0
    """Between the stop signal and SIGKILL, unless a stop names its own."""
    log_max_bytes: int = DEFAULT_MAX_BYTES
    log_backups: int = DEFAULT_BACKUPS
    progress_poll_s: float = 1.0
    """How often the progress file is looked at."""
    progress_event_interval_s: float = 1.0
    """At most one ``ProgressChanged`` per job per this many seconds (the latest is always kept)."""
    job_user: str | None = ""
    """Who jobs run as: ``""`` the agent's own user (this class's default, for the executor used
    alone); ``None`` a dedicated user when the agent runs as root (``shoal-job``, else
    ``nobody``), else the agent's own; a name, that user (the agent must be root to switch).
    ``AgentConfig.job_user`` is passed here unchanged, with ``None`` as its default."""
    containment: ContainmentChoice = "auto"
    """How every process of a job is found and killed (``agent.execution.containment``): ``auto``
    takes a cgroup where the agent may make one, else the subreaper (Linux), else the process
    group."""
    container_runtime: ContainerRuntime | None = None
    """What runs the attempts that name an image (``agent.execution.containers``); ``None``:
    such an attempt fails to start."""
    device_view: DeviceView = field(default_factory=DeviceView)
    """Where the host's device nodes are, for a container's ``--device`` list."""
    images: ImageSource = field(default_factory=RegistryPull)
    """Makes an attempt's image present before it starts."""


@dataclass(frozen=True, slots=True)
class Launch:
    """One attempt of one job, ready to run on this node."""

    job_id: str
    attempt: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables on top of the job user's clean base: the job's own, then Shoal's (pinning...)."""
    cwd: str | None = None
    """Working directory; ``None`` runs in the job's folder."""
    path_prefix: str | None = None
    """A folder put first on the job's PATH (its Python environment's ``bin``)."""
    max_runtime_s: float | None = None
    stop_signal: str = "SIGTERM"
    """Signal name sent to the group first when the job is stopped."""
    image: str | None = None
    """Run ``argv`` in a container of this image (``agent.execution.containers``)."""
    devices: tuple[DeviceStatic, ...] = ()
    """The devices the attempt was given (a container gets their nodes and no other)."""
    read_only: tuple[str, ...] = ()
    """Host folders a container attempt sees read-only at the same path (its datasets)."""

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if self.attempt < 1:
            raise ValueError(f"attempt numbers start at 1, got {self.attempt}")
        if not self.argv:
            raise ValueError("argv must not be empty")
        if self.stop_signal not in CHECKPOINT_SIGNALS:
            raise ValueError(f"stop_signal {self.stop_signal!r} is not one Shoal sends")
        if self.max_runtime_s is not None and self.max_runtime_s <= 0:
            raise ValueError("max_runtime_s must be positive")
        if self.image is not None:
            check_image_ref(self.image)
            for path in self.read_only:
                checked_path(path, "read-only mount")

    @classmethod
    def from_spec(
        cls,
        job_id: str,
        spec: JobSpec,
        *,
        attempt: int,
        devices: Sequence[DeviceStatic] = (),
        gang: GangRank | None = None,
        resume: bool = False,
        share_bytes: int = 0,
        read_only: Sequence[str] = (),
        data_env: Mapping[str, str] | None = None,
    ) -> Launch:
        """The launch for ``spec``: its env (less any name Shoal reserves), then Shoal's
        (``resume``: ``SHOAL_RESUME=1``, the checkpoint folder holds an earlier attempt's;
        ``share_bytes``: a share of its one device, with the hints of ``pinning.share_env``;
        ``read_only``: what a container attempt mounts read-only, its datasets; ``data_env``:
        where its datasets are, ``agent.running.datastage``)."""
        env = {k: v for k, v in spec.env.items() if reserved_env(k) is None}
        env.update(
            job_env(
                devices,
                job_id=job_id,
                attempt=attempt,
                checkpoint_dir=spec.checkpoint_dir,
                gang=gang,
                resume=resume,
                share_bytes=share_bytes,
            )
        )
        env.update(data_env or {})
        return cls(
            job_id=job_id,
            attempt=attempt,
            argv=spec.command,
            env=env,
            cwd=spec.workdir,
            max_runtime_s=spec.max_runtime_s,
            stop_signal=spec.checkpoint_signal,
            image=spec.image,
            devices=tuple(devices),
            read_only=tuple(read_only) if spec.image is not None else (),
        )


# -- the seam ------------------------------------------------------------------------------------


class Executor(Protocol):
    """What the agent needs from whatever runs its jobs."""

    async def start(self, launch: Launch) -> Started:
        """Start one attempt; raises ``LaunchError`` when it cannot, ``ValueError`` when the job
        already runs here."""
        ...

    async def stop(
        self, job_id: str, *, cause: StopCause = "cancel", grace_s: float | None = None
    ) -> Exited | None:
        """Stop the job's attempt and wait for it to be gone; ``None`` if it does not run here."""
        ...

    async def wait(self, job_id: str) -> Exited:
        """Wait for the job's attempt to end (or return how the last one ended)."""
        ...

    def running(self) -> tuple[str, ...]:
        """Ids of the jobs running here."""
        ...

    def progress(self, job_id: str) -> ProgressReport | None:
        """The latest progress of the job's current or last attempt."""
        ...

    def tail(self, job_id: str, lines: int) -> list[str]:
        """The last lines of the job's log."""
        ...

    def follow(
        self, job_id: str, *, from_lines: int = 0, earlier: Earlier | None = None
    ) -> AsyncIterator[str]:
        """The job's log lines as they come, ending when the attempt is over (``from_lines``,
        ``earlier``: as :func:`agent.execution.logfiles.follow` takes them)."""
        ...

    async def close(self) -> None:
        """Stop every job (cause ``shutdown``) and release everything."""
        ...
