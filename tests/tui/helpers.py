"""Helpers for the TUI's pilot tests: a deterministic simulated mesh and waiting on the app."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from textual.pilot import Pilot
from textual.widget import Widget

from tui.app import ShoalApp
from tui.simmesh import SimSource

if TYPE_CHECKING:
    from tui.screens.submit import SubmitScreen

T = TypeVar("T")
NARROW = (80, 24)
"""The smallest terminal the TUI is made for."""


def sim_app(hosts: int = 12, **kwargs: object) -> tuple[ShoalApp, SimSource]:
    source = SimSource(hosts, seed=0)
    # No garbage-collection policy here: it starts with a full collection, which in a test
    # process full of earlier apps costs more than the test (the benchmark and the live test
    # run it).
    app = ShoalApp(source, refresh_s=60.0, quiet_gc=False, **kwargs)  # type: ignore[arg-type]
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


async def wait_for(
    pilot: Pilot[None], what: str, condition: Callable[[], bool], timeout_s: float = 20.0
) -> None:
    """Wait (at most ``timeout_s``, the app running meanwhile) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if condition():
            return
    raise AssertionError(f"waited {timeout_s:g} s for {what}")


async def api_until(
    what: str, read: Callable[[], Awaitable[T]], check: Callable[[T], bool], timeout_s: float = 20.0
) -> T:
    """Read through the API until ``check`` holds (at most ``timeout_s``); the last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await read()
        if check(answer):
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}; last answer: {answer!r}")
        await asyncio.sleep(0.1)


def visible_without_scrolling(app: ShoalApp, widget: Widget) -> None:
    """``widget`` lies inside the screen, nothing covers it, and nothing above it scrolls."""
    screen = app.screen.region
    region = widget.region
    assert region.area > 0, f"{widget.id} is not on screen"
    assert screen.contains_region(region), f"{widget.id} at {region} is off the {screen} screen"
    hit, _ = app.screen.get_widget_at(region.x + region.width // 2, region.y)
    assert hit is widget or widget in hit.ancestors, f"{widget.id} is covered by {hit}"
    for ancestor in widget.ancestors:
        if isinstance(ancestor, Widget):
            assert ancestor.scroll_offset.y == 0 and ancestor.max_scroll_y == 0, (
                f"{widget.id} sits in {ancestor}, which scrolls"
            )


def shown_lines(widget: Widget) -> list[str]:
    """The lines a widget shows, as plain text."""
    return ["".join(seg.text for seg in widget.render_line(y)) for y in range(widget.size.height)]


async def open_submit_form(pilot: Pilot[None]) -> SubmitScreen:
    """Press ``n``; the form, once every field of it shows without scrolling."""
    from tui.screens.submit import FIELDS, SubmitScreen

    app = pilot.app
    assert isinstance(app, ShoalApp)
    await pilot.press("n")
    form = app.screen
    assert isinstance(form, SubmitScreen)
    await pilot.pause()
    for field in FIELDS:
        visible_without_scrolling(app, form.query_one(f"#f-{field.key}"))
    return form
