"""What every view shares: the context it renders from, its scope and the drill-down message."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from textual.binding import Binding, BindingType
from textual.message import Message

from tui.model import EMPTY_SNAPSHOT, NO_FILTER, History, MeshSnapshot, RowFilter
from tui.widgets.render import DEFAULT_PALETTE, UNICODE_GLYPHS, Glyphs, Palette

ViewName = Literal["topology", "hosts", "gpus", "jobs", "events", "datasets", "usage"]
VIEW_NAMES: tuple[ViewName, ...] = (
    "topology",
    "hosts",
    "gpus",
    "jobs",
    "events",
    "datasets",
    "usage",
)
SortKey = Literal["name", "util", "mem", "temp"]


@dataclass(frozen=True, slots=True)
class Scope:
    """What a drilled-down view is limited to: one host, or one GPU of a host."""

    node_id: str | None = None
    device_key: str | None = None
    label: str = ""

    @property
    def active(self) -> bool:
        return self.node_id is not None


NO_SCOPE = Scope()


@dataclass(frozen=True, slots=True)
class ViewContext:
    """Everything a view needs to draw itself."""

    snapshot: MeshSnapshot = EMPTY_SNAPSHOT
    history: History | None = None
    row_filter: RowFilter = NO_FILTER
    scope: Scope = NO_SCOPE
    palette: Palette = DEFAULT_PALETTE
    glyphs: Glyphs = UNICODE_GLYPHS


@dataclass(frozen=True, slots=True)
class Selection:
    """What the cursor is on, in terms the actions understand."""

    kind: Literal["host", "gpu", "job", "event", "dataset", "usage"]
    node_id: str | None = None
    device_key: str | None = None
    job_id: str | None = None
    raw: Mapping[str, Any] | None = None
    title: str = ""


class Drill(Message):
    """The operator pressed enter on a row: show what is inside it."""

    def __init__(self, selection: Selection) -> None:
        super().__init__()
        self.selection = selection


CURSOR_BINDINGS: list[BindingType] = [
    Binding("j,down", "cursor(1)", "Down", show=False, id="table.down"),
    Binding("k,up", "cursor(-1)", "Up", show=False, id="table.up"),
    Binding("g,home", "top", "Top", show=False, id="table.top"),
    Binding("G,end", "bottom", "Bottom", show=False, id="table.bottom"),
    Binding("pagedown", "page(1)", show=False),
    Binding("pageup", "page(-1)", show=False),
    Binding("enter", "drill", "Drill", show=False, id="table.drill"),
]
"""The keys of every line view with a cursor (the k9s keymap); ``enter`` drills down."""


class CursorKeys:
    """The actions behind :data:`CURSOR_BINDINGS`, for a view that keeps its cursor line in
    ``_cursor`` and moves it with ``_move_to`` over ``_cursor_lines()`` lines."""

    _cursor: int

    def _move_to(self, index: int) -> None:
        raise NotImplementedError

    def _cursor_lines(self) -> int:
        raise NotImplementedError

    def _page_rows(self) -> int:
        raise NotImplementedError

    def action_cursor(self, delta: int) -> None:
        self._move_to(self._cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self._cursor + direction * self._page_rows())

    def action_top(self) -> None:
        self._move_to(0)

    def action_bottom(self) -> None:
        self._move_to(self._cursor_lines() - 1)
