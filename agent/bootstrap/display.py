"""The rich progress display (one line per host: its current step) and the summary table."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from rich import box
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.bootstrap.runner import HostResult


class ProgressDisplay:
    """A :class:`~agent.bootstrap.runner.Reporter` drawing one spinner line per host."""

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


def summary_table(results: Sequence[HostResult]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="shoal bootstrap", title_justify="left")
    for column in ("host", "result", "node", "os/arch", "python", "GPU drivers", "GPUs in mesh"):
        table.add_column(column)
    table.add_column("details", overflow="fold")
    for r in results:
        style = "green" if r.ok else "red"
        table.add_row(
            r.host,
            f"[{style}]{r.action}",
            r.node_id[:12] if r.node_id else "-",
            f"{r.os}/{r.arch}" if r.os else "-",
            (r.python or "-").split(" ")[0],
            r.gpu_drivers or "-",
            r.gpus or "-",
            r.message,
        )
    return table


def failure_lines(results: Sequence[HostResult]) -> list[str]:
    """One line per failed host, as printed on stderr after the table."""
    lines = []
    for r in results:
        if not r.ok:
            prefix = f"host {r.host}: "
            lines.append(r.message if r.message.startswith(prefix) else prefix + r.message)
    return lines
