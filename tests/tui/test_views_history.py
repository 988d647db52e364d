"""The history panel on a simulated mesh: ``h`` on a GPU, a host or a job asks that node for
that subject's series; ``1``-``4`` switch the window."""

from __future__ import annotations

from tests.tui.helpers import NARROW, command, sim_app, started, wait_until
from tui.app import ShoalApp
from tui.history import SERIES
from tui.screens.history import HistoryScreen


def panel(app: ShoalApp) -> HistoryScreen:
    screen = app.screen
    assert isinstance(screen, HistoryScreen)
    return screen


async def test_h_on_a_gpu_charts_its_series_and_the_keys_switch_windows() -> None:
    app, _ = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await command(pilot, "gpus")
        selected = app.main_screen().selection()
        assert selected is not None and selected.device_key is not None
        await pilot.press("h")
        await wait_until(pilot, lambda: panel(app).doc is not None)
        doc = panel(app).doc
        assert doc is not None and doc.node == selected.node_id
        assert {s.name for s in doc.series} == set(SERIES["gpu"])
        assert {s.subject for s in doc.series} == {selected.device_key}
        assert doc.to_s - doc.from_s >= 3600 and doc.series[0].step_s == 6  # 1 h, 600 steps
        await pilot.press("4")
        await wait_until(pilot, lambda: (d := panel(app).doc) is not None and d.from_s < doc.from_s)
        week = panel(app).doc
        assert week is not None and week.series[0].step_s == 7 * 86400 // 600
        text = str(panel(app).query_one("#history-chart").render())
        assert "gpu.util_pct" in text and "every 1008s" in text
        await pilot.press("escape")
        assert app.screen is app.main_screen()


async def test_h_on_a_job_asks_its_runner_for_the_jobs_series() -> None:
    app, _ = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await command(pilot, "jobs")
        job = next(j for j in app.snapshot.jobs if j.state == "running")
        await command(pilot, job.job_id[:12], key="slash")
        await pilot.press("h")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await wait_until(pilot, lambda: panel(app).doc is not None)
        doc = panel(app).doc
        assert doc is not None and doc.node == job.runner
        assert {s.name for s in doc.series} == set(SERIES["job"])
        assert {s.subject for s in doc.series} == {job.job_id}
