"""The process executor with real subprocesses, plus its log files and progress convention."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from agent.execution.executor import (
    Cancelled,
    ExecEvent,
    Exited,
    ProcessExecutor,
    ProgressChanged,
    Started,
    TimedOut,
)
from agent.execution.launch import ExecutorConfig, Launch, LaunchError
from agent.execution.logfiles import (
    MAX_LINE_BYTES,
    RotatingLog,
    TailReader,
    follow,
    lines_of_attempt,
    log_files,
    tail,
)
from agent.execution.progress import ProgressTracker, parse_fraction, parse_progress_line
from agent.job.jobspec import JobSpec, new_job_id
from probers.records import DeviceStatic
from tests.support import require_system

PY = sys.executable
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="process groups and signals")

# -- progress ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("SHOAL_PROGRESS 0.42 epoch 3/7", (0.42, "epoch 3/7")),
        ("SHOAL_PROGRESS 1", (1.0, None)),
        ("  SHOAL_PROGRESS 25%  warming up \n", (0.25, "warming up")),
        ("SHOAL_PROGRESS 0", (0.0, None)),
        ("SHOAL_PROGRESS 1.5", None),
        ("SHOAL_PROGRESS -0.1", None),
        ("SHOAL_PROGRESS nan", None),
        ("SHOAL_PROGRESS", None),
        ("SHOAL_PROGRESSIVE 0.5", None),
        ("progress 0.5", None),
    ],
)
def test_progress_line(line: str, expected: tuple[float, str | None] | None) -> None:
    assert parse_progress_line(line) == expected


def test_progress_file_text() -> None:
    assert parse_fraction("0.75\n") == (0.75, None)
    assert parse_fraction("0.5 step 500/1000") == (0.5, "step 500/1000")
    assert parse_fraction("") is None
    assert parse_fraction("half") is None


def test_eta_from_the_rate() -> None:
    tracker = ProgressTracker(window_s=100.0)
    first = tracker.update(0.1, None, now=1000.0)
    assert first.eta_s is None and first.rate_per_s is None
    report = tracker.update(0.3, "epoch 3", now=1020.0)  # 0.2 in 20 s
    assert report.rate_per_s == pytest.approx(0.01)
    assert report.eta_s == pytest.approx(70.0)
    assert report.message == "epoch 3"
    # After the window only the recent rate counts: 0.3 -> 0.9 in the last 60 s of 200.
    tracker.update(0.3, None, now=1140.0)
    report = tracker.update(0.9, None, now=1200.0)
    assert report.rate_per_s == pytest.approx(0.6 / 60.0)
    assert report.eta_s == pytest.approx(10.0)
    assert tracker.update(1.0, None, now=1205.0).eta_s == 0.0


def test_progress_going_back_starts_afresh() -> None:
    tracker = ProgressTracker()
    tracker.update(0.2, None, now=0.0)
    tracker.update(0.6, None, now=10.0)
    assert tracker.update(0.7, None, now=15.0).eta_s == pytest.approx(9.0)
    back = tracker.update(0.3, None, now=20.0)  # set aside until the next report agrees
    assert back.fraction == 0.3 and back.eta_s == pytest.approx(4.0)  # the last ETA, less 5 s
    restarted = tracker.update(0.35, None, now=30.0)  # it went back: afresh from those two
    assert tracker.points == ((20.0, 0.3), (30.0, 0.35))
    assert restarted.eta_s == pytest.approx(130.0)


def test_no_progress_means_no_eta() -> None:
    tracker = ProgressTracker()
    tracker.update(0.4, None, now=0.0)
    stalled = tracker.update(0.4, None, now=60.0)
    assert stalled.rate_per_s == 0.0
    assert stalled.eta_s is None


# -- log files -----------------------------------------------------------------------------------


def test_rotation_keeps_backups_and_tail_reads_across(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    with RotatingLog(path, max_bytes=100, backups=2) as out:
        for i in range(40):
            out.write(f"line {i:02d} ......\n".encode())  # 16 bytes: 6 lines per file
    names = [p.name for p in log_files(path, backups=2)]
    assert names == ["output.log.2", "output.log.1", "output.log"]
    assert path.read_text().splitlines() == [f"line {i:02d} ......" for i in range(36, 40)]
    assert all(p.stat().st_size <= 100 for p in log_files(path, backups=2))
    assert tail(path, 3, backups=2) == [f"line {i:02d} ......" for i in (37, 38, 39)]
    # 4 lines in the live file, 6 in .1, 6 in .2: 16 are left of the 40.
    assert tail(path, 100, backups=2) == [f"line {i:02d} ......" for i in range(24, 40)]
    assert tail(path, 0) == []
    assert tail(tmp_path / "missing.log", 5) == []


def test_rotation_without_backups_truncates(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    with RotatingLog(path, max_bytes=10, backups=0) as out:
        out.write(b"0123456789")
        out.write(b"abc\n")
    assert path.read_bytes() == b"abc\n"


async def test_follow_reads_through_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    out = RotatingLog(path, max_bytes=30, backups=1)
    out.write(b"old 1\nold 2\n")
    done = False
    seen: list[str] = []

    async def reader() -> None:
        async for line in follow(path, lambda: done, from_lines=1, poll_s=0.01):
            seen.append(line)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.05)
    for i in range(8):  # 8 * 7 bytes: rotates twice
        out.write(f"new {i}\n".encode())
        await asyncio.sleep(0.02)
    out.write(b"no newline")
    out.close()
    done = True
    await asyncio.wait_for(task, 5)
    assert seen == ["old 2"] + [f"new {i}" for i in range(8)] + ["no newline"]


async def test_follow_hands_what_the_log_held_to_earlier_and_misses_nothing_after(
    tmp_path: Path,
) -> None:
    """An attempt's followed log: the lines the log held go through ``earlier`` (which keeps
    that attempt's), then every line as it comes, from the same reader: a line written between
    the two is not lost (it was, when the held part was read apart), nor one half written."""
    path = tmp_path / "output.log"
    out = RotatingLog(path)
    out.write(b"keep 1\ndrop\nkeep 2\npar")
    done = False
    seen: list[str] = []
    handed = asyncio.Event()

    def kept(held: list[str]) -> list[str]:
        out.write(b"tial\nwritten meanwhile\n")  # as the held part is handed over
        handed.set()
        return [line for line in held if line.startswith("keep")]

    async def reader() -> None:
        async for line in follow(path, lambda: done, from_lines=10, poll_s=0.01, earlier=kept):
            seen.append(line)

    task = asyncio.create_task(reader())
    await asyncio.wait_for(handed.wait(), 5)
    out.write(b"new 1\n")
    out.close()
    done = True
    await asyncio.wait_for(task, 5)
    assert seen == ["keep 1", "keep 2", "partial", "written meanwhile", "new 1"]


def test_tail_reads_back_no_more_than_its_byte_bound(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    with RotatingLog(path, max_bytes=300_000, backups=2) as out:
        for i in range(20_000):
            out.write(f"line {i:05d} .....\n".encode())  # 17 bytes
        out.write(b"x" * 100_000)  # a last line without end
    # Bounded by lines first, then by bytes: the oldest (cut) line is dropped.
    assert tail(path, 3) == ["line 19998 .....", "line 19999 .....", "x" * 100_000]
    lines = tail(path, 10_000, max_bytes=100_000 + 17 * 50 + 5)
    assert lines == [f"line {i:05d} ....." for i in range(19_950, 20_000)] + ["x" * 100_000]
    # One endless line: its last max_bytes.
    assert tail(path, 10, max_bytes=1000) == ["x" * 1000]


def test_a_tail_being_read_is_not_disturbed_by_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    with RotatingLog(path, max_bytes=100, backups=1) as out:
        for i in range(5):
            out.write(f"old {i}\n".encode())
        with TailReader(path, 3, backups=1) as reader:
            first = reader.read(4)
            for i in range(40):  # rotates several times: the files read are renamed, dropped
                out.write(f"new {i:02d}\n".encode())
            rest = b"".join(iter(reader.read, b""))
    assert first + rest == b"old 2\nold 3\nold 4\n"


async def test_follow_yields_an_endless_line_in_bounded_pieces(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    done = False
    with RotatingLog(path) as out:
        seen: list[str] = []

        async def reader() -> None:
            async for line in follow(path, lambda: done, poll_s=0.01):
                seen.append(line)

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.05)
        out.write(b"y" * (3 * MAX_LINE_BYTES) + b"\nend\n")
        done = True
        await asyncio.wait_for(task, 5)
    assert all(len(line) <= 2 * MAX_LINE_BYTES for line in seen)
    assert "".join(seen[:-1]) == "y" * (3 * MAX_LINE_BYTES) and seen[-1] == "end"


# -- the executor --------------------------------------------------------------------------------


@pytest.fixture
async def executor(tmp_path: Path) -> AsyncIterator[ProcessExecutor]:
    config = ExecutorConfig(
        data_dir=tmp_path / "data",
        grace_s=5.0,
        progress_poll_s=0.05,
        progress_event_interval_s=0.0,
    )
    ex = ProcessExecutor(config)
    yield ex
    await asyncio.wait_for(ex.close(), 10)


def launch(code: str, **kwargs: object) -> Launch:
    return Launch(job_id=new_job_id(), attempt=1, argv=(PY, "-c", code), **kwargs)  # type: ignore[arg-type]


async def events_until_exit(ex: ProcessExecutor, job_id: str) -> list[ExecEvent]:
    out: list[ExecEvent] = []
    while True:
        event = await asyncio.wait_for(ex.events.get(), 10)
        if event.job_id == job_id:
            out.append(event)
            if isinstance(event, Exited):
                return out


async def wait_for_line(ex: ProcessExecutor, job_id: str, prefix: str, end: str = "") -> str:
    """The first log line starting with ``prefix`` (and ending with ``end``: the tail of a live
    log may show a line still being written)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in ex.tail(job_id, 50):
            if line.startswith(prefix) and line.endswith(end):
                return line
        await asyncio.sleep(0.02)
    raise AssertionError(f"no line starting {prefix!r} in {ex.tail(job_id, 50)}")


