"""``python -m tools.screenshots OUTDIR [--live]``: every screen of the real app, as SVG files.

Runs the app headless on a deterministic simulated mesh (or, with ``--live``, on a real
:class:`agent.sandbox.localmesh.LocalMesh` of agent processes with a few real jobs submitted through
the API and running, one of them waiting for GPUs no host has) and saves one screenshot per screen:
the five views, a drill-down, the filter, help, describe, raw JSON, logs, the drain, submit,
migrate and cancel dialogs, the history panel and the fleet view, at 160x48 (``--size`` to
change it). The live screenshots are named ``live-NN-name.svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot

from agent.job.jobspec import JobSpec
from agent.operator.client import ApiClient
from tui.app import ShoalApp
from tui.screens.fleet import FleetScreen
from tui.simmesh import SimSource
from tui.source import MeshSource
from tui.widgets.dataviews import UsageTable

Step = Callable[[Pilot[None]], Awaitable[None]]


async def _wait(pilot: Pilot[None], app: ShoalApp, serial: int = 1) -> None:
    for _ in range(600):
        await pilot.pause()
        if app.snapshot_serial >= serial:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the app never showed the mesh")


async def _until(
    pilot: Pilot[None], condition: Callable[[], bool], timeout_s: float = 30.0
) -> None:
    """Let the app run until ``condition()`` holds (at most ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.05)


async def shoot(
    source: MeshSource,
    outdir: Path,
    size: tuple[int, int],
    *,
    prefix: str = "",
    hide: str = "^nv-",
    pick: str = "running",
    refresh_s: float = 3600.0,
    identity_dir: Path | None = None,
    fleet_window: tuple[str, str] = ("4", "fleet-week"),
) -> list[Path]:
    """Drive the app through every screen, saving ``NN-name.svg`` files; their paths.

    ``hide``: the hosts the inverted-filter screenshot leaves out (a regex); ``pick``: the
    filter that selects the job the migrate, cancel and logs screenshots are about.
    ``identity_dir``: a cluster folder with its CA, for the add-host form. Then the fleet
    view over an hour and over ``fleet_window`` (its key, the screenshot's name).
    """
    outdir.mkdir(parents=True, exist_ok=True)
    app = ShoalApp(source, refresh_s=refresh_s, identity_dir=identity_dir)
    saved: list[Path] = []

    async def snap(pilot: Pilot[None], name: str) -> None:
        await pilot.pause()
        path = outdir / f"{prefix}{len(saved) + 1:02d}-{name}.svg"
        app.save_screenshot(filename=path.name, path=str(outdir))
        saved.append(path)

    async with app.run_test(size=size) as pilot:
        await _wait(pilot, app)
        await snap(pilot, "topology")
        await pilot.press("z", "z")
        await snap(pilot, "topology-by-zone")
        await pilot.press("z")
        for view in ("hosts", "gpus", "jobs", "events"):
            await pilot.press("colon", *view, "enter")
            await snap(pilot, view)
        await pilot.press("colon", *"hosts", "enter", "enter")
        await snap(pilot, "drill-host-gpus")
        await pilot.press("escape", "slash", *f"!{hide}", "enter")
        await snap(pilot, "filter-inverted")
        await pilot.press("escape", "d")
        await snap(pilot, "describe-host")
        await pilot.press("escape", "y")
        await snap(pilot, "json-host")
        await pilot.press("escape", "r")
        await snap(pilot, "drain-dialog")
        await pilot.press("escape", "n", *"python train.py", "tab", "2")
        await snap(pilot, "submit-form")
        await pilot.press("escape", "colon", *"jobs", "enter", "slash", *pick, "enter")
        await pilot.press("m")
        await snap(pilot, "migrate-dialog")
        await pilot.press("escape", "ctrl+d")
        await snap(pilot, "cancel-confirm")
        await pilot.press("n", "l")
        await pilot.pause(0.5)
        await snap(pilot, "logs")
        await pilot.press("escape", "question_mark")
        await snap(pilot, "help")
        await pilot.press("escape", "escape", "D")
        await snap(pilot, "datasets")
        await pilot.press("H")
        usage = app.main_screen().query_one("#usage", UsageTable)
        await _until(pilot, lambda: usage.report is not None)
        await snap(pilot, "usage")
        await pilot.press("colon", *"gpus", "enter", "h")
        await _until(pilot, lambda: getattr(app.screen, "doc", None) is not None)
        await snap(pilot, "history-gpu")
        hour = getattr(app.screen, "doc", None)
        await pilot.press("4")
        await _until(pilot, lambda: getattr(app.screen, "doc", None) is not hour)
        await snap(pilot, "history-gpu-week")
        await pilot.press("escape")
        if identity_dir is not None:
            await pilot.press("colon", *"hosts", "enter", "a", *"alice@gpu-new-01")
            await snap(pilot, "add-host-form")
            await pilot.press("escape")
        await pilot.press("F")
        for key, name in (("", "fleet"), fleet_window):
            if key:
                await pilot.press(key)
            await _until(pilot, lambda: _fleet_read(app))
            await snap(pilot, name)
        await pilot.press("escape")
    return saved


