"""The TUI at 80x24 on a real mesh: two agent processes on loopback, each with one GPU.

Two jobs hold both GPUs; a third, submitted from the form with every field filled in, reaches
the agents as typed and waits: the jobs table and the job's detail show why, and when the
policy expects it to start and end. Outcomes are checked through the agents' own API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Select

from agent.job.jobspec import JobSpec, Resources
from agent.operator.client import ApiClient
from agent.sandbox.localmesh import LocalMesh
from tests.tui.helpers import (
    NARROW,
    api_until,
    command,
    filter_rows,
    open_submit_form,
    shown_lines,
    wait_for,
)
from tui.app import ShoalApp
from tui.cli import api_source
from tui.screens.describe import DescribeScreen
from tui.widgets.tables import MeshTable

pytestmark = pytest.mark.slow


def _job(jobs: list[dict[str, Any]], job_id: str) -> dict[str, Any]:
    return next((j for j in jobs if j["job_id"] == job_id), {})


async def test_a_job_submitted_from_the_narrow_form_waits_and_says_why_and_when(
    tmp_path: Path,
) -> None:
    mesh = LocalMesh(tmp_path, 2, profiles=("l4:1", "l4:1"), extra_args=("--job-user", ""))
    mesh.start()
    client: ApiClient | None = None
    try:
        await mesh.wait_converged(timeout_s=60)
        client = mesh.client(0)
        busy = JobSpec(command=("sleep", "600"), resources=Resources(gpus_per_node=1))
        for _ in range(2):
            await client.submit(busy)
        await api_until(
            "both GPUs taken",
            client.jobs,
            lambda js: sum(j["state"] == "running" for j in js) == 2,
            timeout_s=60,
        )
        app = ShoalApp(api_source(mesh.agents[1].address, mesh.root / "cluster"), refresh_s=0.5)
        async with app.run_test(size=NARROW) as pilot:
            await wait_for(pilot, "two running jobs", lambda: len(app.snapshot.jobs) == 2)
            form = await open_submit_form(pilot)
            typed = {
                "command": "sleep 5",
                "gpus": "1",
                "backends": "cuda",
                "priority": "3",
                "max_runtime": "10m",
                "datasets": "imagenet",
                "retries": "1",
                "anti_affinity": "zone=nowhere",
                "labels": "team=ml",
            }
            for key, text in typed.items():
                form.query_one(f"#f-{key}", Input).focus()
                await pilot.press("ctrl+u", *text)
            form.query_one("#f-kind", Select).value = "training"
            form.query_one("#f-signal", Select).value = "SIGUSR1"
            form.query_one("#f-preemptible", Select).value = "yes"
            await pilot.pause()
            assert "no host fits" in str(form.query_one("#preview").render()).lower()
            await pilot.press("ctrl+s")
            await wait_for(pilot, "the submit to finish", lambda: len(app.outcomes) == 1)
            assert app.outcomes[-1].ok, app.outcomes[-1].detail

            # The agents hold the spec as typed, and the job waits with a reason.
            jobs = await api_until(
                "the new job with its reason",
                client.jobs,
                lambda js: any(
                    j["spec"]["command"] == ["sleep", "5"] and j.get("reason") for j in js
                ),
                timeout_s=60,
            )
            [doc] = [j for j in jobs if j["spec"]["command"] == ["sleep", "5"]]
            spec = JobSpec.from_dict(doc["spec"])
            assert doc["state"] == "pending"
            assert (spec.kind, spec.priority, spec.preemptible, spec.retries) == (
                "training",
                3,
                True,
                1,
            )
            assert spec.resources.backends == ("cuda",) and spec.max_runtime_s == 600
            assert spec.datasets == ("imagenet",) and spec.labels == {"team": "ml"}
            assert spec.anti_affinity == {"zone": "nowhere"}
            assert spec.checkpoint_signal == "SIGUSR1"
            job_id = doc["job_id"]

            # The jobs table says why it waits and when it should start and end.
            await command(pilot, "jobs")
            table = app.main_screen().query_one("#jobs", MeshTable)
            await filter_rows(pilot, job_id[:12])
            await wait_for(pilot, "its row", lambda: table.row_keys() == [job_id])
            # The TUI reads another agent than the one asked above: the reason travels by gossip.
            await wait_for(
                pilot,
                "the reason in the TUI",
                lambda: bool(getattr(app.snapshot.job(job_id), "reason", None)),
            )
            job = app.snapshot.job(job_id)
            assert job is not None and job.reason
            why = app.snapshot.why_waiting(job)
            assert why == job.reason and table.get_cell(job_id, "why") == why
            assert table.get_cell(job_id, "starts").startswith("~")
            assert table.get_cell(job_id, "ends").startswith("~")
            times = app.snapshot.times(job)
            assert times.starts_in_s is not None and times.ends_in_s is not None
            assert 0 < times.starts_in_s < times.ends_in_s
            for other in app.snapshot.jobs:
                if other.state == "running":
                    assert app.snapshot.times(other).ends_in_s is not None

            await pilot.press("d")
            assert isinstance(app.screen, DescribeScreen)
            await pilot.pause()
            lines = shown_lines(app.screen.query_one("#describe-body"))
            assert any(ln.startswith("why pending") and why[:30] in ln for ln in lines), lines
            assert any(ln.startswith("predicted start") and "(p50)" in ln for ln in lines)
            assert any(ln.startswith("predicted end") and "(p50)" in ln for ln in lines)
    finally:
        if client is not None:
            await client.close()
        mesh.stop()