async def test_runs_a_job_to_its_exit_code(executor: ProcessExecutor) -> None:
    job = launch("import sys; print('hello out'); print('hello err', file=sys.stderr); sys.exit(3)")
    started = await executor.start(job)
    assert started.pid > 0
    assert started.log_path == executor.job_dir(job.job_id) / "output.log"
    if sys.platform != "win32":
        assert started.pgid == started.pid
    events = await events_until_exit(executor, job.job_id)
    assert isinstance(events[0], Started)
    exited = events[-1]
    assert isinstance(exited, Exited)
    assert (exited.exit_code, exited.signal, exited.cause, exited.ok) == (3, None, "exit", False)
    assert exited.runtime_s > 0
    assert exited.finished_at >= exited.started_at
    lines = executor.tail(job.job_id, 10)
    assert "hello out" in lines and "hello err" in lines
    assert lines[0].startswith("[shoal] attempt 1 starting: ")
    assert lines[-1].startswith("[shoal] attempt 1 exited with code 3 after ")
    assert await executor.wait(job.job_id) == exited
    assert executor.running() == ()


async def test_environment_reaches_the_job(executor: ProcessExecutor) -> None:
    job_id = new_job_id()
    spec = JobSpec(
        command=(
            PY,
            "-c",
            "import os; print(' '.join(os.environ.get(k, '-') for k in "
            "['SHOAL_JOB_ID','SHOAL_ATTEMPT','ROCR_VISIBLE_DEVICES','HIP_VISIBLE_DEVICES',"
            "'MY_VAR','SHOAL_CHECKPOINT_DIR']))",
        ),
        env={"MY_VAR": "mine", "ROCR_VISIBLE_DEVICES": "0,1,2,3"},
    )
    gpu = DeviceStatic(
        key="drm:card2", vendor="amd", backend="rocm", name="MI300X", source="test", vendor_index=1
    )
    job = Launch.from_spec(job_id, spec, attempt=4, devices=[gpu])
    await executor.start(job)
    exited = await executor.wait(job_id)
    assert exited.ok
    line = executor.tail(job_id, 2)[0]
    checkpoint = executor.job_dir(job_id) / "checkpoint"
    # Pinning wins over the job's own ROCR_VISIBLE_DEVICES.
    assert line == f"{job_id} 4 1 0 mine {checkpoint}"
    assert checkpoint.is_dir()


