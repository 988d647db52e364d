"""The TUI driven by keys on a simulated mesh: what the operator does reaches the mesh."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console
from textual.widgets import Input, OptionList

from agent.content.workdir import DEFAULT_MAX_BYTES, pack_workdir
from tests.tui.helpers import command, filter_rows, settled, sim_app, started, wait_until
from tui.app import ShoalApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.describe import describe_job
from tui.screens.drain import DrainScreen
from tui.screens.logs import LogsScreen
from tui.screens.main import MainScreen
from tui.screens.migrate import MigrateScreen
from tui.screens.submit import SubmitScreen
from tui.widgets.header import MeshHeader
from tui.widgets.tables import MeshTable
from tui.widgets.topology import TopologyView


def main(app: ShoalApp) -> MainScreen:
    return app.main_screen()


def table(app: ShoalApp, name: str) -> MeshTable:
    widget = main(app).query_one(f"#{name}")
    assert isinstance(widget, MeshTable)
    return widget


async def test_header_shows_mesh_identity_and_connection() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        text = main(app).query_one(MeshHeader).render().plain
        assert "sim-mesh" in text
        assert source.identity.node_id[:10] in text
        assert "operator" in text and "connected" in text
        assert "10/12 hosts" in text
        live = sum(len(h.devices) for h in app.snapshot.hosts if h.state == "alive")
        assert live < sum(len(h.devices) for h in app.snapshot.hosts)
        assert f"  {live} GPUs" in text  # of the live hosts only: no frozen, departed GPUs


async def test_counts_of_one_are_singular_in_the_header_and_the_topology() -> None:
    """ "1 GPUs" was what a group of one single-GPU host said, and the header of such a mesh."""
    app, _ = sim_app(hosts=5)  # the fifth host is an Apple machine: one GPU
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        view = main(app).query_one(TopologyView)
        groups = [view.row(i) for i in range(view.line_count)]
        labels = [r.label for r in groups if r.kind == "group"]
        assert any(label.endswith(" · 1 host · 1 GPU") for label in labels), labels
        assert not [label for label in labels if " 1 GPUs" in label or " 1 hosts" in label]
        assert all(label.endswith(" GPUs") for label in labels if not label.endswith(" 1 GPU"))

        one = next(h for h in app.snapshot.hosts if len(h.devices) == 1)
        header = main(app).query_one(MeshHeader)
        header.update_snapshot(replace(app.snapshot, hosts=(one,), jobs=()))
        text = header.render().plain
        assert "  1/1 host  1 GPU  0 running" in text, text


async def test_drain_a_host_with_a_grace_period() -> None:
    app, source = sim_app()
    node = source.node_id_of("nv-h100-000")
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await command(pilot, "hosts")
        assert main(app).state.view == "hosts"
        await filter_rows(pilot, "nv-h100-000")
        await wait_until(pilot, lambda: table(app, "hosts").row_count == 1)
        serial = app.snapshot_serial
        await pilot.press("r")
        assert isinstance(app.screen, DrainScreen)
        grace = app.screen.query_one("#grace", Input)
        grace.value = "90s"
        await pilot.press("enter")
        await settled(pilot, app, serial)
        assert source.actions == [("drain", {"node": node, "grace_s": 90.0})]
        # A job runs there, so the host keeps draining until it ends or the grace runs out.
        assert source.drain_of(node) == "draining"
        cell = table(app, "hosts").get_cell(node, "drain")
        assert str(cell) == "draining"
        assert app.outcomes[-1].ok


async def test_cordon_and_undrain_from_the_topology() -> None:
    app, source = sim_app()
    node = source.node_id_of("amd-mi300x-001")
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("j")  # the first host under the first group
        serial = app.snapshot_serial
        await pilot.press("c")
        await settled(pilot, app, serial)
        assert source.actions[-1] == ("cordon", {"node": node})
        assert source.drain_of(node) == "cordoned"
        serial = app.snapshot_serial
        await pilot.press("u")
        await wait_until(pilot, lambda: len(source.actions) == 2 and not app.ops_in_flight)
        assert source.actions[-1] == ("undrain", {"node": node})
        assert source.drain_of(node) == "schedulable"


async def test_submit_through_the_form_shows_where_it_goes() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("n")
        assert isinstance(app.screen, SubmitScreen)
        form = app.screen
        form.query_one("#f-command", Input).value = "python train.py --epochs 3"
        form.query_one("#f-gpus", Input).value = "2"
        form.query_one("#f-memory", Input).value = "80GiB"
        form.query_one("#f-backends", Input).value = "cuda"
        await pilot.pause()
        preview = str(form.query_one("#preview").render())
        assert "Would go to nv-h100-008" in preview and "2 host(s) fit" in preview
        serial = app.snapshot_serial
        await pilot.press("ctrl+s")
        await settled(pilot, app, serial)
        kind, args = source.actions[-1]
        assert kind == "submit"
        assert args["spec"]["command"] == ["python", "train.py", "--epochs", "3"]
        assert args["spec"]["resources"]["gpus_per_node"] == 2
        assert args["spec"]["resources"]["min_mem_per_gpu_bytes"] == 80 * 1024**3
        job = app.snapshot.job(args["job_id"])
        assert job is not None and job.state == "running"
        assert app.snapshot.hostname(job.runner) == "nv-h100-008"
        await command(pilot, "jobs")
        assert table(app, "jobs").get_row_index(args["job_id"]) >= 0


async def test_submit_form_refuses_a_bad_size() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("n")
        form = app.screen
        form.query_one("#f-command", Input).value = "x"
        form.query_one("#f-memory", Input).value = "lots"
        await pilot.pause()
        assert "not a size" in str(form.query_one("#preview").render())
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SubmitScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)
        assert source.actions == []


async def test_submit_form_sends_a_working_folder_and_an_image(tmp_path: Path) -> None:
    """The form's Workdir is packed (``.gitignore`` honoured, as ``shoal submit --workdir``)
    and its digest signed into the spec; a path that is no folder is refused in the preview."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / ".gitignore").write_text("*.ckpt\n")
    (project / "big.ckpt").write_bytes(b"x" * 1000)
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("n")
        form = app.screen
        form.query_one("#f-command", Input).value = "python train.py"
        form.query_one("#f-workdir", Input).value = str(tmp_path / "nowhere")
        await pilot.pause()
        assert "is not a folder" in str(form.query_one("#preview").render())
        form.query_one("#f-workdir", Input).value = str(project)
        form.query_one("#f-image", Input).value = "127.0.0.1:5000/train:1"
        await pilot.pause()
        serial = app.snapshot_serial
        await pilot.press("ctrl+s")
        await settled(pilot, app, serial)
        kind, args = source.actions[-1]
        assert kind == "submit"
        packed = pack_workdir(project.resolve(), DEFAULT_MAX_BYTES)
        assert [f.path for f in packed.manifest.files] == [".gitignore", "train.py"]
        assert args["spec"]["workdir_digest"] == packed.manifest.digest
        assert args["spec"]["image"] == "127.0.0.1:5000/train:1"


