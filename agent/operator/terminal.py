"""Terminal helpers for everything that prints to an operator: a console that exits quietly on a
closed pipe, one-line cells, durations and instants as people read them, and tables whose cells
never wrap. Piped (stdout not a terminal), every table is :data:`PIPED_WIDTH` columns wide.

rich is imported only inside the functions that draw: ``shoal agent`` never draws a table.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PIPED_WIDTH = 80
"""Columns of every table when stdout is not a terminal."""
_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def console(stream: TextIO | None = None) -> Console:
    """A rich console on ``stream`` (stdout): the terminal's width, or 80 columns when piped.

    A reader that goes away (``| head``) raises BrokenPipeError, which ``shoal``'s ``main``
    turns into a quiet exit with status 0 (rich itself would exit with status 1).
    """
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    out = stream or sys.stdout
    width = None if out.isatty() else PIPED_WIDTH
    return _Console(file=out, width=width, soft_wrap=False, highlight=False)


def one_line(text: str) -> str:
    """``text`` on one line: newlines, tabs and other control characters escaped."""
    return "".join(
        _CONTROL_ESCAPES.get(c, f"\\x{ord(c):02x}") if ord(c) < 32 or ord(c) == 127 else c
        for c in text
    )


def short(node_or_job: str | None, width: int = 8) -> str:
    return (node_or_job or "-")[:width]


def span(seconds: float) -> str:
    """A duration as an operator reads it: ``45s``, ``4m``, ``2h``, ``3d``."""
    s = abs(seconds)
    if s < 90:
        return f"{s:.0f}s"
    if s < 90 * 60:
        return f"{s / 60:.0f}m"
    if s < 48 * 3600:
        return f"{s / 3600:.0f}h"
    return f"{s / 86400:.0f}d"


def relative(at: float | None, now: float) -> str:
    """An instant relative to ``now``: ``in 2h``, ``3m ago``; ``-`` when there is none."""
    if at is None:
        return "-"
    delta = float(at) - now
    if abs(delta) < 1:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"


def command_line(spec: Mapping[str, Any]) -> str:
    """A job's command as one shell-quoted line."""
    return one_line(shlex.join(str(word) for word in spec.get("command") or []))


Column = tuple[str, str, int | None]
"""A column: its header, ``left`` or ``right``, and the most characters it takes (``None``: the
one column that takes what the others leave)."""

FLEXIBLE_MIN_WIDTH = 10


def _widths(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Each column's width so that a row fits ``width`` (two spaces between columns)."""
    natural = [
        min(cap or 10**6, max([len(name), *(len(row[i]) for row in rows)]))
        for i, (name, _, cap) in enumerate(columns)
    ]
    room = width - 2 * (len(columns) - 1)
    flexible = [i for i, (_, _, cap) in enumerate(columns) if cap is None]
    fixed = sum(w for i, w in enumerate(natural) if i not in flexible)
    for i in flexible:
        natural[i] = min(natural[i], max(FLEXIBLE_MIN_WIDTH, room - fixed))
    while sum(natural) > room:  # a narrow terminal: cut the widest column by one
        widest = max(range(len(natural)), key=lambda i: natural[i])
        if natural[widest] <= 3:
            break
        natural[widest] -= 1
    return natural


def fit_cell(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, with an ellipsis where it was cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table of one-line cells that fits ``width``: cells are cut with an ellipsis."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)
    widths = _widths(columns, rows, width)
    for (name, justify, _), w in zip(columns, widths, strict=True):
        table.add_column(
            fit_cell(name, w),
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis",
            width=w,
        )
    for row in rows:
        table.add_row(*(fit_cell(cell, w) for cell, w in zip(row, widths, strict=True)))
    return table


def line_width(stream: TextIO | None = None) -> int:
    """The terminal's width, or 80 columns when piped."""
    import shutil

    out = stream or sys.stdout
    return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns if out.isatty() else PIPED_WIDTH