async def test_progress_line_and_eta(executor: ProcessExecutor) -> None:
    code = (
        "import time\n"
        "for i in range(1, 4):\n"
        "    print(f'SHOAL_PROGRESS {i / 4} step {i}', flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    job = launch(code)
    await executor.start(job)
    events = await events_until_exit(executor, job.job_id)
    progress = [e.progress for e in events if isinstance(e, ProgressChanged)]
    assert [(p.fraction, p.message) for p in progress] == [
        (0.25, "step 1"),
        (0.5, "step 2"),
        (0.75, "step 3"),
    ]
    assert progress[0].eta_s is None
    assert progress[-1].rate_per_s is not None and progress[-1].rate_per_s > 0
    assert progress[-1].eta_s is not None and progress[-1].eta_s > 0
    latest = executor.progress(job.job_id)
    assert latest is not None and latest.fraction == 0.75
    assert "SHOAL_PROGRESS 0.5 step 2" in executor.tail(job.job_id, 10)


async def test_progress_file(executor: ProcessExecutor) -> None:
    code = (
        "import os, time\n"
        "path = os.environ['SHOAL_PROGRESS_FILE']\n"
        "for f in ('0.2', '0.6 halfway'):\n"
        "    with open(path + '.tmp', 'w') as fh:\n"
        "        fh.write(f)\n"
        "    os.replace(path + '.tmp', path)\n"
        "    time.sleep(0.3)\n"
    )
    job = launch(code)
    await executor.start(job)
    events = await events_until_exit(executor, job.job_id)
    fractions = [e.progress.fraction for e in events if isinstance(e, ProgressChanged)]
    assert fractions == [0.2, 0.6]
    latest = executor.progress(job.job_id)
    assert latest is not None and latest.message == "halfway"


@posix_only
async def test_cancel_kills_the_whole_group_grandchild_included(
    executor: ProcessExecutor,
) -> None:
    # The job ignores SIGTERM and starts a grandchild that ignores it too: only SIGKILL of the
    # whole group ends both.
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "print('grandchild', child.pid, 'up', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = launch(code)
    await executor.start(job)
    line = await wait_for_line(executor, job.job_id, "grandchild", end=" up")
    grandchild = int(line.split()[1])
    assert psutil.pid_exists(grandchild)
    exited = await asyncio.wait_for(executor.stop(job.job_id, grace_s=0.3), 10)
    assert exited is not None
    assert (exited.exit_code, exited.signal, exited.cause) == (None, "SIGKILL", "cancel")
    assert_gone(grandchild)
    events = await events_until_exit(executor, job.job_id)
    cancelled = [e for e in events if isinstance(e, Cancelled)]
    assert cancelled == [Cancelled(job.job_id, 1, "cancel", "SIGTERM", 0.3)]
    assert "[shoal] attempt 1 stopping (cancel): SIGTERM" in executor.tail(job.job_id, 5)


@posix_only
async def test_leftovers_are_killed_when_the_leader_exits(executor: ProcessExecutor) -> None:
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " stdout=subprocess.DEVNULL)\n"
        "print('grandchild', child.pid, flush=True)\n"
    )
    job = launch(code)
    await executor.start(job)
    exited = await asyncio.wait_for(executor.wait(job.job_id), 10)
    assert exited.ok
    grandchild = int((await wait_for_line(executor, job.job_id, "grandchild")).split()[1])
    assert_gone(grandchild)


