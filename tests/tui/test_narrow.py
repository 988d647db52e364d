"""The TUI at 80x24: the submit form shows every field of the spec at once, the footer's hints
fit whole, and a gang job is one row whose detail lists its members."""

from __future__ import annotations

from typing import Any

from textual.widgets import Input, Select

from agent.job.jobspec import JobSpec
from agent.wire.documents import JobDoc
from agent.wire.records import GangMember, JobStatus
from tests.tui.helpers import (
    NARROW,
    command,
    open_submit_form,
    shown_lines,
    sim_app,
    started,
    visible_without_scrolling,
    wait_until,
)
from tui.app import ShoalApp
from tui.screens.describe import DescribeScreen
from tui.screens.logs import LogsScreen
from tui.screens.submit import SubmitScreen, spec_from_form
from tui.simmesh import SimSource
from tui.widgets.footer import KeyFooter
from tui.widgets.tables import MeshTable


async def test_every_field_of_the_form_is_visible_at_80x24_and_reaches_the_spec() -> None:
    app, source = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        form = await open_submit_form(pilot)
        for button in ("#yes", "#no", "#preview"):
            visible_without_scrolling(app, form.query_one(button))

        # Typed as an operator would, key by key.
        typed = {
            "command": "python train.py --epochs 3",
            "gpus": "1",
            "memory": "20GiB",
            "backends": "cuda",
            "nodes": "1",
            "priority": "7",
            "deadline": "6h",
            "max_runtime": "90m",
            "datasets": "imagenet, laion",
            "retries": "2",
            "affinity": "zone=us-east",
            "anti_affinity": "rack=r9",
            "labels": "team=ml on_late=refuse",
        }
        chosen = {"kind": "training", "signal": "SIGUSR1", "preemptible": "yes"}
        for key, text in typed.items():
            field = form.query_one(f"#f-{key}", Input)
            field.focus()
            await pilot.press("ctrl+u", *text)  # ctrl+u: clear what was there
            assert field.value == text
        for key, value in chosen.items():
            form.query_one(f"#f-{key}", Select).value = value
        await pilot.pause()
        assert form.spec is not None, str(form.query_one("#preview").render())
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: bool(source.actions))
        kind, args = source.actions[-1]
        assert kind == "submit"
        spec = JobSpec.from_dict(args["spec"])
        assert spec.command == ("python", "train.py", "--epochs", "3")
        assert spec.kind == "training" and spec.priority == 7 and spec.preemptible
        assert spec.resources.gpus_per_node == 1 and spec.resources.nodes == 1
        assert spec.resources.min_mem_per_gpu_bytes == 20 * 1024**3
        assert spec.resources.backends == ("cuda",)
        assert spec.deadline == source.now() + 6 * 3600
        assert spec.max_runtime_s == 90 * 60 and spec.retries == 2
        assert spec.datasets == ("imagenet", "laion")
        assert spec.affinity == {"zone": "us-east"} and spec.anti_affinity == {"rack": "r9"}
        assert spec.labels == {"team": "ml", "on_late": "refuse"}
        assert spec.checkpoint_signal == "SIGUSR1"


async def test_the_form_shows_the_spec_parsers_own_one_line_refusal() -> None:
    app, source = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        form = await open_submit_form(pilot)
        form.query_one("#f-command", Input).value = "python train.py"
        form.query_one("#f-gpus", Input).value = "0.5"
        await pilot.pause()
        # Whatever the spec parser makes of half a GPU, the form says the same.
        try:
            expected: str | None = None
            JobSpec.from_human(
                {"command": ["python", "train.py"], "resources": {"gpus_per_node": 0.5}}
            )
        except ValueError as exc:
            expected = str(exc)
        preview = str(form.query_one("#preview").render())
        if expected is None:
            assert form.spec is not None
        else:
            assert form.spec is None and expected in preview and "\n" not in expected
        for key, text, refusal in (
            ("gpus", "two", "GPUs per node: 'two' is not a number"),
            ("nodes", "0", "resources.nodes: must not be less than 1"),
            ("affinity", "zone", "affinity: 'zone' is not KEY=VALUE"),
            ("deadline", "soon", "deadline: not a duration"),
            ("memory", "lots", "not a size"),
        ):
            values = {**form.form_values(), "gpus": "1", key: text}
            for field, value in values.items():
                widget = form.query_one(f"#f-{field}")
                if isinstance(widget, Input):
                    widget.value = value
            await pilot.pause()
            assert form.spec is None
            assert refusal in str(form.query_one("#preview").render())
            form.query_one(f"#f-{key}", Input).value = "1" if key in ("gpus", "nodes") else ""
        form.query_one("#f-gpus", Input).value = "two"
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SubmitScreen)  # a refused form is not submitted
        await pilot.press("escape")
        assert source.actions == []


