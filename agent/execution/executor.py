"""Running jobs as local processes: the ``ProcessExecutor`` (its seam, ``Executor``, and what it
is asked to run, ``Launch``, are ``agent.execution.launch``'s).

Each attempt runs as a subprocess in its own session and process group (a new process group on
Windows), as the job user (``agent.execution.jobuser``), from a clean environment, in its own folder
``<data_dir>/jobs/<job_id>/``. Its stdout and stderr go, merged, to ``output.log`` there
(size-rotated; every attempt on this node appends, between ``[shoal]`` marker lines). Stopping
sends the job's checkpoint signal (``SIGTERM`` unless it asked for another) to the whole group,
waits a grace period, then sends ``SIGKILL`` to the group and to every other process the attempt
started (``agent.execution.containment``: its cgroup, or the orphans the agent adopted as a
subreaper). When the main process exits on its own, whatever it left behind is killed the same way.

The executor reports what happens as events (``agent.execution.execevents``), to a callback or, when
none is given, into the ``events`` queue. ``Exited`` is always the last event of an attempt.

Jobs talk back through the progress convention of ``agent.execution.progress`` (a stdout line or the
file ``$SHOAL_PROGRESS_FILE``); the executor keeps the latest progress and its ETA.

A job's stdout is a pipe to the agent: if the agent dies, the job's next write fails and it dies
too, so a restarted agent finds few survivors (``agent.storage.store.reconcile`` reports them; they
are not re-adopted and should be stopped and requeued).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final, cast

from agent.execution.containers import (
    ContainerError,
    ContainerStart,
    agent_key,
    container_start,
    remove_argv,
    remove_leftovers,
    signal_argv,
)
from agent.execution.containers import call as container_call
from agent.execution.containment import attempt_key, open_cage
from agent.execution.execevents import (
    Cancelled,
    ExecEvent,
    ExitCause,
    Exited,
    ProgressChanged,
    Started,
    StopCause,
    TimedOut,
)
from agent.execution.jobuser import (
    base_env,
    log_job_user,
    lookup_job_user,
    prepare_job_folder,
    prepare_jobs_folder,
    read_job_file,
    resolve_job_user,
    unreachable,
)
from agent.execution.launch import ExecutorConfig, Launch, LaunchError, NoRoom
from agent.execution.logfiles import LOG_NAME, Earlier, RotatingLog, follow, tail
from agent.execution.progress import (
    PROGRESS_FILE_ENV,
    PROGRESS_PREFIX,
    ProgressReport,
    ProgressTracker,
    parse_fraction,
    parse_progress_line,
)
from agent.execution.spawn import (
    Unreachable,
    signal_group,
    signal_name,
    spawn,
    use_pidfd_child_watcher,
)
from agent.execution.spawn import death_signal_launcher as _death_signal_launcher
from agent.job.jobspec import check_job_id

__all__ = [
    "Cancelled",
    "ExecEvent",
    "ExitCause",
    "Exited",
    "ProcessExecutor",
    "ProgressChanged",
    "Started",
    "StopCause",
    "TimedOut",
    "use_pidfd_child_watcher",
]

log = logging.getLogger("shoal.executor")

_READ_CHUNK: Final = 64 * 1024
_PIPE_DRAIN_S: Final = 2.0
_FINISHED_KEPT: Final = 1024
_CONTAINER_KILL_S: Final = 10.0


# -- the process executor ------------------------------------------------------------------------


class _JobProtocol(asyncio.SubprocessProtocol):
    """Receives the job's merged output and tells when the process and its pipe are done.

    ``process_exited`` is watched rather than ``Process.wait()``, which (on Python 3.11) also waits
    for the pipe to close: a grandchild holding it open would hide the leader's exit.
    """

    def __init__(self, on_data: Callable[[bytes], None]) -> None:
        loop = asyncio.get_running_loop()
        self._on_data = on_data
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self._on_data(data if isinstance(data, bytes) else data.encode())

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Run:
    """The executor's bookkeeping for one running attempt."""

    def __init__(self, launch: Launch, out: RotatingLog, progress_file: Path) -> None:
        self.launch = launch
        self.out = out
        self.progress_file = progress_file
        self.transport: asyncio.SubprocessTransport | None = None
        self.protocol: _JobProtocol | None = None
        self.pid = 0
        self.pgid: int | None = None
        self.partial = b""
        """The output's last incomplete line (bounded), kept to spot progress lines."""
        self.lost_output = 0
        """Bytes of output the log could not take (a full disk)."""
        self.progress_stamp: tuple[int, int] | None = None
        self.tracker = ProgressTracker()
        self.last_progress_event = float("-inf")
        self.started_at = 0.0
        self.started_mono = 0.0
        self.stop_cause: ExitCause | None = None
        self.kill_at = float("inf")
        """Loop time at which SIGKILL is due, once a stop has begun."""
        self.done: asyncio.Future[Exited] = asyncio.get_running_loop().create_future()
        self.timers: list[asyncio.TimerHandle] = []
        self.poller: asyncio.Task[None] | None = None
        self.supervisor: asyncio.Task[None] | None = None
        self.sweeper: asyncio.Task[None] | None = None
        """Kills what the attempt started outside its group, once SIGKILL is due."""
        self.container: ContainerStart | None = None
        """The attempt's container, when it runs in one."""
        self.signaller: asyncio.Task[tuple[int, str]] | None = None


