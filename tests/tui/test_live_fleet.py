"""The fleet view on a real mesh: two agent processes on loopback, one job holding one of the
two H100s, and one job that waits for the L4 on a cordoned node while that L4 stands free: the
view reads both nodes' own history and shows the H100 half allocated and the L4's idle time
while the job waited."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.sandbox.localmesh import LocalMesh
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
    try:
        await mesh.wait_converged(timeout_s=60)
        peer = mesh.client(0)
        l4_node = mesh.agents[1].node_id
        await peer.cordon(l4_node)
        on_h100 = JobSpec(SLEEP, resources=Resources(1, archs=("hopper",)))
        on_l4 = JobSpec(SLEEP, resources=Resources(1, archs=("ada lovelace",)))
        running = str((await peer.submit(on_h100))["job_id"])
        waiting = str((await peer.submit(on_l4))["job_id"])
        await api_until(
            "the H100 job to run", peer.jobs, lambda js: _state(js, running) == "running", 60
        )
        assert _state(await peer.jobs(), waiting) == "pending"
        app = ShoalApp(api_source(mesh.agents[1].address, mesh.root / "cluster"), refresh_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, "two hosts", lambda: len(app.snapshot.hosts) == 2)
            await pilot.press("F", "1")
            screen = app.screen
            assert isinstance(screen, FleetScreen)

            def counted() -> bool:
                r = screen.report
                return (
                    r is not None
                    and r.span_s == 300
                    and any(line.total_gpu_s > 0 for line in r.idle.lines)
                )

            await wait_for(pilot, "the idle L4 counted", counted, 30)
            report = screen.report
            assert report is not None and report.missing == () and report.nodes_read == 2
            assert [g.name for g in report.by_vendor] == ["nvidia"]
            models = {g.name: g for g in report.by_model}
            assert set(models) == {"NVIDIA H100 SXM", "NVIDIA L4"}
            assert models["NVIDIA H100 SXM"].gpus_last == 2
            # the last step that reported (the step under way may have no sample yet)
            h100 = [a for a in models["NVIDIA H100 SXM"].allocated if a is not None]
            l4 = [a for a in models["NVIDIA L4"].allocated if a is not None]
            assert h100[-1] == pytest.approx(0.5) and l4[-1] == 0.0
            idle = {line.model: line.total_gpu_s for line in report.idle.lines}
            # the L4 stood free while a job that takes only an L4 waited (its node cordoned);
            # the free H100 is no GPU that job could use
            assert idle["NVIDIA L4"] > 0 and idle["NVIDIA H100 SXM"] == 0
            text = str(screen.query_one("#fleet-chart").render())
            assert "GPU-hours idle while jobs waited" in text
        await peer.close()
    finally:
        mesh.stop()