async def _select_job(pilot, app: ShoalApp, hostname: str) -> str:  # type: ignore[no-untyped-def]
    await command(pilot, "jobs")
    await filter_rows(pilot, f"running.*{hostname}")
    await wait_until(pilot, lambda: table(app, "jobs").row_count == 1)
    selection = main(app).selection()
    assert selection is not None and selection.job_id is not None
    return selection.job_id


async def test_migrate_to_a_host_that_fits() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        job_id = await _select_job(pilot, app, "nv-4090-007")
        await pilot.press("m")
        assert isinstance(app.screen, MigrateScreen)
        hosts = [f.hostname for f in app.screen.fits]
        assert "nv-4090-007" not in hosts and len(hosts) > 1
        serial = app.snapshot_serial
        options = app.screen.query_one(OptionList)
        options.highlighted = 1  # the first real host, after "best host"
        await pilot.press("enter")
        await settled(pilot, app, serial)
        target = source.node_id_of(hosts[0])
        assert source.actions[-1] == ("migrate", {"job_id": job_id, "target": target})
        job = app.snapshot.job(job_id)
        assert job is not None and job.runner == target and job.attempt == 2


async def test_cancel_asks_first() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        job_id = await _select_job(pilot, app, "nv-a100-010")
        await pilot.press("ctrl+d")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(app.screen, MainScreen) and source.actions == []
        serial = app.snapshot_serial
        await pilot.press("ctrl+d", "y")
        await settled(pilot, app, serial)
        assert source.actions == [("cancel", {"job_id": job_id})]
        assert source.job_state(job_id) == "cancelled"
        # The filter asked for running jobs: the cancelled one leaves it; esc shows it again.
        await wait_until(pilot, lambda: table(app, "jobs").row_count == 0)
        await pilot.press("escape")
        assert str(table(app, "jobs").get_cell(job_id, "state")) == "cancelled"


async def test_filter_regex_inversion_and_esc() -> None:
    app, _ = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await command(pilot, "hosts")
        hosts = table(app, "hosts")
        assert hosts.row_count == 12
        await filter_rows(pilot, "^nv-")
        await wait_until(pilot, lambda: hosts.row_count == 6)
        await filter_rows(pilot, "!^nv-")
        await wait_until(pilot, lambda: hosts.row_count == 6)
        names = {str(hosts.get_row_at(i)[0]) for i in range(hosts.row_count)}
        assert not any(n.startswith("nv-") for n in names)
        await pilot.press("escape")
        await wait_until(pilot, lambda: hosts.row_count == 12)
        for _ in range(3):
            await pilot.press("escape")
        assert app.is_running


async def test_command_bar_views_and_unknown_command() -> None:
    app, _ = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        for view in ("gpus", "jobs", "events", "hosts", "topology"):
            await command(pilot, view)
            assert main(app).state.view == view
        await command(pilot, "bogus")
        await pilot.pause()
        assert any("unknown command" in n.message for n in app._notifications)
        await command(pilot, "q")
        await pilot.pause()
        assert not app.is_running