class ProcessExecutor:
    """Runs each job as a local process group. See the module docstring."""

    def __init__(
        self, config: ExecutorConfig, on_event: Callable[[ExecEvent], object] | None = None
    ) -> None:
        self.config = config
        self.events: asyncio.Queue[ExecEvent] = asyncio.Queue()
        """Where events go when no callback was given."""
        self._on_event = on_event
        self._runs: dict[str, _Run] = {}
        self._starting: set[str] = set()
        self._finished: OrderedDict[str, tuple[Exited, ProgressReport | None]] = OrderedDict()
        self.user = lookup_job_user(resolve_job_user(config.job_user))
        """Who jobs run as (``agent.execution.jobuser``)."""
        self.jobs_folder = prepare_jobs_folder(config.data_dir, self.user)
        """Where every job's folder is."""
        self.cage = open_cage(config.containment, config.data_dir)
        """How every process of a job is killed with it (``agent.execution.containment``)."""
        log_job_user(self.user, self.cage.mode, unreachable(self.jobs_folder, self.user))
        self.containers_folder = config.data_dir / "containers"
        """The attempts' env files, the agent's alone (``agent.execution.containers``)."""
        self.container_key = agent_key(config.data_dir)
        """Names this agent's containers apart from other agents' on the host."""
        if config.container_runtime is not None:
            left = remove_leftovers(
                config.container_runtime, self.container_key, self.containers_folder
            )
            if left:
                log.warning("removed %d container(s) an earlier run left: %s", len(left), left)

    # paths

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_folder / check_job_id(job_id)

    def log_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / LOG_NAME

    # the Executor protocol

    async def start(self, launch: Launch) -> Started:
        if launch.job_id in self._runs or launch.job_id in self._starting:
            raise ValueError(f"job {launch.job_id} already runs here")
        self._starting.add(launch.job_id)
        try:
            return await self._start(launch)
        finally:
            self._starting.discard(launch.job_id)

    async def _start(self, launch: Launch) -> Started:
        job_dir = self.job_dir(launch.job_id)
        progress_file = job_dir / "progress"
        try:
            prepare_job_folder(job_dir, self.user)
            progress_file.unlink(missing_ok=True)
            if "SHOAL_CHECKPOINT_DIR" not in launch.env:
                prepare_job_folder(job_dir / "checkpoint", self.user)
            out = RotatingLog(
                job_dir / LOG_NAME, self.config.log_max_bytes, self.config.log_backups
            )
            out.write(_marker(f"attempt {launch.attempt} starting: {' '.join(launch.argv)}"))
        except OSError as exc:
            error = NoRoom if exc.errno in (errno.ENOSPC, errno.EDQUOT) else LaunchError
            why = exc.strerror or str(exc)
            raise error(f"cannot prepare the job's folder {job_dir}: {why}") from None
        env = base_env(self.user, os.environ)
        env.update(launch.env)
        if launch.path_prefix is not None:
            env["PATH"] = launch.path_prefix + os.pathsep + env.get("PATH", os.defpath)
        # The marker the subreaper tells a job's orphans by (agent.execution.containment), never the
        # job's.
        env["SHOAL_JOB_ID"], env["SHOAL_ATTEMPT"] = launch.job_id, str(launch.attempt)
        env[PROGRESS_FILE_ENV] = str(progress_file)
        if "SHOAL_CHECKPOINT_DIR" not in launch.env:
            env["SHOAL_CHECKPOINT_DIR"] = str(job_dir / "checkpoint")
        run = _Run(launch, out, progress_file)
        argv, user, cwd = launch.argv, self.user, launch.cwd or str(job_dir)
        if launch.image is not None:
            try:
                run.container = await self._container(launch, env, job_dir)
            except (ContainerError, ValueError, OSError) as exc:
                out.write(_marker(f"attempt {launch.attempt} {exc}"))
                out.close()
                raise LaunchError(str(exc)) from None
            argv, env, cwd = run.container.argv, dict(run.container.env), str(job_dir)
            user = dataclasses.replace(self.user, switch=False)  # the container's is the job's
        protocol = _JobProtocol(lambda data: self._on_output(run, data))
        key = attempt_key(launch.job_id, launch.attempt)
        try:
            self.cage.enter(key)
            transport = await spawn(
                protocol,
                argv,
                env,
                cwd,
                user=user,
                cgroup_procs=self.cage.cgroup_procs(key),
                launcher=_death_signal_launcher(),
            )
        except (OSError, ValueError) as exc:
            self.cage.leave(key)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            where = getattr(exc, "filename", None)
            if where is not None and str(where) != launch.argv[0]:
                reason += f" ({where})"
            message = (
                str(exc)
                if isinstance(exc, Unreachable)
                else f"cannot start {launch.argv[0]!r}: {reason}"
            )
            out.write(_marker(f"attempt {launch.attempt} {message}"))
            out.close()
            raise LaunchError(message) from None
        except BaseException:
            self.cage.leave(key)
            out.close()
            raise
        loop = asyncio.get_running_loop()
        run.transport, run.protocol = transport, protocol
        run.pid = transport.get_pid()
        run.pgid = run.pid if sys.platform != "win32" else None
        self.cage.started(key, run.pid)
        run.started_at, run.started_mono = time.time(), loop.time()
        self._runs[launch.job_id] = run
        self._finished.pop(launch.job_id, None)
        if launch.max_runtime_s is not None:
            run.timers.append(loop.call_later(launch.max_runtime_s, self._on_timeout, run))
        run.poller = asyncio.create_task(self._poll_progress_file(run))
        run.supervisor = asyncio.create_task(self._supervise(run))
        started = Started(
            launch.job_id, launch.attempt, run.pid, run.pgid, run.started_at, out.path
        )
        self._emit(started)
        return started

    async def stop(
        self, job_id: str, *, cause: StopCause = "cancel", grace_s: float | None = None
    ) -> Exited | None:
        run = self._runs.get(job_id)
        if run is None:
            return None
        self._begin_stop(run, cause, self.config.grace_s if grace_s is None else grace_s)
        return await asyncio.shield(run.done)

    async def wait(self, job_id: str) -> Exited:
        run = self._runs.get(job_id)
        if run is not None:
            return await asyncio.shield(run.done)
        if job_id in self._finished:
            return self._finished[job_id][0]
        raise KeyError(f"job {job_id} has not run here since the agent started")

    def running(self) -> tuple[str, ...]:
        return tuple(self._runs)

    def progress(self, job_id: str) -> ProgressReport | None:
        run = self._runs.get(job_id)
        if run is not None:
            return run.tracker.latest
        finished = self._finished.get(job_id)
        return finished[1] if finished else None

    def tail(self, job_id: str, lines: int) -> list[str]:
        return tail(self.log_path(job_id), lines, self.config.log_backups)

    def follow(
        self, job_id: str, *, from_lines: int = 0, earlier: Earlier | None = None
    ) -> AsyncIterator[str]:
        return follow(
            self.log_path(job_id),
            lambda: job_id not in self._runs,
            from_lines=from_lines,
            backups=self.config.log_backups,
            earlier=earlier,
        )

    async def close(self) -> None:
        runs = list(self._runs.values())
        for run in runs:
            self._begin_stop(run, "shutdown", self.config.grace_s)
        if runs:
            await asyncio.gather(*(asyncio.shield(r.done) for r in runs))
        self.cage.close()

    async def _container(
        self, launch: Launch, env: dict[str, str], job_dir: Path
    ) -> ContainerStart:
        """Pull the attempt's image if absent and build its container (``containers``)."""
        runtime = self.config.container_runtime
        assert launch.image is not None
        if runtime is None:
            raise ContainerError("this node has no container runtime to run an image")
        await self.config.images.ensure(runtime, launch.image, launch.job_id)
        job_env = {k: v for k, v in env.items() if k != "PATH"}  # the image's, unless set
        job_env["HOME"] = str(job_dir)  # the job user's on the host is not in the image
        job_env.update(launch.env)
        return container_start(
            runtime,
            self.config.device_view,
            key=self.container_key,
            job_id=launch.job_id,
            attempt=launch.attempt,
            image=launch.image,
            argv=launch.argv,
            job_env=job_env,
            job_dir=job_dir,
            workdir=launch.cwd,
            read_only=launch.read_only,
            devices=launch.devices,
            stop_signal=launch.stop_signal,
            uid=self.user.uid,
            gid=self.user.gid,
            groups=self.user.groups,
            private_dir=self.containers_folder,
        )

    # stopping

    def _on_timeout(self, run: _Run) -> None:
        if run.stop_cause is not None or run.done.done():
            return
        assert run.launch.max_runtime_s is not None
        self._emit(TimedOut(run.launch.job_id, run.launch.attempt, run.launch.max_runtime_s))
        self._begin_stop(run, "timeout", self.config.grace_s)

    def _begin_stop(self, run: _Run, cause: ExitCause, grace_s: float) -> None:
        if run.done.done():
            return
        if run.stop_cause is not None:
            loop = asyncio.get_running_loop()
            if loop.time() + grace_s < run.kill_at:
                # A more urgent stop (shorter grace) brings SIGKILL forward.
                run.kill_at = loop.time() + grace_s
                run.timers.append(loop.call_later(grace_s, self._kill, run))
            return
        run.stop_cause = cause
        sig = run.launch.stop_signal
        _note(run, _marker(f"attempt {run.launch.attempt} stopping ({cause}): {sig}"))
        self._signal(run, sig)
        if cause != "timeout":
            stop_cause = cast(StopCause, cause)
            self._emit(Cancelled(run.launch.job_id, run.launch.attempt, stop_cause, sig, grace_s))
        loop = asyncio.get_running_loop()
        run.kill_at = loop.time() + grace_s
        run.timers.append(loop.call_later(grace_s, self._kill, run))

    def _kill(self, run: _Run) -> None:
        if run.done.done():
            return
        if run.container is not None:
            # The container first (the client then exits with its 137), the client after.
            run.sweeper = asyncio.create_task(self._kill_container(run))
            return
        _signal_group(run, "SIGKILL")
        run.sweeper = asyncio.create_task(self.cage.kill(_key(run)))

    def _signal(self, run: _Run, name: str) -> None:
        """The stop signal: to the container through its runtime, else to the job's group."""
        runtime = self.config.container_runtime
        if run.container is None or runtime is None:
            _signal_group(run, name)
            return
        argv = signal_argv(runtime, run.container.name, name)
        run.signaller = asyncio.create_task(container_call(runtime, argv))

    async def _kill_container(self, run: _Run) -> None:
        runtime = self.config.container_runtime
        assert run.container is not None and runtime is not None
        await container_call(runtime, signal_argv(runtime, run.container.name, "SIGKILL"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(run.done), _CONTAINER_KILL_S)
            return
        _signal_group(run, "SIGKILL")  # the client did not end with its container
        await self.cage.kill(_key(run))

    # watching

    async def _supervise(self, run: _Run) -> None:
        assert run.transport is not None and run.protocol is not None
        await run.protocol.exited
        # The leader is gone; whatever it left, in its group or out of it, goes too.
        _signal_group(run, "SIGKILL", leftovers=True)
        runtime = self.config.container_runtime
        if run.container is not None and runtime is not None:
            # ``--rm`` removed a container that ended by itself; a stopped or killed one, or
            # one whose client died, may be left.
            code = run.transport.get_returncode()
            if run.stop_cause is not None or code is None or code < 0:
                await container_call(runtime, remove_argv(runtime, run.container.name))
            run.container.env_file.unlink(missing_ok=True)
        for task in (*run.timers, run.poller, run.sweeper):
            if task is not None:
                task.cancel()
        try:
            await self.cage.kill(_key(run))
        except Exception:  # never leave the attempt unreported
            log.exception("cannot kill what job %s left", run.launch.job_id)
        self.cage.leave(_key(run))
        # A process that left the group may still hold the pipe: do not wait for it forever.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(run.protocol.closed), _PIPE_DRAIN_S)
        returncode = run.transport.get_returncode()
        run.transport.close()
        self._read_progress_file(run)
        finished_mono = asyncio.get_running_loop().time()
        exit_code: int | None = returncode
        sig_name: str | None = None
        if returncode is not None and returncode < 0:
            exit_code, sig_name = None, signal_name(-returncode)
        exited = Exited(
            job_id=run.launch.job_id,
            attempt=run.launch.attempt,
            exit_code=exit_code,
            signal=sig_name,
            cause=run.stop_cause or "exit",
            started_at=run.started_at,
            finished_at=time.time(),
            runtime_s=finished_mono - run.started_mono,
        )
        how = f"code {exit_code}" if exit_code is not None else f"signal {sig_name}"
        if run.partial:
            _note(run, b"\n")  # end the job's unfinished last line before our marker
        _note(
            run,
            _marker(
                f"attempt {run.launch.attempt} exited with {how} after {exited.runtime_s:.1f}s"
            ),
        )
        with contextlib.suppress(OSError):  # what a full disk left unwritten is lost
            run.out.close()
        del self._runs[run.launch.job_id]
        self._finished[run.launch.job_id] = (exited, run.tracker.latest)
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)
        self._emit(exited)
        run.done.set_result(exited)

    def _on_output(self, run: _Run, chunk: bytes) -> None:
        """Copy the job's output to its log, watching for progress lines."""
        if run.out.closed:
            return  # a straggler after the attempt was closed
        try:
            run.out.write(chunk)
        except OSError as exc:  # the disk is full: this output is lost, the job runs on
            if not run.lost_output:
                log.warning("job %s: output not logged: %s", run.launch.job_id[:8], exc)
            run.lost_output += len(chunk)
        prefix = PROGRESS_PREFIX.encode()
        if prefix not in chunk and prefix[:1] not in run.partial:
            run.partial = chunk.rpartition(b"\n")[2][-_READ_CHUNK:]
            return
        *lines, partial = (run.partial + chunk).split(b"\n")
        run.partial = partial[-_READ_CHUNK:]
        for line in lines:
            if line.lstrip().startswith(prefix):
                parsed = parse_progress_line(line.decode("utf-8", errors="replace"))
                if parsed is not None:
                    self._progress(run, *parsed)

    async def _poll_progress_file(self, run: _Run) -> None:
        while True:
            await asyncio.sleep(self.config.progress_poll_s)
            self._read_progress_file(run)

    def _read_progress_file(self, run: _Run) -> None:
        read = read_job_file(run.progress_file, self.user.uid, unless=run.progress_stamp)
        if read is None:
            return
        run.progress_stamp, data = read
        parsed = parse_fraction(data.decode("utf-8", errors="replace"))
        if parsed is not None:
            self._progress(run, *parsed)

    def _progress(self, run: _Run, fraction: float, message: str | None) -> None:
        now = time.time()
        report = run.tracker.update(fraction, message, now)
        interval = self.config.progress_event_interval_s
        if now - run.last_progress_event >= interval or fraction >= 1.0:
            run.last_progress_event = now
            self._emit(ProgressChanged(run.launch.job_id, run.launch.attempt, report))

    def _emit(self, event: ExecEvent) -> None:
        if self._on_event is None:
            self.events.put_nowait(event)
            return
        try:
            self._on_event(event)
        except Exception:
            log.exception("executor event callback failed on %r", event)


# -- OS specifics --------------------------------------------------------------------------------


def _marker(text: str) -> bytes:
    return f"[shoal] {text}\n".encode()


def _note(run: _Run, data: bytes) -> None:
    """Our own line in the job's log; on a full disk it is lost, as the job's output is."""
    try:
        run.out.write(data)
    except OSError:
        run.lost_output += len(data)


def _signal_group(run: _Run, name: str, *, leftovers: bool = False) -> None:
    """Send the named signal to the job's whole process group (:func:`spawn.signal_group`)."""
    signal_group(run.pgid, run.pid, run.transport, name, leftovers=leftovers)


def _key(run: _Run) -> str:
    return attempt_key(run.launch.job_id, run.launch.attempt)
