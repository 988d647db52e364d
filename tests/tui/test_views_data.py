"""The datasets and usage views on a simulated mesh: the mesh's dataset versions and where
each copy is; GPU-hours and energy as ``shoal usage`` adds them up."""

from __future__ import annotations

from agent.operator.usage import DAY_S, totals
from tests.tui.helpers import NARROW, command, filter_rows, sim_app, started, wait_until
from tui.app import ShoalApp
from tui.widgets.dataviews import DatasetRow, DatasetsTable, UsageTable


def datasets(app: ShoalApp) -> DatasetsTable:
    return app.main_screen().query_one("#datasets", DatasetsTable)


def line(table: DatasetsTable, y: int) -> str:
    return "".join(segment.text for segment in table.render_line(y))


async def test_d_shows_every_version_and_its_copies() -> None:
    app, source = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await pilot.press("D")
        await pilot.pause()
        assert app.main_screen().state.view == "datasets"
        rows: list[DatasetRow] = datasets(app)._items
        # as the mesh's nodes report them: two versions of imagenet, one with a copy staging
        nodes = source.nodes_now()
        held = {
            (v["name"], v["digest"], n["node_id"])
            for n in nodes
            for v in n.get("dataset_versions", ())
        }
        assert {(r.name, r.digest, c["node"]) for r in rows for c in r.held} == held
        assert [r.name for r in rows].count("imagenet") == 2
        laion = next(r for r in rows if r.name == "laion-aesth")
        assert laion.whole == 0 and len(laion.held) == 1
        text = "\n".join(line(datasets(app), y) for y in range(1, 1 + len(rows)))
        assert "0/1" in text and "70%" in text
        assert all(len(line(datasets(app), y)) <= 80 for y in range(len(rows) + 1))


async def test_filter_and_command_bar_reach_the_datasets() -> None:
    app, _ = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await command(pilot, "data")
        assert app.main_screen().state.view == "datasets"
        await filter_rows(pilot, "imagenet")
        await pilot.pause()
        assert {r.name for r in datasets(app)._items} == {"imagenet"}
        await pilot.press("d")  # describe: the version and its copies
        await pilot.pause()
        assert app.screen is not app.main_screen()


def usage(app: ShoalApp) -> UsageTable:
    return app.main_screen().query_one("#usage", UsageTable)


async def test_h_shows_usage_as_shoal_usage_adds_it_up_and_b_w_switch() -> None:
    app, source = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await pilot.press("H")
        table = usage(app)
        await wait_until(pilot, lambda: table.report is not None)
        report = table.report
        assert report is not None and (report.by, report.window) == ("team", "7d")
        now = source.now()
        rows, _ = await source.usage(now - 7 * DAY_S)
        expected: dict[str, float] = {}
        for t in totals(rows, "team", now - 7 * DAY_S, now):
            expected[t.key] = expected.get(t.key, 0.0) + t.gpu_s
        assert {t.key: round(t.gpu_s) for t in report.totals} == {
            k: round(v) for k, v in expected.items()
        }
        assert [t.gpu_s for t in report.totals] == sorted(expected.values(), reverse=True)
        assert report.total.gpu_s == sum(expected.values())
        shown = "\n".join(line(table, y) for y in range(len(report.totals) + 2))
        assert "total" in shown and all(len(x) <= 80 for x in shown.splitlines())
        await pilot.press("b")
        await wait_until(pilot, lambda: table.report is not None and table.report.by == "user")
        assert {t.key for t in table.report.totals} <= {"alice", "bob", "carol", "dmitri", "erin"}
        week = table.report.total.gpu_s
        await pilot.press("w")  # 30 days
        await wait_until(pilot, lambda: table.report is not None and table.report.window == "30d")
        await pilot.press("w")  # back round to 24 hours: less than the week
        await wait_until(pilot, lambda: table.report is not None and table.report.window == "24h")
        assert 0 < table.report.total.gpu_s < week