@posix_only
async def test_checkpoint_signal_lets_the_job_save_and_leave(executor: ProcessExecutor) -> None:
    code = (
        "import os, signal, sys, time\n"
        "def save(*_):\n"
        "    open(os.path.join(os.environ['SHOAL_CHECKPOINT_DIR'], 'ckpt'), 'w').write('step 7')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, save)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = launch(code, stop_signal="SIGUSR1")
    await executor.start(job)
    await wait_for_line(executor, job.job_id, "ready")
    exited = await asyncio.wait_for(executor.stop(job.job_id, cause="migrate"), 10)
    assert exited is not None
    assert (exited.exit_code, exited.signal, exited.cause) == (0, None, "migrate")
    assert not exited.ok  # it did not end on its own
    ckpt = executor.job_dir(job.job_id) / "checkpoint" / "ckpt"
    assert ckpt.read_text() == "step 7"


async def test_max_runtime_is_enforced(executor: ProcessExecutor) -> None:
    job = launch("import time; time.sleep(60)", max_runtime_s=0.3)
    await executor.start(job)
    events = await events_until_exit(executor, job.job_id)
    assert TimedOut(job.job_id, 1, 0.3) in events
    assert not any(isinstance(e, Cancelled) for e in events)
    exited = events[-1]
    assert isinstance(exited, Exited)
    assert exited.cause == "timeout"
    if sys.platform != "win32":
        assert (exited.exit_code, exited.signal) == (None, "SIGTERM")
    assert exited.runtime_s < 10


async def test_follow_streams_until_the_job_ends(executor: ProcessExecutor) -> None:
    code = (
        "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n"
    )
    job = launch(code)
    await executor.start(job)
    lines = [line async for line in executor.follow(job.job_id)]
    ticks = [line for line in lines if line.startswith("tick")]
    assert ticks == [f"tick {i}" for i in range(5)]
    assert lines[-1].startswith("[shoal] attempt 1 exited with code 0")


async def test_a_program_that_is_not_executable(executor: ProcessExecutor, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho hi\n")  # no execute bit
    job = Launch(job_id=new_job_id(), attempt=1, argv=(str(script),))
    with pytest.raises(LaunchError, match=r"cannot start .*train\.sh.*: Permission denied"):
        await executor.start(job)
    assert executor.running() == ()


async def test_a_command_that_cannot_start(executor: ProcessExecutor) -> None:
    job = Launch(job_id=new_job_id(), attempt=1, argv=("/nonexistent/shoal-no-such-program",))
    with pytest.raises(LaunchError, match="cannot start '/nonexistent/shoal-no-such-program'"):
        await executor.start(job)
    assert executor.running() == ()
    assert "cannot start" in executor.tail(job.job_id, 1)[0]


async def test_the_same_job_twice_is_refused(executor: ProcessExecutor) -> None:
    job = launch("import time; time.sleep(60)")
    await executor.start(job)
    with pytest.raises(ValueError, match="already runs here"):
        await executor.start(job)
    exited = await asyncio.wait_for(executor.stop(job.job_id, grace_s=2), 10)
    assert exited is not None and exited.cause == "cancel"
    assert await executor.stop(job.job_id) is None


async def test_callback_receives_events(tmp_path: Path) -> None:
    seen: list[ExecEvent] = []
    ex = ProcessExecutor(ExecutorConfig(data_dir=tmp_path), on_event=seen.append)
    job = launch("pass")
    await ex.start(job)
    await asyncio.wait_for(ex.wait(job.job_id), 10)
    assert [type(e) for e in seen] == [Started, Exited]
    assert ex.events.empty()


def test_launch_validation() -> None:
    with pytest.raises(ValueError, match="32 lowercase hex"):
        Launch(job_id="../x", attempt=1, argv=("true",))
    with pytest.raises(ValueError, match="attempt numbers start at 1"):
        Launch(job_id=new_job_id(), attempt=0, argv=("true",))
    with pytest.raises(ValueError, match="not one Shoal sends"):
        Launch(job_id=new_job_id(), attempt=1, argv=("true",), stop_signal="SIGKILL")
    with pytest.raises(ValueError, match="not an image reference"):
        Launch(job_id=new_job_id(), attempt=1, argv=("true",), image="Bad Image")
    job = Launch.from_spec(new_job_id(), JobSpec(command=("x",), image="nvcr.io/x"), attempt=1)
    assert job.image == "nvcr.io/x"


async def test_an_image_without_a_container_runtime_fails_its_launch(tmp_path: Path) -> None:
    ex = ProcessExecutor(ExecutorConfig(data_dir=tmp_path))
    job = Launch.from_spec(new_job_id(), JobSpec(command=("x",), image="nvcr.io/x"), attempt=1)
    with pytest.raises(LaunchError, match="no container runtime"):
        await ex.start(job)
    assert ex.running() == ()
    await ex.close()


def assert_gone(pid: int) -> None:
    """The process is gone (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + 10
    status = "?"
    while time.monotonic() < deadline:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return
        if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still there after SIGKILL of its group: {status}")


async def test_a_missing_working_directory_is_named(
    executor: ProcessExecutor, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-dir"
    job = Launch(job_id=new_job_id(), attempt=1, argv=(PY, "-c", "pass"), cwd=str(missing))
    with pytest.raises(LaunchError, match="no-such-dir"):
        await executor.start(job)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["setpriv", "preexec_fn"])
def test_a_silent_job_dies_with_a_killed_agent(tmp_path: Path, launcher: str) -> None:
    """kill -9 of the agent must not leave its job running beside a requeued attempt.

    Through util-linux's setpriv where it exists, else a preexec_fn (both set PR_SET_PDEATHSIG).
    """
    if launcher == "setpriv":
        require_system(shutil.which("setpriv") is not None, "util-linux's setpriv")
    agent = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "import agent.execution.executor\n"
        + (
            "agent.execution.executor._death_signal_launcher = lambda: ()\n"
            if launcher != "setpriv"
            else ""
        )
        + "from agent.execution.executor import ProcessExecutor, Started\n"
        + "from agent.execution.launch import ExecutorConfig, Launch\n"
        "async def main():\n"
        f"    ex = ProcessExecutor(ExecutorConfig(data_dir=Path({str(tmp_path)!r})))\n"
        "    job = Launch(job_id='a' * 32, attempt=1, argv=('sleep', '60'))\n"
        "    await ex.start(job)\n"
        "    while True:\n"
        "        event = await ex.events.get()\n"
        "        if isinstance(event, Started):\n"
        "            print(event.pid, flush=True)\n"
        "            await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([PY, "-c", agent], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        job_pid = int(parent.stdout.readline())
        # The death signal is armed in the job's process before it execs the job (by setpriv,
        # or the preexec_fn): this is about a job that started, so the kill waits for the exec
        # (killed before the arming, the job never starts: the next test).
        deadline = time.monotonic() + 10
        while psutil.Process(job_pid).name() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.Process(job_pid).name() == "sleep"
    finally:
        parent.kill()
        parent.communicate(timeout=10)  # reaps it and closes its pipe
    assert_gone(job_pid)
    # What the killed agent left (its job's cgroup, where it had one) goes when one restarts.
    ProcessExecutor(ExecutorConfig(data_dir=tmp_path)).cage.close()


_SLOW_LAUNCHES = {
    # The death signal is armed two seconds late (setpriv starts after a sleep), or the
    # preexec_fn sleeps before it arms it: the launch's window, held open.
    "setpriv": (
        "launch = agent.execution.executor._death_signal_launcher()\n"
        "agent.execution.executor._death_signal_launcher = lambda: (\n"
        "    '/bin/sh', '-c', 'sleep 2; exec \"$@\"', 'sh', *launch)\n"
    ),
    "preexec_fn": (
        "import time, agent.execution.spawn\n"
        "agent.execution.executor._death_signal_launcher = lambda: ()\n"
        "setup = agent.execution.spawn._child_setup\n"
        "def slow(user, procs):\n"
        "    arm = setup(user, procs)\n"
        "    return lambda: (time.sleep(2), arm())\n"
        "agent.execution.spawn._child_setup = slow\n"
    ),
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["setpriv", "preexec_fn"])
def test_an_agent_killed_before_the_death_signal_is_armed_leaves_no_job_started(
    tmp_path: Path, launcher: str
) -> None:
    """The launch's window: killed between its fork and the arming, the agent would not take
    the job along; the job's process sees its parent is no longer the agent and never starts."""
    if launcher == "setpriv":
        require_system(shutil.which("setpriv") is not None, "util-linux's setpriv")
    started = tmp_path / "started"
    agent = (
        "import asyncio\n"
        "from pathlib import Path\n"
        "import agent.execution.executor\n"
        + _SLOW_LAUNCHES[launcher]
        + "from agent.execution.executor import ProcessExecutor\n"
        + "from agent.execution.launch import ExecutorConfig, Launch\n"
        "async def main():\n"
        f"    ex = ProcessExecutor(ExecutorConfig(data_dir=Path({str(tmp_path)!r})))\n"
        f"    argv = ('/bin/sh', '-c', 'touch {started}; exec sleep 60')\n"
        "    print('starting', flush=True)\n"
        "    await ex.start(Launch(job_id='a' * 32, attempt=1, argv=argv))\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([PY, "-c", agent], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == "starting\n"
        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)
        (job,) = psutil.Process(parent.pid).children()
    finally:
        parent.kill()
        parent.communicate(timeout=10)  # reaps it and closes its pipe
    try:
        assert_gone(job.pid)  # two seconds on, once it checked its parent
        assert not started.exists(), "the job started after its agent was killed"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            job.kill()  # what a failure would leave
        ProcessExecutor(ExecutorConfig(data_dir=tmp_path)).cage.close()


def test_the_lines_of_one_attempt_are_found_by_its_markers() -> None:
    log = [
        "tail of attempt 1",
        "[shoal] attempt 1 exited with code 1 after 0.1s",
        "[shoal] attempt 2 starting: python x",
        "second",
        "[shoal] attempt 2 stopping (cancel): SIGTERM",
        "[shoal] attempt 2 exited with signal SIGTERM after 1.0s",
        "[shoal] attempt 3 starting: python x",
        "third",
    ]
    assert list(lines_of_attempt(log, 1)) == log[:2]
    assert list(lines_of_attempt(log, 2)) == log[2:6]
    assert list(lines_of_attempt(log, 3)) == log[6:]
    assert list(lines_of_attempt(log, 4)) == []
