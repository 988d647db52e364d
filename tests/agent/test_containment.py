"""Jobs are not the agent: the job user, the agent's private files, a clean environment, and every
process a job starts killed with it (cgroup v2, and the subreaper forced). Real processes only."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from agent.execution.containment import ContainmentChoice, SubreaperCage, open_cage
from agent.execution.executor import Exited, ProcessExecutor, ProgressChanged
from agent.execution.jobuser import SYSTEM_PATH
from agent.execution.launch import ExecutorConfig, Launch
from agent.job.jobspec import JobSpec, new_job_id
from agent.storage.store import Store
from gossip.identity import enroll_node, init_cluster
from probers.records import DeviceStatic
from tests.agent.test_job_env import job_python
from tests.support import require_system

PY = sys.executable
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux mechanisms")


def require_root_and_nobody() -> None:
    require_system(sys.platform != "win32" and os.geteuid() == 0, "root, to run jobs as nobody")
    import pwd

    try:
        pwd.getpwnam("nobody")
    except KeyError:
        require_system(False, "a 'nobody' user")


def require_cage(choice: ContainmentChoice, tmp_path: Path) -> None:
    try:
        open_cage(choice, tmp_path).close()
    except ValueError as exc:
        require_system(False, f"containment {choice}: {exc}")


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A folder any user may pass through (pytest's own sits below a 0700 folder)."""
    root = Path(tempfile.mkdtemp(prefix="shoal-test-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def agent_files(data: Path) -> None:
    """What an agent keeps in its data folder: its identity and its store."""
    now = datetime.now(UTC)
    cluster = init_cluster(data.parent / "cluster", "test", "operator", now)
    enroll_node(cluster.ca, data / "identity", "agent", ["127.0.0.1"], timedelta(days=1), now)
    with Store(data / "agent.sqlite") as store:
        store.set_node_id("n" * 32)


def executor(data: Path, **options: object) -> ProcessExecutor:
    config = ExecutorConfig(data_dir=data, grace_s=5.0, progress_poll_s=0.05)
    return ProcessExecutor(replace(config, **options))


async def run(ex: ProcessExecutor, argv: tuple[str, ...], **env: str) -> tuple[Exited, list[str]]:
    job = Launch(job_id=new_job_id(), attempt=1, argv=argv, env=env)
    await ex.start(job)
    exited = await asyncio.wait_for(ex.wait(job.job_id), 30)
    return exited, ex.tail(job.job_id, 200)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- the job user --------------------------------------------------------------------------------

READER = """
id -u
for f in ../../identity/node.key "$DATA/identity/node.key" "$DATA/agent.sqlite" \\
         "$DATA/agent.sqlite-wal"; do
    if cat "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi
done
if ls .. >/dev/null 2>&1; then echo LISTED; else echo NOT-LISTED; fi
echo 0.5 > "$SHOAL_PROGRESS_FILE"
touch "$SHOAL_CHECKPOINT_DIR/ckpt" && echo CHECKPOINT-OK
touch in-my-folder && echo FOLDER-OK
sleep 0.3
"""


@pytest.mark.system
@linux_only
async def test_a_job_as_nobody_cannot_read_the_agents_key_nor_its_store(open_root: Path) -> None:
    require_root_and_nobody()
    data = open_root / "data"
    agent_files(data)
    ex = executor(data, job_user="nobody")
    try:
        exited, lines = await run(ex, ("sh", "-c", READER), DATA=str(data))
    finally:
        await ex.close()
    assert exited.ok, lines
    assert "65534" in lines
    denied = [line for line in lines if line.startswith(("READ", "DENIED"))]
    assert denied == [
        "DENIED ../../identity/node.key",
        f"DENIED {data}/identity/node.key",
        f"DENIED {data}/agent.sqlite",
        f"DENIED {data}/agent.sqlite-wal",
    ]
    # It may pass through the agent's folders to its own, not list them; its folder is its own.
    assert "NOT-LISTED" in lines and "CHECKPOINT-OK" in lines and "FOLDER-OK" in lines
    assert not any("PRIVATE KEY" in line for line in lines)


@pytest.mark.system
@linux_only
async def test_progress_and_checkpoint_work_for_a_job_as_nobody(open_root: Path) -> None:
    require_root_and_nobody()
    data = open_root / "data"
    ex = executor(data, job_user="nobody", progress_event_interval_s=0.0)
    try:
        exited, lines = await run(ex, ("sh", "-c", READER), DATA=str(data))
        progress = [e for e in _drain(ex) if isinstance(e, ProgressChanged)]
    finally:
        await ex.close()
    assert exited.ok, lines
    assert [p.progress.fraction for p in progress] == [0.5]


def _drain(ex: ProcessExecutor) -> list[object]:
    out = []
    while not ex.events.empty():
        out.append(ex.events.get_nowait())
    return out


PLANTER = """
ln -s "$DATA/identity/node.key" output.log.1
rm -f output.log && ln -s "$DATA/victim" output.log
rm -f progress && mkfifo progress
echo planted
"""


@linux_only
@pytest.mark.parametrize("user", ["", "nobody"])
async def test_links_and_fifos_a_job_plants_are_never_followed(open_root: Path, user: str) -> None:
    if user:
        require_root_and_nobody()
    data = open_root / "data"
    agent_files(data)
    (data / "victim").write_text("precious\n")
    ex = executor(data, job_user=user)
    job_id = new_job_id()
    try:
        first = Launch(
            job_id=job_id, attempt=1, argv=("sh", "-c", PLANTER), env={"DATA": str(data)}
        )
        await ex.start(first)
        assert (await asyncio.wait_for(ex.wait(job_id), 30)).ok
        # The next attempt writes its log afresh, reads no FIFO, follows no link.
        second = Launch(job_id=job_id, attempt=2, argv=("sh", "-c", "echo second; sleep 0.3"))
        await ex.start(second)
        assert (await asyncio.wait_for(ex.wait(job_id), 30)).ok
        lines = ex.tail(job_id, 500)
    finally:
        await ex.close()
    assert (data / "victim").read_text() == "precious\n"
    assert "second" in lines
    assert not any("PRIVATE KEY" in line for line in lines)
    log = ex.log_path(job_id)
    assert stat.S_ISREG(os.lstat(log).st_mode) and mode(log) == 0o600


# -- the environment -----------------------------------------------------------------------------

PRINT_ENV = "import json, os; print('ENV', json.dumps(dict(os.environ)))"


@linux_only
async def test_the_agents_environment_does_not_reach_the_job(
    open_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_PASSWORD", "hunter2")
    monkeypatch.setenv("LC_TIME", "C")
    spec = JobSpec(command=(PY, "-c", PRINT_ENV), env={"MY_VAR": "mine"})
    gpu = DeviceStatic(
        key="drm:card1", vendor="amd", backend="rocm", name="MI300X", source="test", vendor_index=0
    )
    ex = executor(open_root / "data")
    job = Launch.from_spec(new_job_id(), spec, attempt=1, devices=[gpu])
    try:
        await ex.start(job)
        assert (await asyncio.wait_for(ex.wait(job.job_id), 30)).ok
        env = _env_of(ex.tail(job.job_id, 20))
    finally:
        await ex.close()
    assert "DATABASE_PASSWORD" not in env and "hunter2" not in env.values()
    assert env["MY_VAR"] == "mine" and env["LC_TIME"] == "C"
    assert env["PATH"] == os.environ["PATH"]
    assert {"HOME", "USER", "LOGNAME"} <= env.keys()
    # Given an AMD GPU: pinned to it, NVIDIA GPUs hidden.
    assert env["ROCR_VISIBLE_DEVICES"] == "0" and env["HIP_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert env["SHOAL_JOB_ID"] == job.job_id and env["SHOAL_ATTEMPT"] == "1"
    allowed = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "MY_VAR"}
    allowed.add("PWD")  # exported by the shells of the launch (agent/execution/spawn.py)
    extra = {k for k in env if k not in allowed and not k.startswith(("LC_", "SHOAL_"))}
    assert extra == {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}


@pytest.mark.system
@linux_only
async def test_a_job_as_nobody_gets_nobodys_home_and_name(open_root: Path) -> None:
    require_root_and_nobody()
    import pwd

    ex = executor(open_root / "data", job_user="nobody")
    try:
        exited, lines = await run(ex, (job_python(), "-c", PRINT_ENV))
    finally:
        await ex.close()
    assert exited.ok, lines
    env = _env_of(lines)
    assert env["HOME"] == pwd.getpwnam("nobody").pw_dir
    assert env["USER"] == env["LOGNAME"] == "nobody"
    # The system's PATH, not the agent's (which may name folders nobody cannot enter).
    assert env["PATH"] == SYSTEM_PATH


def _env_of(lines: list[str]) -> dict[str, str]:
    import json

    line = next(line for line in lines if line.startswith("ENV "))
    env: dict[str, str] = json.loads(line[4:])
    return env


# -- modes ---------------------------------------------------------------------------------------


@linux_only
@pytest.mark.parametrize("user", ["", "nobody"])
async def test_the_agents_files_are_private_under_umask_000(open_root: Path, user: str) -> None:
    if user:
        require_root_and_nobody()
    data = open_root / "deep" / "data"
    old = os.umask(0)
    try:
        agent_files(data)
        ex = executor(data, job_user=user)
        try:
            exited, lines = await run(ex, ("sh", "-c", "echo 1 > new-file"))
        finally:
            await ex.close()
        with Store(data / "agent.sqlite") as store:  # the WAL files exist while it is open
            store.set_node_id("n" * 32)
            wal = [data / "agent.sqlite-wal", data / "agent.sqlite-shm"]
            assert all(p.exists() and mode(p) == 0o600 for p in wal)
    finally:
        os.umask(old)
    assert exited.ok, lines
    shared = 0o711 if user else 0o700  # the job user passes through to its folder
    assert mode(open_root / "deep") == 0o700  # a parent made on the way
    assert mode(data) == shared and mode(data / "jobs") == shared
    assert mode(data / "identity") == 0o700 and mode(data / "identity" / "node.key") == 0o600
    assert mode(data / "identity" / "node.crt") == 0o644
    assert mode(data / "agent.sqlite") == 0o600
    cluster = data.parent / "cluster"
    assert mode(cluster) == 0o700 and mode(cluster / "ca.key") == 0o600
    job_dir = next((data / "jobs").iterdir())
    assert mode(job_dir) == 0o700 and mode(job_dir / "checkpoint") == 0o700
    assert mode(job_dir / "output.log") == 0o600
    owner = 65534 if user else os.geteuid()
    assert job_dir.stat().st_uid == owner and (job_dir / "checkpoint").stat().st_uid == owner
    assert (job_dir / "output.log").stat().st_uid == os.geteuid()


# -- every process a job starts ------------------------------------------------------------------

DAEMONS = {
    "setsid": (
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(300)\n"
        "    os._exit(0)\n"
        "print('daemon', pid, flush=True)\n"
    ),
    "double-fork": (
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(300)\n"
        "        os._exit(0)\n"
        "    os.write(w, str(pid).encode())\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "print('daemon', os.read(r, 32).decode(), flush=True)\n"
    ),
    "nohup": (
        "out = subprocess.run(['sh', '-c', 'nohup sleep 300 >/dev/null 2>&1 & echo $!'],"
        " capture_output=True, text=True).stdout\n"
        "print('daemon', out.strip(), flush=True)\n"
    ),
    "scrubbed": (  # a double fork that also leaves Shoal's variables behind
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.execve('/bin/sleep', ['sleep', '300'], {})\n"
        "    os.write(w, str(pid).encode())\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "print('daemon', os.read(r, 32).decode(), flush=True)\n"
    ),
}


def daemon_job(kind: str, *, leader_stays: bool) -> Launch:
    code = "import os, subprocess, time\n" + DAEMONS[kind]
    if leader_stays:
        code += "time.sleep(300)\n"
    return Launch(job_id=new_job_id(), attempt=1, argv=(PY, "-c", code))


async def daemon_pid(ex: ProcessExecutor, job_id: str) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for line in ex.tail(job_id, 20):
            if line.startswith("daemon "):
                return int(line.split()[1])
        await asyncio.sleep(0.02)
    raise AssertionError(f"no daemon pid in {ex.tail(job_id, 20)}")


def assert_gone_and_reaped(pid: int) -> None:
    """Dead and reaped (a zombie left under the test process would be the subreaper's fault)."""
    deadline = time.monotonic() + 10
    status = "?"
    while time.monotonic() < deadline:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} is still there: {status}")


@pytest.fixture
async def caged(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ProcessExecutor]:
    choice: ContainmentChoice = request.param
    require_cage(choice, tmp_path / "probe")
    ex = executor(tmp_path / "data", containment=choice)
    assert ex.cage.mode == choice
    yield ex
    await asyncio.wait_for(ex.close(), 20)


CAGES = pytest.mark.parametrize("caged", ["cgroup", "subreaper"], indirect=True)


@linux_only
@CAGES
@pytest.mark.parametrize("kind", ["setsid", "double-fork", "nohup", "scrubbed"])
async def test_daemons_die_when_the_job_is_cancelled(caged: ProcessExecutor, kind: str) -> None:
    job = daemon_job(kind, leader_stays=True)
    await caged.start(job)
    pid = await daemon_pid(caged, job.job_id)
    assert psutil.pid_exists(pid)
    exited = await asyncio.wait_for(caged.stop(job.job_id, grace_s=0.2), 20)
    assert exited is not None and exited.cause == "cancel"
    assert_gone_and_reaped(pid)


@linux_only
@CAGES
@pytest.mark.parametrize("kind", ["setsid", "double-fork", "nohup", "scrubbed"])
async def test_daemons_die_when_the_leader_exits(caged: ProcessExecutor, kind: str) -> None:
    job = daemon_job(kind, leader_stays=False)
    await caged.start(job)
    exited = await asyncio.wait_for(caged.wait(job.job_id), 20)
    assert exited.ok
    assert_gone_and_reaped(await daemon_pid(caged, job.job_id))


@linux_only
@pytest.mark.parametrize("caged", ["subreaper"], indirect=True)
async def test_a_scrubbed_orphan_lives_until_every_job_of_its_time_ends(
    caged: ProcessExecutor,
) -> None:
    """The subreaper's documented limit: an orphan without Shoal's variables cannot be told
    apart between the jobs that ran when it was born, so it dies with the last of them."""
    other = Launch(job_id=new_job_id(), attempt=1, argv=("sleep", "300"))
    await caged.start(other)
    job = daemon_job("scrubbed", leader_stays=False)
    await caged.start(job)
    assert (await asyncio.wait_for(caged.wait(job.job_id), 20)).ok
    pid = await daemon_pid(caged, job.job_id)
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    await asyncio.wait_for(caged.stop(other.job_id, grace_s=0.2), 20)
    assert_gone_and_reaped(pid)


@linux_only
@pytest.mark.parametrize("caged", ["subreaper"], indirect=True)
async def test_orphans_that_end_on_their_own_are_reaped_while_the_job_runs(
    caged: ProcessExecutor,
) -> None:
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(0.1)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('daemon', 0, flush=True)\n"
        "time.sleep(300)\n"
    )
    job = Launch(job_id=new_job_id(), attempt=1, argv=(PY, "-c", code))
    await caged.start(job)
    await daemon_pid(caged, job.job_id)
    await asyncio.sleep(1.0)  # the grandchild ended after 0.1 s; the reaper runs every 0.5 s
    mine = os.getsid(0)  # the job's orphans live in other sessions
    zombies = [
        c.pid
        for c in psutil.Process().children()
        if c.status() == psutil.STATUS_ZOMBIE and os.getsid(c.pid) != mine
    ]
    assert zombies == []
    await asyncio.wait_for(caged.stop(job.job_id, grace_s=0.2), 20)


@linux_only
def test_the_subreaper_never_reaps_the_agents_own_children(tmp_path: Path) -> None:
    cage = open_cage("subreaper", tmp_path)
    assert isinstance(cage, SubreaperCage)
    try:
        child = subprocess.Popen(["sh", "-c", "exit 7"])
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert cage.reap() == 0
        assert child.wait(timeout=10) == 7
    finally:
        cage.close()


@linux_only
def test_a_restarted_agent_kills_what_its_cgroup_still_holds(tmp_path: Path) -> None:
    require_cage("cgroup", tmp_path / "probe")
    data = tmp_path / "data"
    cage = open_cage("cgroup", data)
    cage.enter("x-1")
    procs = cage.cgroup_procs("x-1")
    assert procs is not None
    left = subprocess.Popen(
        ["sh", "-c", f'echo 0 > "{procs}"; exec sleep 300'], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while str(left.pid) not in procs.read_text().split():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        open_cage("cgroup", data).close()  # the agent's next start, on the same data folder
        assert left.wait(timeout=10) == -9
        assert not procs.parent.exists()
    finally:
        left.kill()
        left.wait()
