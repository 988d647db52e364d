"""The bottleneck hints loop on a live agent: a job that holds a GPU it barely uses is told
``idle_allocated`` once the rule's window has passed, as an event of kind ``hint`` and in
``shoal jobs JOB --json``.

The job is a 1 GiB share of a simulated 80 GiB H100, which the simulation keeps busy in
proportion to the share (90% x 1/80: about 1%), so the GPU is held and idle. The agent judges
every 2 s over a 20 s window (``hints_every_s``, ``hints_window_s``; five minutes and one by
default, which the test would wait out in full).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent.job.jobspec import Resources, new_job_id
from tests.agent.agents import spec as job_spec
from tests.agent.agents import started
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

SLEEPER = (sys.executable, "-c", "import time; time.sleep(900)")
EVERY_S = 2
WINDOW_S = 20


def test_a_job_on_an_idle_gpu_is_told_idle_allocated_as_an_event_and_in_shoal_jobs(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f"hints_every_s = {EVERY_S}\nhints_window_s = {WINDOW_S}\n")
    with started(tmp_path, ["h100:1"], extra=("--config", str(config))) as mesh:
        a = mesh.agents[0]
        job_id = new_job_id()
        share = Resources(gpus_per_node=1, share_mem_bytes=2**30)
        body = {"job_id": job_id, "spec": job_spec(SLEEPER, resources=share)}
        status, answer = mesh.command(a, "submit", body)
        assert status == 200, answer
        mesh.wait("the job running", lambda: mesh.job(a, job_id)["state"] == "running", 60)
        [device] = mesh.job(a, job_id)["devices"]

        def told() -> list[dict[str, object]]:
            return [e for e in mesh.events(a) if e["kind"] == "hint" and e["job_id"] == job_id]

        # the window filled (from the agent's start), then the loop's next round, and slack
        mesh.wait("the idle_allocated hint", lambda: bool(told()), WINDOW_S + 2 * EVERY_S + 30)
        [event] = told()
        message = str(event["message"])
        assert message.startswith(f"idle_allocated on {device}: ")
        assert event["node"] == a.node_id

        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        done = shoal("jobs", job_id, "--json", *flags)
        assert done.returncode == 0, done.stderr
        hints = json.loads(done.stdout)["hints"]
        assert [h["message"] for h in hints] == [message]
        table = shoal("jobs", job_id, *flags)
        assert f"Hint      {message}" in table.stdout
