"""The rich progress display (one line per host: its current step) and the summary table."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.bootstrap.hostrun import HostResult
from agent.operator.terminal import Column, fitted_table


class ProgressDisplay:
    """A :class:`~agent.bootstrap.hostrun.Reporter` drawing one spinner line per host."""

    def __init__(self, console: Console, hosts: Sequence[str]) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[host]}"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        for host in hosts:
            self._tasks[host] = self._progress.add_task("waiting", host=host, total=None)

    def step(self, host: str, text: str) -> None:
        task = self._tasks.get(host)
        if task is None:
            return
        if text in ("done", "failed"):
            style = "green" if text == "done" else "red"
            self._progress.update(task, description=f"[{style}]{text}", total=1, completed=1)
        else:
            self._progress.update(task, description=text)

    def __enter__(self) -> ProgressDisplay:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()


SUMMARY_COLUMNS: tuple[Column, ...] = (
    ("Host", "left", 22),
    ("Result", "left", 11),
    ("Node", "left", 8),
    ("Service", "left", 14),
    ("GPUs in mesh", "left", 20),
    ("Details", "left", None),
)


def summary_row(r: HostResult) -> list[str]:
    system = ", ".join(
        part
        for part in (
            f"{r.os}/{r.arch}" if r.os else "",
            f"Python {r.python.split(' ')[0]}" if r.python else "",
        )
        if part
    )
    return [
        r.host,
        r.action,
        r.node_id[:8] if r.node_id else "-",
        r.service or "-",
        r.gpus or "-",
        f"{r.message} ({system})" if system and r.ok else r.message,
    ]


def summary_table(results: Sequence[HostResult], width: int) -> Table:
    """One line per host, ``width`` columns wide (a long detail is cut: failures, notes and
    warnings follow the table in full)."""
    return fitted_table(SUMMARY_COLUMNS, [summary_row(r) for r in results], width)


def note_lines(results: Sequence[HostResult]) -> list[str]:
    """``host X: <note>`` for what was done that the operator should know (a key trusted)."""
    return [f"host {r.host}: {note}" for r in results for note in r.notes]


def warning_lines(results: Sequence[HostResult]) -> list[str]:
    """``host X: warning: <what>`` for what the operator should act on."""
    return [f"host {r.host}: warning: {w}" for r in results for w in r.warnings]


def failure_lines(results: Sequence[HostResult]) -> list[str]:
    """One line per failed host, as printed on stderr after the table."""
    lines = []
    for r in results:
        if not r.ok:
            prefix = f"host {r.host}: "
            lines.append(r.message if r.message.startswith(prefix) else prefix + r.message)
    return lines
