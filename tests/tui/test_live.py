"""The TUI on a real mesh: three agent processes on loopback, driven through the keyboard.

Everything the operator does goes through the TUI; every outcome is checked through the agents'
own API (``ApiClient``), not through the TUI's screen.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from agent.content.workdir import PENDING_DIGEST
from agent.operator.client import ApiClient
from agent.sandbox.localmesh import LocalMesh
from tests.tui.helpers import api_until, command, filter_rows, wait_for
from tui.app import ShoalApp
from tui.cli import api_source
from tui.screens.confirm import ConfirmScreen
from tui.screens.drain import DrainScreen
from tui.screens.logs import LogsScreen
from tui.screens.main import MUTATING_ACTIONS, MainScreen
from tui.screens.submit import SubmitScreen
from tui.widgets.tables import MeshTable

pytestmark = pytest.mark.slow

STEPS = (
    "import time\nfor i in range(400):\n    print(f'step {i}', flush=True)\n    time.sleep(0.1)\n"
)
"""A job that prints a numbered line ten times a second for 40 s."""


def _by_name(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str((n.get("host") or {}).get("hostname")): n for n in nodes}


def _job(jobs: list[dict[str, Any]], job_id: str) -> dict[str, Any]:
    return next((j for j in jobs if j["job_id"] == job_id), {})


async def _jobs_where(
    peer: ApiClient, keep: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The jobs ``keep`` keeps, once this peer knows of at least one (jobs travel by gossip)."""
    jobs = await api_until(
        "the job to reach the peer", peer.jobs, lambda js: any(keep(j) for j in js)
    )
    return [j for j in jobs if keep(j)]


