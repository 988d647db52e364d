"""A real ``shoal agent`` running as root runs its jobs as ``nobody``: a job cannot read the
agent's key or store, the daemon it leaves behind dies when it ends, its environment acts only
in the job, and a program nobody cannot reach fails saying so."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agent.job.jobspec import new_job_id
from tests.agent.agents import Mesh, spec
from tests.agent.test_job_env import Traps, lay_traps
from tests.shoal_cli import shoal
from tests.support import require_system

pytestmark = [pytest.mark.slow, pytest.mark.system]

SCRIPT = """
echo "uid $(id -u)"
for f in ../../identity/node.key "$1/identity/node.key" "$1/agent.sqlite"; do
    if cat "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi
done
setsid sleep 300 >/dev/null 2>&1 &
echo "daemon $!"
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setpriv, cgroups: Linux")
def test_a_job_cannot_read_the_agents_key_and_its_daemon_dies_with_it() -> None:
    require_system(os.geteuid() == 0, "root, so that the agent runs its jobs as nobody")
    # A folder nobody may pass through, so that only the modes of the agent's files stop it.
    root = Path(tempfile.mkdtemp(prefix="shoal-agent-", dir="/tmp"))
    root.chmod(0o755)
    mesh = Mesh(root, ["h100:1"], job_user=None)
    try:
        mesh.start_all()
        agent = mesh.agents[0]
        job_id = new_job_id()
        argv = ["sh", "-c", SCRIPT, "sh", str(agent.directory)]
        assert mesh.command(agent, "submit", {"job_id": job_id, "spec": spec(argv)})[0] == 200
        mesh.wait("the job to end", lambda: mesh.job(agent, job_id)["state"] == "succeeded")
        status, text = mesh.request(agent, "GET", f"/v1/jobs/{job_id}/logs?lines=50")
        assert status == 200
        lines = text.decode().splitlines()
        assert "uid 65534" in lines
        assert [line for line in lines if line.startswith(("READ", "DENIED"))] == [
            "DENIED ../../identity/node.key",
            f"DENIED {agent.directory}/identity/node.key",
            f"DENIED {agent.directory}/agent.sqlite",
        ]
        daemon = int(next(line for line in lines if line.startswith("daemon ")).split()[1])
        deadline = time.monotonic() + 10
        while psutil.pid_exists(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(daemon), "the job's setsid daemon outlived it"
        assert "jobs run as user nobody" in mesh.logs()
    finally:
        mesh.stop_all()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def root_mesh() -> Iterator[tuple[Mesh, Traps]]:
    """One agent as root, its jobs as nobody, and a folder every job may write, holding what a
    hostile job would leave there (``tests.agent.test_job_env``)."""
    require_system(sys.platform.startswith("linux"), "setpriv: Linux")
    require_system(os.geteuid() == 0, "root, so that the agent runs its jobs as nobody")
    for program in ("gcc", "nm"):
        require_system(shutil.which(program) is not None, f"{program}, to build the trap")
    root = Path(tempfile.mkdtemp(prefix="shoal-agent-", dir="/tmp"))
    root.chmod(0o755)
    (root / "shared").mkdir()
    traps = lay_traps(root / "shared")
    mesh = Mesh(root / "mesh", ["h100:1"], job_user=None)
    try:
        mesh.start_all()
        yield mesh, traps
    finally:
        mesh.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def test_a_jobs_ld_preload_runs_only_as_the_job_user(root_mesh: tuple[Mesh, Traps]) -> None:
    """Another job left a library in a folder every job may write; a job names it in
    LD_PRELOAD: it loads into the job (as nobody), never into the launch that runs as root."""
    mesh, traps = root_mesh
    agent = mesh.agents[0]
    traps.reset()
    job_id = new_job_id()
    job = spec(["sh", "-c", "echo ran"], env={"LD_PRELOAD": str(traps.spy)})
    assert mesh.command(agent, "submit", {"job_id": job_id, "spec": job})[0] == 200
    mesh.wait("the job to end", lambda: mesh.job(agent, job_id)["state"] == "succeeded")
    loaded = traps.lines()
    assert loaded, "the job's LD_PRELOAD never reached it"
    assert [line for line in loaded if not line.startswith("uid=65534 ")] == []


def test_a_program_the_job_user_cannot_reach_fails_saying_why(
    root_mesh: tuple[Mesh, Traps],
) -> None:
    mesh, traps = root_mesh
    agent = mesh.agents[0]
    private = traps.root.parent / "private"
    private.mkdir(mode=0o700)
    program = private / "train.sh"
    program.write_text("#!/bin/sh\necho trained\n")
    program.chmod(0o755)
    job_id = new_job_id()
    assert mesh.command(agent, "submit", {"job_id": job_id, "spec": spec([str(program)])})[0] == 200
    mesh.wait("the job failed", lambda: mesh.job(agent, job_id)["state"] == "failed")
    why = (
        f"the job user nobody cannot execute {program}: permission denied"
        f" (it cannot pass through {private})"
    )
    assert mesh.job(agent, job_id)["reason"].startswith(why)
    flags = ("--agent", agent.address, "--identity", str(mesh.cluster_dir))
    detail = shoal("jobs", job_id, *flags)
    assert detail.returncode == 0, detail.stderr
    said = [line.split(None, 1)[1] for line in detail.stdout.splitlines() if line.startswith("Why")]
    assert said and said[0].startswith(why), detail.stdout
    # The list shows it too (cut to the terminal's width), in place of the command.
    listed = shoal("jobs", *flags)
    row = next(line for line in listed.stdout.splitlines() if line.startswith(job_id[:8]))
    shown = row.rstrip().rsplit("  ", 1)[-1].rstrip("…")
    assert len(shown) >= 10 and why.startswith(shown), listed.stdout
