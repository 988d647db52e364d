"""The fleet view on a real mesh: two agent processes on loopback, one job holding one of the
two H100s, and one job that waits for the L4 on a cordoned node while that L4 stands free: the
view reads both nodes' own history and shows the H100 half allocated and the L4's idle time
while the job waited; ``shoal history --fleet`` counts the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.sandbox.localmesh import LocalMesh
from tests.shoal_cli import one_line_error, shoal
from tests.tui.helpers import api_until, wait_for
from tui.app import ShoalApp
from tui.cli import api_source
from tui.screens.fleet import FleetScreen

pytestmark = pytest.mark.slow

SLEEP = (sys.executable, "-c", "import time; time.sleep(120)")


def _state(jobs: list[dict[str, Any]], job_id: str) -> str | None:
    return next((j["state"] for j in jobs if j["job_id"] == job_id), None)


async def test_the_fleet_view_reads_every_agent_and_counts_the_idle_while_a_job_waited(
    tmp_path: Path,
) -> None:
    mesh = LocalMesh(tmp_path, 2, profiles=("h100:2", "l4:1"), extra_args=("--job-user", ""))
    mesh.start()
    peer = mesh.client(0)  # closed however the test ends: no session left to the GC
    try:
        await mesh.wait_converged(timeout_s=60)
        l4_node = mesh.agents[1].node_id
        await peer.cordon(l4_node)
        on_h100 = JobSpec(SLEEP, resources=Resources(1, archs=("hopper",)))
        on_l4 = JobSpec(SLEEP, resources=Resources(1, archs=("ada lovelace",)))
        running = str((await peer.submit(on_h100))["job_id"])
        waiting = str((await peer.submit(on_l4))["job_id"])
        await api_until(
            "the H100 job to run", peer.jobs, lambda js: _state(js, running) == "running", 60
        )
        # the L4 job's owner may be the other agent: listed here once its record has come
        await api_until(
            "the L4 job to be listed", peer.jobs, lambda js: _state(js, waiting) is not None, 30
        )
        jobs = {j["job_id"]: j for j in await peer.jobs()}
        assert jobs[waiting]["state"] in ("pending", "placing")
        h100_wait_s = jobs[running]["started_at"] - jobs[running]["submitted_at"]
        app = ShoalApp(api_source(mesh.agents[1].address, mesh.root / "cluster"), refresh_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, "two hosts", lambda: len(app.snapshot.hosts) == 2)
            await pilot.press("F", "1")
            screen = app.screen
            assert isinstance(screen, FleetScreen)

            def counted() -> bool:
                r = screen.report
                if r is None or r.span_s != 300:
                    return False
                h100 = [g.allocated for g in r.by_model if g.name == "NVIDIA H100 SXM"]
                whole_step = any(a == 0.5 for a in h100[0]) if h100 else False
                return whole_step and any(line.total_gpu_s > 0 for line in r.idle.lines)

            for _ in range(30):  # read again (1) until the history holds the wait's seconds
                await wait_for(pilot, "a report", lambda: screen.report is not None, 30)
                if counted():
                    break
                await pilot.press("1")
                await pilot.pause(1.0)
            assert counted()
            report = screen.report
            assert report is not None and report.missing == () and report.nodes_read == 2
            assert [g.name for g in report.by_vendor] == ["nvidia"]
            models = {g.name: g for g in report.by_model}
            assert set(models) == {"NVIDIA H100 SXM", "NVIDIA L4"}
            assert models["NVIDIA H100 SXM"].gpus_last == 2
            # one of two held since the job started (the step it started in, for its part),
            # and the L4 never
            h100 = [a for a in models["NVIDIA H100 SXM"].allocated if a is not None]
            assert max(h100) == 0.5 and h100[-1] > 0
            assert {a for a in models["NVIDIA L4"].allocated if a is not None} == {0.0}
            idle = {line.model: line.total_gpu_s for line in report.idle.lines}
            # the L4 stood free while a job that takes only an L4 waited (its node cordoned);
            # the H100s count only while the H100 job itself waited to start (both free then)
            assert idle["NVIDIA L4"] > 0 and idle["NVIDIA H100 SXM"] <= 2 * h100_wait_s
            text = str(screen.query_one("#fleet-chart").render())
            assert "GPU-hours idle while jobs waited" in text
        # shoal history --fleet reads and counts the same, through the other agent
        flags = ["--agent", mesh.agents[0].address, "--identity", str(mesh.root / "cluster")]
        done = shoal("history", "--fleet", "--since", "5m", "--json", *flags)
        assert done.returncode == 0, done.stderr
        cli = json.loads(done.stdout)
        assert cli["nodes_read"] == 2 and cli["missing"] == [] and cli["step_s"] == 2
        assert [g["name"] for g in cli["by_model"]] == ["NVIDIA H100 SXM", "NVIDIA L4"]
        by_model = {m["model"]: m["gpu_s"] for m in cli["idle_while_waiting"]["by_model"]}
        assert by_model["NVIDIA L4"] >= idle["NVIDIA L4"]
        assert by_model["NVIDIA H100 SXM"] <= 2 * h100_wait_s
        chart = shoal("history", "--fleet", "--since", "5m", *flags)
        assert chart.returncode == 0, chart.stderr
        assert "GPU utilization by model" in chart.stdout and "L4" in chart.stdout
        assert "--fleet reads every node" in one_line_error(
            shoal("history", "somenode", "--fleet", *flags)
        )
        assert "say whose history" in one_line_error(shoal("history", *flags))
    finally:
        await peer.close()
        mesh.stop()
