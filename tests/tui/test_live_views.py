"""The datasets and usage views on a real mesh: two agent processes on loopback; what the views
show is checked against the agents' own answers."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli.usage_cmd import gather_usage
from agent.job.jobspec import JobSpec
from agent.operator.usage import dedupe
from agent.sandbox.localmesh import LocalMesh
from tests.tui.helpers import api_until, command, filter_rows, wait_for
from tui.app import ShoalApp
from tui.cli import api_source
from tui.screens.history import HistoryScreen
from tui.widgets.dataviews import DatasetsTable, UsageTable

pytestmark = pytest.mark.slow


def _state(jobs: list[dict[str, Any]], job_id: str) -> str | None:
    return next((j["state"] for j in jobs if j["job_id"] == job_id), None)


async def test_datasets_and_usage_views_show_what_the_agents_hold_and_count(
    tmp_path: Path,
) -> None:
    mesh = LocalMesh(tmp_path, 2, profiles=("h100:1", "l4:1"), extra_args=("--job-user", ""))
    mesh.start()
    peer = mesh.client(0)  # closed however the test ends: no session left to the GC
    try:
        await mesh.wait_converged(timeout_s=60)
        src = tmp_path / "corpus"
        src.mkdir()
        (src / "a.bin").write_bytes(os.urandom(200_000))
        added = await peer.command("data_add", {"name": "corpus", "path": str(src)})
        submitted = await peer.submit(JobSpec(command=(sys.executable, "-c", "pass")))
        job_id = str(submitted["job_id"])
        await api_until(
            "the job to succeed",
            peer.jobs,
            lambda js: _state(js, job_id) == "succeeded",
            timeout_s=60,
        )
        app = ShoalApp(api_source(mesh.agents[1].address, mesh.root / "cluster"), refresh_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, "two hosts", lambda: len(app.snapshot.hosts) == 2)
            screen = app.main_screen()
            await pilot.press("D")
            datasets = screen.query_one("#datasets", DatasetsTable)

            def corpus() -> list[Any]:
                return [r for r in datasets._items if r.name == "corpus"]

            await wait_for(pilot, "the dataset, by gossip", lambda: bool(corpus()), 30)
            (row,) = corpus()
            assert row.digest == added["digest"] and row.size_bytes == added["total_bytes"]
            assert row.whole == 1 and row.held[0]["node"] == added["node"]

            await pilot.press("H")
            usage = screen.query_one("#usage", UsageTable)
            await wait_for(pilot, "the usage", lambda: usage.report is not None, 30)
            report = usage.report
            assert report is not None and report.missing == ()
            rows, missing = await gather_usage(peer, peer.identity, report.since_s)
            assert missing == [] and any(r.job_id == job_id for r in rows)
            assert report.total.attempts == len(dedupe(rows))
            assert report.total.gpu_s == pytest.approx(sum(r.gpu_s(report.until_s) for r in rows))

            # h on a GPU of the other node: its agent answers from its own store
            await command(pilot, "gpus")
            await filter_rows(pilot, "h100")
            selected = screen.selection()
            assert selected is not None and selected.node_id == mesh.agents[0].node_id
            await pilot.press("h")
            await wait_for(
                pilot, "the history panel", lambda: isinstance(app.screen, HistoryScreen)
            )
            history = app.screen
            assert isinstance(history, HistoryScreen)
            await wait_for(pilot, "the history", lambda: history.doc is not None, 30)
            doc = history.doc
            assert doc is not None and doc.node == selected.node_id
            assert "gpu.util_pct" in {s.name for s in doc.series}
            assert {s.subject for s in doc.series} == {selected.device_key}
    finally:
        await peer.close()
        mesh.stop()
