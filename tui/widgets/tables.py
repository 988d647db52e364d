"""The table the views are made of (:class:`MeshTable`): line-oriented, drawing only the rows on
screen. The views themselves (hosts, GPUs, jobs, events) are in :mod:`tui.widgets.views`.

A table holds, per snapshot, the ordered list of its rows as ``(stable key, item)`` pairs: the
item is the model object itself (a host, ``(host, GPU, job holding it)``, a job, an event), so a
refresh of 8,000 GPU rows costs one pass over the snapshot and, with a sort key, one sort on a
number. Display strings are made only for the lines on screen, when they are drawn, and kept
until the next snapshot. The cursor follows its row's key across refreshes, sorts and filters.
Every table fits 80 columns; a text column at the end takes the width that is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, NamedTuple

from rich.cells import cell_len, set_cell_size
from rich.style import Style
from textual import events
from textual.binding import BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.model import EMPTY_SNAPSHOT, MeshSnapshot
from tui.widgets.base import CURSOR_BINDINGS, CursorKeys, Drill, Selection, SortKey, ViewContext
from tui.widgets.render import Part, line_strip, oneline


class Column(NamedTuple):
    key: str
    label: str
    width: int
    right: bool = False
    stretch: bool = False
    """The last column only: take the width the others leave."""
    grow: int = 0
    """Cells more this column takes on a terminal wide enough that the last column still
    gets twice its own width (a host name in full at 120 columns, never at the cost of 80)."""


_BOLD = Style(bold=True)
_UNDERLINE = Style(underline=True)
Row = tuple[str, Any]
"""``(stable key, item)``."""
SortSpec = tuple[Callable[[Any], Any], bool]
"""A key on the row's item, and whether the order is descending."""


def _fit(text: str, width: int, right: bool) -> str:
    """``text`` in exactly ``width`` cells, on one line: clipped with an ellipsis, or padded."""
    if not text.isprintable():
        text = oneline(text)
    n = len(text) if text.isascii() else cell_len(text)
    if n > width:
        return set_cell_size(text, max(0, width - 1)) + "…" if width > 0 else ""
    pad = " " * (width - n)
    return pad + text if right else text + pad


