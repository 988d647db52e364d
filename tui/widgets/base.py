"""What every view shares: the context it renders from, its scope and the drill-down message."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from textual.message import Message

from tui.model import EMPTY_SNAPSHOT, NO_FILTER, History, MeshSnapshot, RowFilter
from tui.widgets.render import DEFAULT_PALETTE, UNICODE_GLYPHS, Glyphs, Palette

ViewName = Literal["topology", "hosts", "gpus", "jobs", "events"]
VIEW_NAMES: tuple[ViewName, ...] = ("topology", "hosts", "gpus", "jobs", "events")
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

    kind: Literal["host", "gpu", "job", "event"]
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