async def test_drill_host_to_gpus_to_jobs_and_back() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("j", "enter")  # amd-mi300x-001
        screen = main(app)
        assert screen.state.view == "gpus"
        assert screen.state.scope.node_id == source.node_id_of("amd-mi300x-001")
        assert table(app, "gpus").row_count == 8
        await pilot.press("enter")  # GPU 0 runs a job
        assert screen.state.view == "jobs" and table(app, "jobs").row_count == 1
        await pilot.press("escape", "escape")
        assert screen.state.view == "topology"


async def test_sort_keys_order_rows() -> None:
    app, _ = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await command(pilot, "gpus")
        gpus = table(app, "gpus")
        await pilot.press("U")
        utils = [int(str(gpus.get_row_at(i)[3]).rstrip("%")) for i in range(5)]
        assert utils == sorted(utils, reverse=True) and utils[0] >= 90
        await pilot.press("N")
        assert str(gpus.get_row_at(0)[0]) == "amd-mi300x-001"


async def test_logs_stream_for_the_selected_job() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        job_id = await _select_job(pilot, app, "nv-h100-000")
        await pilot.press("l")
        assert isinstance(app.screen, LogsScreen)
        logs = app.screen
        await wait_until(pilot, lambda: logs.lines_seen > 2)
        source.advance(60.0)
        before = logs.lines_seen
        await wait_until(pilot, lambda: logs.lines_seen >= before + 4)
        assert logs.job_id == job_id
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


async def test_readonly_hides_and_refuses_every_mutating_key() -> None:
    app, source = sim_app(readonly=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        for view in ("topology", "hosts", "jobs"):
            await command(pilot, view)
            shown = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}
            assert not shown & {"cordon", "drain", "undrain", "submit", "migrate", "cancel"}
            await pilot.press("c", "r", "u", "n", "m", "ctrl+d")
            assert isinstance(app.screen, MainScreen)
        assert source.actions == []
        assert "read-only" in main(app).query_one(MeshHeader).render().plain


async def test_keymap_rebinds_by_id() -> None:
    app, _source = sim_app(keymap={"host.drain": "D"})
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        await pilot.press("j", "r")
        assert isinstance(app.screen, MainScreen)
        await pilot.press("D")
        assert isinstance(app.screen, DrainScreen)


async def test_unreachable_agent_keeps_the_last_view() -> None:
    from agent.operator.client import AgentUnreachable
    from tui.simmesh import SimSource

    class Flaky(SimSource):
        fail = False

        async def nodes(self):  # type: ignore[no-untyped-def]
            if self.fail:
                raise AgentUnreachable("10.0.0.1:7946", "connection refused")
            return await super().nodes()

    source = Flaky(12, seed=0)
    app = ShoalApp(source, refresh_s=60.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        source.fail = True
        serial = app.snapshot_serial
        app.poke()
        await wait_until(pilot, lambda: app.snapshot_serial > serial)
        header = main(app).query_one(MeshHeader).render().plain
        assert "unreachable" in header and "connection refused" in header
        assert len(app.snapshot.hosts) == 12


async def test_a_big_mesh_makes_forecasts_only_while_the_jobs_view_shows() -> None:
    from tui.app import THREAD_PARSE_HOSTS
    from tui.model import NO_OUTLOOK

    app, _ = sim_app(hosts=THREAD_PARSE_HOSTS + 1)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        assert app.snapshot.outlook() is NO_OUTLOOK  # the topology shows no forecast
        await command(pilot, "jobs")  # the jobs view reads the mesh again at once, with them
        await wait_until(pilot, lambda: app.snapshot.outlook() is not NO_OUTLOOK, tries=1000)
        assert app.snapshot.outlook().forecasts
        running = next(j for j in app.snapshot.jobs if j.state == "running")
        assert table(app, "jobs").get_cell(running.job_id, "ends").startswith("~")
        await command(pilot, "hosts")
        serial = app.snapshot_serial
        app.poke()
        await wait_until(pilot, lambda: app.snapshot_serial > serial, tries=1000)
        assert app.snapshot.outlook() is NO_OUTLOOK


async def test_a_jobs_description_lists_the_hints_told_of_it() -> None:
    app, source = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot)
        job = next(j for j in app.snapshot.jobs if j.state == "running")
        told = "idle_allocated on gpu0: utilization under 5% for 300 s while a job holds it"
        source._event("hint", job.runner, job.job_id, told)
        source._event("hint", job.runner, "another-job", "power_capped on gpu1: at its limit")
        serial = app.snapshot_serial
        app.poke()
        await wait_until(pilot, lambda: app.snapshot_serial > serial)
        console = Console(record=True, width=200)
        console.print(describe_job(job, app.snapshot))
        text = console.export_text()
        assert "hints" in text and told in text and "power_capped" not in text
