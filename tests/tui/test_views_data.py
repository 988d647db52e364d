"""The datasets view on a simulated mesh: the mesh's dataset versions and where each copy is."""

from __future__ import annotations

from tests.tui.helpers import NARROW, command, filter_rows, sim_app, started
from tui.app import ShoalApp
from tui.widgets.dataviews import DatasetRow, DatasetsTable


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
