"""A real ``shoal agent`` running as root runs its jobs as ``nobody``: a job cannot read the
agent's key or store, and the daemon it leaves behind dies when it ends."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from agent.jobspec import new_job_id
from tests.agent.agents import Mesh, spec
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
