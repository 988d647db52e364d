"""``python -m tui.screenshots OUTDIR [--live]``: every screen of the real app, as SVG files.

Runs the app headless on a deterministic simulated mesh (or, with ``--live``, on a real
:class:`agent.localmesh.LocalMesh` of agent processes) and saves one screenshot per screen:
the five views, a drill-down, the filter, help, describe, raw JSON, logs, and the drain, submit,
migrate and cancel dialogs, at 160x48 (``--size`` to change it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot

from tui.app import ShoalApp
from tui.source import MeshSource, SimSource

Step = Callable[[Pilot[None]], Awaitable[None]]


async def _wait(pilot: Pilot[None], app: ShoalApp, serial: int = 1) -> None:
    for _ in range(600):
        await pilot.pause()
        if app.snapshot_serial >= serial:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the app never showed the mesh")


async def shoot(source: MeshSource, outdir: Path, size: tuple[int, int]) -> list[Path]:
    """Drive the app through every screen, saving ``NN-name.svg`` files; their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    app = ShoalApp(source, refresh_s=3600.0)
    saved: list[Path] = []

    async def snap(pilot: Pilot[None], name: str) -> None:
        await pilot.pause()
        path = outdir / f"{len(saved) + 1:02d}-{name}.svg"
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
        await pilot.press("escape", "slash", *"!^nv-", "enter")
        await snap(pilot, "filter-inverted")
        await pilot.press("escape", "d")
        await snap(pilot, "describe-host")
        await pilot.press("escape", "y")
        await snap(pilot, "json-host")
        await pilot.press("escape", "r")
        await snap(pilot, "drain-dialog")
        await pilot.press("escape", "n", *"python train.py", "tab", "2")
        await snap(pilot, "submit-form")
        await pilot.press("escape", "colon", *"jobs", "enter", "slash", *"running", "enter")
        await pilot.press("m")
        await snap(pilot, "migrate-dialog")
        await pilot.press("escape", "ctrl+d")
        await snap(pilot, "cancel-confirm")
        await pilot.press("n", "l")
        await pilot.pause(0.5)
        await snap(pilot, "logs")
        await pilot.press("escape", "question_mark")
        await snap(pilot, "help")
        await pilot.press("escape")
    return saved


async def _live(outdir: Path, size: tuple[int, int], nodes: int) -> list[Path]:
    from agent.localmesh import LocalMesh
    from gossip.identity import common_name
    from tui.source import ApiSource

    with (
        tempfile.TemporaryDirectory(prefix="shoal-shots-") as root,
        LocalMesh(Path(root), nodes) as mesh,
    ):
        await mesh.wait_converged(timeout_s=120)
        assert mesh.operator is not None
        name = common_name(mesh.operator.ca_certificate) or "shoal-demo"
        return await shoot(ApiSource(mesh.client(0), name), outdir, size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tui.screenshots", description=__doc__)
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