def _fleet_read(app: ShoalApp) -> bool:
    """The fleet view shows its window's report."""
    screen = app.screen
    return isinstance(screen, FleetScreen) and (
        screen.report is not None and screen.report.span_s == screen.span_s
    )


LIVE_STEPS = (
    "import math, os, sys, time\n"
    "print('args:', *sys.argv[1:], flush=True)\n"
    "progress = os.environ.get('SHOAL_PROGRESS_FILE')\n"
    "for i in range(100000):\n"
    "    print(f'step {i:5d}  loss {2.5 * math.exp(-i / 40) + 0.05:.4f}', flush=True)\n"
    "    if progress:\n"
    "        with open(progress + '.tmp', 'w') as f:\n"
    "            f.write(f'{min(1.0, i / 2400):.4f} step {i}')\n"
    "        os.replace(progress + '.tmp', progress)\n"
    "    time.sleep(0.5)\n"
)
"""What the live screenshots' jobs run: a training-like log, a line every half second, and its
progress (through ``$SHOAL_PROGRESS_FILE``: 2,400 steps, 20 minutes) for the jobs view."""


def live_jobs(python: str, script: Path) -> list[JobSpec]:
    """A few jobs for the live mesh: CUDA and ROCm training, inference, one that waits for
    GPUs in use (eight CUDA GPUs on one node: the one 8-GPU H100 host runs the first job) and
    one that waits for GPUs no host has."""
    from agent.job.jobspec import Resources

    def job(gpus: int, backends: tuple[str, ...], kind: str, *args: str) -> JobSpec:
        return JobSpec(
            command=(python, str(script), *args),
            resources=Resources(gpus_per_node=gpus, backends=backends),  # type: ignore[arg-type]
            kind=kind,  # type: ignore[arg-type]
        )

    return [
        job(4, ("cuda",), "training", "--model", "llama-8b"),
        job(2, ("rocm",), "training", "--model", "mistral-7b", "--lora"),
        job(1, ("cuda",), "inference", "--serve", "qwen-7b"),
        job(1, ("xpu",), "batch", "--embed", "shard-3"),
        job(8, ("cuda",), "training", "--model", "llama-70b", "--stage", "2"),
        job(16, (), "training", "--model", "llama-70b"),  # fits nowhere: waits, with its reason
    ]


async def _live_datasets(client: ApiClient, root: Path, nodes: list[str]) -> None:
    """Two small datasets indexed on the first two agents, for the datasets view."""
    for i, (name, files) in enumerate((("corpus", 3), ("tokenized-c4", 5))):
        folder = root / "datasets-src" / name
        folder.mkdir(parents=True)
        for n in range(files):
            (folder / f"part-{n:03d}.bin").write_bytes(os.urandom(1024 * 1024 * (n + 1)))
        await client.command("data_add", {"name": name, "path": str(folder), "node": nodes[i]})


async def _live(outdir: Path, size: tuple[int, int], nodes: int) -> list[Path]:
    from agent.sandbox.localmesh import LocalMesh
    from gossip.identity import common_name
    from tui.source import ApiSource

    with (
        tempfile.TemporaryDirectory(prefix="shoal-shots-") as root,
        LocalMesh(Path(root), nodes) as mesh,
    ):
        await mesh.wait_converged(timeout_s=120)
        assert mesh.operator is not None
        script = Path(root) / "train.py"
        script.write_text(LIVE_STEPS, encoding="utf-8")
        # Jobs run as an unprivileged user when the agents run as root: let it read the script.
        Path(root).chmod(0o755)
        script.chmod(0o644)
        # A system Python first: the job user may not reach one under root's home (pyenv).
        system = [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, 1)]
        python = system[0] if system else "python3" if shutil.which("python3") else sys.executable
        client = mesh.client(0)
        try:
            await _live_datasets(client, Path(root), [a.node_id for a in mesh.agents[:2]])
            for spec in live_jobs(python, script):
                await client.submit(spec)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                running = [j for j in await client.jobs() if j["state"] == "running"]
                if len(running) >= 3:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(3.0)  # a few log lines and a few utilization samples
        finally:
            await client.close()
        name = common_name(mesh.operator.ca_certificate) or "shoal-demo"
        source = ApiSource(mesh.client(0), name)
        return await shoot(
            source,
            outdir,
            size,
            prefix="live-",
            hide="^h100",
            pick="qwen",
            refresh_s=2.0,
            identity_dir=Path(root) / "cluster",
            fleet_window=("1", "fleet-5m"),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.screenshots", description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--live", action="store_true", help="a real LocalMesh of agents")
    parser.add_argument("--nodes", type=int, default=8, help="agents (--live) or simulated hosts")
    parser.add_argument("--size", default="160x48", help="COLSxROWS")
    args = parser.parse_args(argv)
    cols, rows = (int(p) for p in args.size.lower().split("x"))
    if args.live:
        saved = asyncio.run(_live(args.outdir, (cols, rows), args.nodes))
    else:
        sim = SimSource(max(args.nodes, 12), seed=0)
        saved = asyncio.run(shoot(sim, args.outdir, (cols, rows)))
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
