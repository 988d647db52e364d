"""Helpers for the TUI's pilot tests: a deterministic simulated mesh and waiting on the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual.pilot import Pilot

from tui.app import ShoalApp
from tui.source import SimSource


def sim_app(hosts: int = 12, **kwargs: object) -> tuple[ShoalApp, SimSource]:
    source = SimSource(hosts, seed=0)
    app = ShoalApp(source, refresh_s=60.0, **kwargs)  # type: ignore[arg-type]
    return app, source


async def wait_until(pilot: Pilot[None], condition: Callable[[], bool], tries: int = 200) -> None:
    for _ in range(tries):
        await pilot.pause()
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never became true")


async def started(pilot: Pilot[None]) -> ShoalApp:
    app = pilot.app
    assert isinstance(app, ShoalApp)
    await wait_until(pilot, lambda: app.snapshot_serial >= 1)
    return app


async def settled(pilot: Pilot[None], app: ShoalApp, serial_before: int) -> None:
    """Wait until no operation is in flight and the mesh has been read again since."""
    await wait_until(
        pilot,
        lambda: (
            not app.ops_in_flight and app.snapshot_serial > serial_before and bool(app.outcomes)
        ),
    )


async def command(pilot: Pilot[None], text: str, key: str = "colon") -> None:
    """Open the command bar (or the filter with ``key="slash"``), enter ``text``, press enter."""
    from textual.widgets import Input

    app = pilot.app
    assert isinstance(app, ShoalApp)
    await pilot.press(key)
    app.main_screen().query_one("#bar", Input).value = text
    await pilot.press("enter")


async def filter_rows(pilot: Pilot[None], text: str) -> None:
    await command(pilot, text, key="slash")