def test_an_empty_field_takes_the_specs_default() -> None:
    spec = spec_from_form({"command": "true"}, now=0.0)
    assert spec == JobSpec.from_human({"command": ["true"]})
    assert spec.resources.gpus_per_node == 0 and spec.checkpoint_signal == "SIGTERM"


async def test_the_footer_hints_fit_80_columns_whole_on_every_screen() -> None:
    app, _ = sim_app()
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        screens: list[str] = []
        for view in ("topology", "hosts", "gpus", "events", "jobs", "logs"):
            if view == "logs":
                await pilot.press("j", "l")  # the logs of the job under the cursor
                assert isinstance(app.screen, LogsScreen)
            else:
                await command(pilot, view)
            await pilot.pause()
            footer = app.screen.query_one(KeyFooter)
            line = footer.render()
            assert line.cell_len <= NARROW[0], (view, line.plain)
            shown = footer.shown()
            assert shown, view
            for hint in shown:  # each one whole, in order
                assert hint.text.strip() in line.plain, (view, hint, line.plain)
            everything, _ = footer.hints()
            assert {h.action for h in shown} >= ({"help"} & {h.action for h in everything})
            screens.append(view)
        assert len(screens) == 6
    wide, _ = sim_app()
    async with wide.run_test(size=(200, 40)) as pilot:
        await started(pilot)
        await command(pilot, "jobs")
        footer = wide.screen.query_one(KeyFooter)
        everything, palette = footer.hints()
        # Nothing is left out where there is room: only the width drops hints.
        assert [h for h in footer.shown() if h != palette] == everything


class GangMesh(SimSource):
    """The simulated mesh, with one gang job running on two hosts, as its owner documents it."""

    gang_id = "9a" * 16

    def jobs_now(self) -> list[dict[str, Any]]:
        nodes = {str(n["host"]["hostname"]): n for n in self.nodes_now()}
        first, second = nodes["nv-h100-008"], nodes["nv-a100-002"]
        keys = [[d["key"] for d in n["devices"][:2]] for n in (first, second)]
        spec = JobSpec.from_human(
            {"command": ["torchrun", "train.py"], "resources": {"gpus_per_node": 2, "nodes": 2}}
        )
        status = JobStatus(
            self.gang_id, "running", 1, first["node_id"], first["node_id"], tuple(keys[0]),
            submitted_at=self.now() - 60, started_at=self.now() - 30,
        )  # fmt: skip
        members = (
            GangMember(0, first["node_id"], tuple(keys[0])),
            GangMember(1, second["node_id"], tuple(keys[1])),
        )
        gang = JobDoc(status._replace(members=members), spec.to_dict()).to_wire()
        return [gang, *super().jobs_now()]


async def test_a_gang_is_one_row_and_its_detail_lists_every_member() -> None:
    source = GangMesh(12, seed=0)
    app = ShoalApp(source, refresh_s=60.0, quiet_gc=False)
    async with app.run_test(size=NARROW) as pilot:
        await started(pilot)
        await command(pilot, "jobs")
        jobs = app.main_screen().query_one("#jobs", MeshTable)
        gang = source.gang_id
        assert jobs.row_keys().count(gang) == 1
        # At 80 columns the host name is cut, never the count of the other members.
        assert jobs.get_cell(gang, "node") == "nv-h100-… +1"
        [line] = [ln for ln in shown_lines(jobs) if ln.lstrip().startswith(gang[:8])]
        assert "nv-h100-… +1" in line and "2x2" in line, line
        await pilot.resize_terminal(120, 30)  # and in full where there is room
        await pilot.pause()
        assert jobs.get_cell(gang, "node") == "nv-h100-008 +1"
        await pilot.resize_terminal(*NARROW)
        await pilot.pause()
        assert jobs.get_cell(gang, "gpus") == "2x2"
        job = app.snapshot.job(gang)
        assert job is not None and [m.rank for m in job.members] == [0, 1]
        # Both hosts' GPUs are held by it: the GPU view and the preview see them taken.
        second = source.node_id_of("nv-a100-002")
        assert [j.job_id for j in app.snapshot.jobs_on(second)] == [gang]
        assert len(app.snapshot.busy_devices()[second]) == 2
        jobs.select_key(gang)
        await pilot.press("d")
        assert isinstance(app.screen, DescribeScreen)
        await pilot.pause()
        lines = shown_lines(app.screen.query_one("#describe-body"))
        assert any("rank 0" in ln and "nv-h100-008" in ln and "GPUs 0, 1" in ln for ln in lines)
        assert any("rank 1" in ln and "nv-a100-002" in ln and "GPUs 0, 1" in ln for ln in lines)
        assert any("2 GPU(s) x 2 node(s)" in ln for ln in lines), lines
