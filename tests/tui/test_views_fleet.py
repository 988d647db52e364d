"""The fleet view on a simulated mesh: ``F`` (or ``:fleet``) reads every node's history, a few
nodes at a time, and charts utilization by vendor and by model and the GPU-hours left idle while
jobs waited; ``1``-``4`` switch the window; a node that does not answer is shown as missing and
never holds the view or the app."""

from __future__ import annotations

import asyncio

import pytest

from agent.cli.fleet_view import fleet_lines
from agent.operator.fleet_read import IN_FLIGHT, read_fleet
from agent.wire.history import HistoryDoc, HistoryQuery
from agent.wire.usage import UsageRow
from tests.tui.helpers import NARROW, command, sim_app, started, wait_until
from tui.app import ShoalApp
from tui.screens.fleet import FleetScreen
from tui.simmesh import SimSource


def panel(app: ShoalApp) -> FleetScreen:
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    return screen


async def test_f_charts_the_fleet_by_vendor_and_model_and_the_keys_switch_windows() -> None:
    app, _ = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("F")
        await wait_until(pilot, lambda: panel(app).report is not None)
        hour = panel(app).report
        assert hour is not None and hour.span_s == 3600 and hour.grid.step_s == 30
        assert {g.name for g in hour.by_vendor} == {"nvidia", "amd", "intel", "apple"}
        assert hour.missing == ("xe-a770-011: dead",)  # the dead host: not asked, not counted
        # what the view says is held now is what the mesh's jobs hold
        running = [j for j in app.snapshot.jobs if j.state == "running"]
        h100 = [h for h in app.snapshot.hosts if h.hostname.startswith("nv-h100")]
        held = sum(len(j.devices) for j in running if j.runner in {h.node_id for h in h100})
        (line,) = [g for g in hour.by_model if g.name == "NVIDIA H100 SXM"]
        assert line.gpus_last == 16 and line.allocated[-1] == pytest.approx(held / 16)
        assert hour.idle.total_gpu_s > 0 and hour.idle.waits >= 1
        text = str(panel(app).query_one("#fleet-chart").render())
        assert "GPU utilization by vendor" in text and "GPU-hours idle while jobs waited" in text
        assert "not counted: xe-a770-011: dead" in text
        await pilot.press("4")
        await wait_until(pilot, lambda: (r := panel(app).report) is not None and r.span_s > 3600)
        week = panel(app).report
        assert week is not None and week.grid.step_s == 7 * 86400 // 120
        await pilot.press("escape")
        assert app.screen is app.main_screen()
        await command(pilot, "fleet")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        await pilot.press("escape")
        await pilot.press("ctrl+p", *"fleet hist")  # the palette offers it too
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen))


class Hanging(SimSource):
    """A simulated mesh where one node never answers its history, and the rest are counted
    as they are asked (the most asked at once is kept)."""

    def __init__(self) -> None:
        super().__init__(12, seed=0)
        self.silent = self.nodes_now()[1]["node_id"]
        self.asking = 0
        self.most = 0

    async def history(self, query: HistoryQuery, address: str) -> HistoryDoc:
        self.asking += 1
        self.most = max(self.most, self.asking)
        try:
            if query.node == self.silent:
                await asyncio.Event().wait()
            await asyncio.sleep(0.01)
            return await super().history(query, address)
        finally:
            self.asking -= 1


async def test_a_node_that_does_not_answer_is_missing_and_the_rest_are_read_a_few_at_a_time() -> (
    None
):
    source = Hanging()
    report = await read_fleet(source, 3600, timeout_s=0.5)
    assert source.most == IN_FLIGHT
    assert "amd-mi300x-001: no answer in 0.5 s" in report.missing
    assert report.nodes_read == 10  # twelve, less the dead one and the silent one
    (amd,) = [g for g in report.by_model if g.name == "AMD Instinct MI300X"]
    assert amd.gpus_last == 8  # the other MI300X host's eight only


async def test_the_view_stays_usable_while_a_node_keeps_it_waiting() -> None:
    source = Hanging()
    app = ShoalApp(source, refresh_s=60.0, quiet_gc=False)
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await pilot.press("F")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        assert panel(app).report is None
        await pilot.press("escape")
        assert app.screen is app.main_screen()
        await command(pilot, "jobs")
        assert app.main_screen().state.view == "jobs"


class NoUsage(SimSource):
    async def usage(self, since: float) -> tuple[list[UsageRow], list[str]]:
        raise OSError("connection refused")


async def test_usage_rows_that_cannot_be_read_are_said_and_nothing_counts_as_held() -> None:
    report = await read_fleet(NoUsage(12, seed=0), 3600)
    assert report.missing == ("xe-a770-011: dead", "usage rows: connection refused")
    assert {a for g in report.by_vendor for a in g.allocated} <= {0.0, None}


@pytest.mark.parametrize("ascii_only", [False, True])
async def test_the_fleet_text_fits_80_columns_and_ascii_when_asked(ascii_only: bool) -> None:
    report = await read_fleet(SimSource(12, seed=0), 86400)
    lines = fleet_lines(report, 80, ascii_only=ascii_only)
    assert max(len(line) for line in lines) <= 80
    assert any("Radeon RX 7900" in line for line in lines)  # a cut name keeps its start
    if ascii_only:
        assert all(ch.isascii() for line in lines for ch in line)


async def test_at_80x24_the_view_scrolls_to_the_idle_figure() -> None:
    app, _ = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await pilot.press("F")
        await wait_until(pilot, lambda: panel(app).report is not None)
        body = panel(app).query_one("#fleet-body")
        assert app.focused is body and body.scroll_y == 0
        await pilot.press("end")
        await wait_until(pilot, lambda: body.scroll_y == body.max_scroll_y > 0)