async def test_operator_drains_submits_follows_logs_and_cancels_on_real_agents(
    tmp_path: Path,
) -> None:
    # Jobs run as the agents' own user: they read a script in the test's folder, which a root
    # test run keeps to root (tests/agent/test_daemon_jobuser.py runs one as another user).
    mesh = LocalMesh(
        tmp_path, 3, profiles=("h100:2", "mi300x:2", "l4:1"), extra_args=("--job-user", "")
    )
    mesh.start()
    peers: list[ApiClient] = []
    try:
        await mesh.wait_converged(timeout_s=60)
        peers = [mesh.client(i) for i in range(3)]
        # The TUI talks to the MI300X agent; the host we drain is the H100 one.
        app = ShoalApp(api_source(mesh.agents[1].address, mesh.root / "cluster"), refresh_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, "three hosts", lambda: len(app.snapshot.hosts) == 3)
            screen = app.main_screen()
            hosts = screen.query_one("#hosts", MeshTable)

            # Drain h100-00 with the keyboard: hosts view, filter, r, grace period, enter.
            await command(pilot, "hosts")
            await filter_rows(pilot, "h100-00")
            await wait_for(pilot, "the filter", lambda: hosts.row_count == 1)
            await pilot.press("r")
            assert isinstance(app.screen, DrainScreen)
            await pilot.press("ctrl+u", *"30s", "enter")  # ctrl+u: clear the default grace
            h100 = mesh.agents[0].node_id
            # Every peer, not only the one we asked, stops treating it as schedulable.
            for peer in peers:
                nodes = await api_until(
                    "the drain to reach every peer",
                    peer.nodes,
                    lambda ns: _by_name(ns)["h100-00"]["drain"] in ("draining", "drained"),
                )
                assert _by_name(nodes)["h100-00"]["node_id"] == h100
            await wait_for(
                pilot,
                "the table to show it",
                lambda: hosts.get_cell(h100, "drain") != "schedulable",
            )
            await pilot.press("escape")  # clear the filter

            # A job that only the H100 host could take (two CUDA GPUs) now waits.
            await pilot.press("n")
            assert isinstance(app.screen, SubmitScreen)
            form = app.screen
            form.query_one("#f-command", Input).value = "sleep 1"
            form.query_one("#f-gpus", Input).focus()
            await pilot.press("ctrl+u", "2")
            form.query_one("#f-backends", Input).focus()
            await pilot.press(*"cuda")
            await pilot.pause()
            assert "no host fits" in str(form.query_one("#preview").render()).lower()
            await pilot.press("ctrl+s")
            await wait_for(pilot, "the submit to finish", lambda: len(app.outcomes) == 2)
            assert app.outcomes[-1].ok, app.outcomes[-1].detail
            [waiting] = await _jobs_where(
                peers[2], lambda j: j["spec"]["resources"]["gpus_per_node"] == 2
            )
            waiting_job = await api_until(
                "a pending reason",
                peers[0].jobs,
                lambda js: bool(_job(js, waiting["job_id"]).get("reason")),
            )
            assert _job(waiting_job, waiting["job_id"])["state"] == "pending"
            assert _job(waiting_job, waiting["job_id"])["runner"] in (None, "")

            # A job for one CUDA GPU runs on the L4 host, the only schedulable CUDA one, from
            # the operator's working folder (packed, sent up and staged on the runner).
            project = tmp_path / "proj"
            project.mkdir()
            (project / "steps.py").write_text(STEPS, encoding="utf-8")
            await pilot.press("n")
            form = app.screen
            assert isinstance(form, SubmitScreen)
            form.query_one("#f-command", Input).value = f"{sys.executable} steps.py"
            form.query_one("#f-workdir", Input).value = str(project)
            form.query_one("#f-gpus", Input).focus()
            await pilot.press("ctrl+u", "1")
            form.query_one("#f-backends", Input).focus()
            await pilot.press(*"cuda")
            await pilot.pause()
            assert "Would go to l4-02" in str(form.query_one("#preview").render())
            await pilot.press("ctrl+s")
            await wait_for(pilot, "the second submit", lambda: len(app.outcomes) == 3)
            assert app.outcomes[-1].ok, app.outcomes[-1].detail
            [steps] = await _jobs_where(peers[0], lambda j: "steps.py" in j["spec"]["command"])
            assert steps["spec"]["workdir_digest"] not in (None, PENDING_DIGEST)
            job_id = steps["job_id"]
            running = await api_until(
                "the job to run",
                peers[1].jobs,
                lambda js: _job(js, job_id).get("state") == "running",
            )
            assert _job(running, job_id)["runner"] == mesh.agents[2].node_id  # l4-02

            # Its logs stream in the logs screen.
            await command(pilot, "jobs")
            jobs_table = screen.query_one("#jobs", MeshTable)
            await wait_for(pilot, "the job in the table", lambda: job_id in jobs_table.row_keys())
            await filter_rows(pilot, job_id[:12])
            await wait_for(pilot, "the filter", lambda: jobs_table.row_keys() == [job_id])
            await pilot.press("l")
            assert isinstance(app.screen, LogsScreen)
            logs = app.screen
            await wait_for(pilot, "log lines", lambda: logs.lines_seen >= 3)
            seen = logs.lines_seen
            await wait_for(pilot, "more log lines, streamed", lambda: logs.lines_seen >= seen + 5)
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)

            # Cancel asks first; "n" leaves it running, ctrl+d then "y" cancels it.
            await pilot.press("ctrl+d")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")
            assert _job(await peers[2].jobs(), job_id)["state"] == "running"
            await pilot.press("ctrl+d", "y")
            await api_until(
                "the job cancelled",
                peers[2].jobs,
                lambda js: _job(js, job_id).get("state") == "cancelled",
            )

        # --readonly: no mutating key is offered, and pressing them changes nothing.
        source = api_source(mesh.agents[0].address, mesh.root / "cluster")
        app = ShoalApp(source, refresh_s=0.5, readonly=True)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, "three hosts", lambda: len(app.snapshot.hosts) == 3)
            for view in ("topology", "hosts", "jobs"):
                await command(pilot, view)
                actions = {b.binding.action for b in app.screen.active_bindings.values()}
                assert not actions & MUTATING_ACTIONS
                await pilot.press("j", "c", "r", "u", "n", "m", "ctrl+d")
                assert isinstance(app.screen, MainScreen)
            assert not app.outcomes
        by_name = _by_name(await peers[1].nodes())
        assert {n: by_name[n]["drain"] for n in ("mi300x-01", "l4-02")} == {
            "mi300x-01": "schedulable",
            "l4-02": "schedulable",
        }
    finally:
        for peer in peers:
            await peer.close()
        mesh.stop()