class MeshTable(CursorKeys, ScrollView, can_focus=True):
    """A view over the snapshot as rows; subclasses say which rows and how they look."""

    BINDINGS: ClassVar[list[BindingType]] = [*CURSOR_BINDINGS]

    DEFAULT_CSS = """
    MeshTable { height: 1fr; overflow-x: hidden; }
    """

    COLUMNS: ClassVar[tuple[Column, ...]] = ()
    SORTS: ClassVar[Mapping[str, SortSpec]] = {}
    """Sort name -> (key on the row's item, descending). Rows without a sort keep the
    snapshot's order; a sort is stable, so equal rows keep it too."""
    view_name: ClassVar[str] = ""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_key: SortKey | None = None
        self._ctx = ViewContext()
        self._natural: list[Row] = []
        self._keys: list[str] = []
        self._items: list[Any] = []
        self._position: dict[str, int] | None = None
        self._cursor = 0
        self._cursor_key: str | None = None
        self._base: Style | None = None
        self._strips: dict[tuple[int, int], Strip] = {}
        """Drawn lines by (row, width), without the cursor; dropped on every change of rows."""
        self._widths: tuple[int, tuple[int, ...]] = (-1, ())

    # -- what subclasses provide -------------------------------------------------------------

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        """Every row in scope, in the snapshot's order."""
        raise NotImplementedError

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        """The text the ``/`` filter searches for this row."""
        raise NotImplementedError

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        """One ``(text, style)`` per column, for a row on screen."""
        raise NotImplementedError

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        raise NotImplementedError

    # -- updating ----------------------------------------------------------------------------

    def apply(self, ctx: ViewContext) -> None:
        """Bring the rows to ``ctx``; the cursor stays on its row's key."""
        self._ctx = ctx
        rows = list(self.table_rows(ctx))
        pattern = ctx.row_filter.compile()
        if pattern is not None:
            keeps, haystack = ctx.row_filter.keeps, self.haystack
            rows = [row for row in rows if keeps(haystack(row[1], ctx), pattern)]
        self._natural = rows
        self._order()

    def release(self) -> None:
        """Drop the rows (hidden and out of date: the snapshot they hold can be freed).

        The cursor's key is kept; the next :meth:`apply` rebuilds the rows around it.
        """
        self._ctx = replace(self._ctx, snapshot=EMPTY_SNAPSHOT)
        self._natural, self._keys, self._items = [], [], []
        self._position = None
        self._strips.clear()

    def _order(self) -> None:
        rows = self._natural
        spec = self.SORTS.get(self.sort_key) if self.sort_key is not None else None
        if spec is not None:
            key_of, descending = spec
            rows = sorted(rows, key=lambda row: key_of(row[1]), reverse=descending)
        self._keys = [key for key, _ in rows]
        self._items = [item for _, item in rows]
        self._position = None
        self._strips.clear()
        self._base = None
        self._restore_cursor()
        self.virtual_size = Size(self.scrollable_content_region.width, len(rows) + 1)
        self.refresh()

    def _restore_cursor(self) -> None:
        if self._cursor_key is not None:
            index = self.position().get(self._cursor_key)
            if index is not None:
                self._cursor = index
                return
        self._cursor = min(self._cursor, max(0, len(self._keys) - 1))
        self._cursor_key = self._keys[self._cursor] if self._keys else None

    def position(self) -> dict[str, int]:
        """Row key -> row index (made when first asked after a change)."""
        if self._position is None:
            self._position = {key: i for i, key in enumerate(self._keys)}
        return self._position

    def sort_by(self, sort_key: SortKey) -> bool:
        """Order rows by ``sort_key``; False when this table has no such order."""
        if sort_key not in self.SORTS:
            return False
        self.sort_key = sort_key
        self._order()
        self._scroll_to_cursor()
        return True

    # -- reading it (tests and actions) ------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def cursor_row(self) -> int:
        return self._cursor

    def row_keys(self) -> list[str]:
        return list(self._keys)

    def get_row_index(self, key: str) -> int:
        """The row's index; ``KeyError`` when it is not shown."""
        return self.position()[key]

    def get_row_at(self, index: int) -> list[str]:
        """The row's cells as shown (without padding)."""
        return [text for text, _ in self.cells(self._items[index], self._ctx)]

    def get_cell(self, key: str, column: str) -> str:
        row = self.get_row_at(self.get_row_index(key))
        return row[[c.key for c in self.COLUMNS].index(column)]

    def current_key(self) -> str | None:
        return self._cursor_key if self._keys else None

    # -- selection and moving ----------------------------------------------------------------

    def selection(self) -> Selection | None:
        key = self.current_key()
        return None if key is None else self.selection_for(key, self._ctx.snapshot)

    def select_key(self, key: str) -> bool:
        index = self.position().get(key)
        if index is None:
            return False
        self._move_to(index)
        return True

    def _page_rows(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def _scroll_to_cursor(self) -> bool:
        top = round(self.scroll_offset.y)
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False, immediate=True)
            return True
        if self._cursor >= top + self._page_rows():
            self.scroll_to(y=self._cursor - self._page_rows() + 1, animate=False, immediate=True)
            return True
        return False

    def _move_to(self, index: int) -> None:
        if not self._keys:
            return
        index = max(0, min(len(self._keys) - 1, index))
        old, self._cursor = self._cursor, index
        self._cursor_key = self._keys[index]
        if self._scroll_to_cursor():
            self.refresh()
        else:
            self.refresh_line(old + 1)  # virtual lines: the header is line 0
            self.refresh_line(index + 1)

    def _cursor_lines(self) -> int:
        return len(self._keys)

    def action_drill(self) -> None:
        selection = self.selection()
        if selection is not None:
            self.post_message(Drill(selection))

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            self._move_to(round(self.scroll_offset.y) + event.y - 1)
            if event.chain >= 2:
                self.action_drill()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- drawing -----------------------------------------------------------------------------

    def _base_style(self) -> Style:
        """The widget's own style under every line (asked of the DOM once, not per line)."""
        if self._base is None:
            self._base = self.rich_style
        return self._base

    def notify_style_update(self) -> None:
        self._base = None
        super().notify_style_update()

    def _column_widths(self, width: int) -> tuple[int, ...]:
        if self._widths[0] == width:
            return self._widths[1]
        widths = [c.width for c in self.COLUMNS]
        if self.COLUMNS and self.COLUMNS[-1].stretch:
            spare = width - sum(widths) - 2 * len(widths) - widths[-1]
            for i, column in enumerate(self.COLUMNS[:-1]):
                extra = max(0, min(column.grow, spare))
                widths[i] += extra
                spare -= extra
            fixed = sum(widths[:-1]) + 2 * len(widths)
            widths[-1] = max(widths[-1], width - fixed)
        self._widths = (width, tuple(widths))
        return self._widths[1]

    def _line(self, parts: Sequence[Part], width: int, base: Style) -> Strip:
        runs: list[Part] = []
        for (text, style), column, w in zip(
            parts, self.COLUMNS, self._column_widths(width), strict=False
        ):
            runs.append((" " + _fit(text, w, column.right) + " ", style))
        return line_strip(runs, width, base)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        palette = self._ctx.palette
        base = self._base_style()
        if y == 0:
            labels = [(c.label, None) for c in self.COLUMNS]
            return self._line(labels, width, base + palette.header)
        index = round(self.scroll_offset.y) + y - 1
        if index >= len(self._keys):
            return Strip.blank(width, base)
        if index == self._cursor:
            cursor = palette.selected + _BOLD if self.has_focus else _UNDERLINE
            return self._line(self.cells(self._items[index], self._ctx), width, base + cursor)
        strip = self._strips.get((index, width))
        if strip is None:
            strip = self._line(self.cells(self._items[index], self._ctx), width, base)
            self._strips[(index, width)] = strip
        return strip
