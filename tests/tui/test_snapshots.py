"""Every screen of the TUI on a deterministic simulated mesh, at 80x24 and 160x48.

The simulated mesh's clock stands still, its noise is seeded and its reads at one moment are
identical, so the same keys give the same screen. Update the baselines with
``pytest tests/tui/test_snapshots.py --snapshot-update`` after looking at the new screens.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from tests.tui.helpers import command, sim_app, started, wait_until
from tui.screens.fleet import FleetScreen

SIZES = [(80, 24), (160, 48)]

SCREENS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "topology": (None, ()),
    "hosts": ("hosts", ()),
    "gpus": ("gpus", ()),
    "jobs": ("jobs", ()),
    "events": ("events", ()),
    "datasets": ("data", ()),
    "usage": ("usage", ()),
    "history": ("gpus", ("h",)),
    "fleet": (None, ("F",)),
    "fleet-week": (None, ("F", "4")),
    "drill": (None, ("j", "enter")),
    "describe": (None, ("j", "d")),
    "json": (None, ("j", "y")),
    "help": (None, ("question_mark",)),
    "drain": (None, ("j", "r")),
    "submit": (None, ("n", "p", "y")),
    "migrate": ("jobs", ("j", "m")),
    "cancel": ("jobs", ("ctrl+d",)),
    "logs": ("jobs", ("j", "l")),
}
"""Screen -> (view to show first through the command bar, then the keys to press)."""


def _run_before(
    view: str | None, keys: tuple[str, ...]
) -> Callable[[Pilot[None]], Awaitable[None]]:
    async def run_before(pilot: Pilot[None]) -> None:
        await started(pilot)
        if view is not None:
            await command(pilot, view)
        await pilot.press(*keys)
        await pilot.pause()
        screen = pilot.app.screen
        if isinstance(screen, FleetScreen):  # every node's history read, the last window's
            await wait_until(
                pilot, lambda: screen.report is not None and screen.report.span_s == screen.span_s
            )
        for widget in pilot.app.screen.query(Input):
            widget.cursor_blink = False
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen(snap_compare, screen: str, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app, _ = sim_app()
    view, keys = SCREENS[screen]
    assert snap_compare(app, terminal_size=size, run_before=_run_before(view, keys))
