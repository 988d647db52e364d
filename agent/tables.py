"""The CLI's tables: jobs, nodes and events as an operator reads them, one row each.

Cells never wrap: a long command, host or GPU name is cut with an ellipsis, and a command's
newlines are shown as ``\\n``, so a row is one line. Piped (stdout not a terminal) every table is
80 columns wide. Times are relative (``in 2h``, ``3m ago``); a node that is not alive, or whose
telemetry is older than :data:`STALE_AFTER_S`, shows ``stale`` instead of its last readings.

rich is imported here only: ``shoal agent`` never draws a table.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from agent.deadlines import lateness_s

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PIPED_WIDTH = 80
"""Columns of every table when stdout is not a terminal."""
STALE_AFTER_S = 90.0
"""Telemetry older than this is not shown as current (agents send a heartbeat every 60 s)."""
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


def deadline_cell(job: Mapping[str, Any], spec: Mapping[str, Any], now: float) -> str:
    """``missed`` once the deadline has passed before the job ended (its owner said so, or it
    has passed since), else when it is (``in 2h``)."""
    raw = spec.get("deadline")
    deadline = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
    finished = job.get("finished_at")
    late = lateness_s(
        deadline,
        str(job.get("state")),
        float(finished) if isinstance(finished, int | float) else None,
        now,
    )
    if job.get("deadline_missed_s") is not None or late is not None:
        return "missed"
    return relative(deadline, now)


def eta(job: Mapping[str, Any]) -> str:
    """Predicted completion of a running job from its ``eta_s`` (``~4m``), else ``-``."""
    seconds = job.get("eta_s")
    if job.get("state") != "running" or seconds is None:
        return "-"
    return f"~{span(float(seconds))}"


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


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table of one-line cells that fits ``width``: cells are cut with an ellipsis."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)
    widths = _widths(columns, rows, width)
    for (name, justify, _), w in zip(columns, widths, strict=True):
        table.add_column(
            _fit(name, w),
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis",
            width=w,
        )
    for row in rows:
        table.add_row(*(_fit(cell, w) for cell, w in zip(row, widths, strict=True)))
    return table


JOB_COLUMNS: tuple[Column, ...] = (
    ("Job", "left", 8),
    ("State", "left", 9),
    ("Node", "left", 12),
    ("GPUs", "right", 7),
    ("Pri", "right", 3),
    ("Deadline", "right", 8),
    ("Done", "right", 4),
    ("ETA", "right", 4),
    ("Command / why", "left", None),
)


def job_row(job: Mapping[str, Any], names: Mapping[str, str], now: float) -> list[str]:
    spec = job.get("spec") or {}
    resources = spec.get("resources") or {}
    gpus = f"{resources.get('gpus_per_node', '?')}"
    if isinstance(resources.get("share_fraction"), int | float):
        gpus = f"{resources['share_fraction']:g}"
    elif isinstance(resources.get("share_mem_bytes"), int):
        gpus = f"{resources['share_mem_bytes'] / 1024**3:.3g}G"
    elif isinstance(resources.get("gpus_max_per_node"), int):  # elastic: what it holds, range
        held = job.get("devices")
        span = f"({gpus}-{resources['gpus_max_per_node']})"
        gpus = f"{len(held)} {span}" if isinstance(held, list) and held else span
    if resources.get("nodes", 1) != 1:
        gpus += f"x{resources['nodes']}"
    progress = job.get("progress")
    runner = job.get("runner")
    where = names.get(runner or "", short(runner))
    members = job.get("members") or ()
    if members:  # a gang: one row, its members in the job's detail
        where = f"{len(members)} node{'s' * (len(members) != 1)}"
    why = job.get("reason") if job.get("state") == "pending" else None
    return [
        short(job.get("job_id")),
        str(job.get("state", "?")),
        where,
        gpus,
        str(spec.get("priority", "-")),
        deadline_cell(job, spec, now),
        "-" if progress is None else f"{100 * float(progress):.0f}%",
        eta(job),
        one_line(str(why)) if why else command_line(spec),
    ]


def job_detail(
    job: Mapping[str, Any], names: Mapping[str, str], now: float
) -> list[tuple[str, str]]:
    """One job as label and value lines (``shoal jobs JOB``): a gang lists each member."""

    def host(node: Any) -> str:
        return names.get(str(node or ""), short(node))

    spec = job.get("spec") or {}
    rows = [
        ("Job", str(job.get("job_id"))),
        ("State", f"{job.get('state', '?')} (attempt {job.get('attempt', 0)})"),
        ("Owner", host(job.get("owner"))),
        ("Command", command_line(spec)),
    ]
    members = job.get("members") or ()
    if members:
        for i, m in enumerate(members):
            devices = ",".join(m.get("devices") or ()) or "-"
            line = f"rank {m.get('rank')}  {host(m.get('node'))}  {devices}"
            rows.append(("Members" if i == 0 else "", line))
    else:
        rows.append(("Node", host(job.get("runner"))))
    if job.get("started_at") is not None:
        rows.append(("Started", relative(job["started_at"], now)))
    if job.get("reason"):
        rows.append(("Why", one_line(str(job["reason"]))))
    return rows


def jobs_table(
    jobs: Sequence[Mapping[str, Any]], names: Mapping[str, str], now: float, width: int
) -> Table:
    """One row per job, ``width`` columns wide; ``names`` maps node ids to host names."""
    return fitted_table(JOB_COLUMNS, [job_row(job, names, now) for job in jobs], width)


def is_stale(node: Mapping[str, Any]) -> bool:
    """The node's readings are not current: it is not alive, or its telemetry is old."""
    age_s = node.get("telemetry_age_s")
    return node.get("state") != "alive" or (age_s is not None and float(age_s) > STALE_AFTER_S)


def _gpu_names(devices: Sequence[Mapping[str, Any]]) -> str:
    """``2x NVIDIA H100``; a host with no GPU shows ``CPU only`` (its CPU is no GPU)."""
    names: dict[str, int] = {}
    for device in devices:
        if device.get("backend") == "cpu":
            continue
        name = str(device.get("name", "?")).removesuffix(" (simulated)")
        names[name] = names.get(name, 0) + 1
    if names:
        return ", ".join(f"{n}x {name}" for name, n in names.items())
    return "CPU only" if devices else "-"


def _readings(devices: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """Mean utilization and the share of memory in use over the node's GPUs (over its CPU and
    RAM on a host without GPUs)."""
    gpus = [d for d in devices if d.get("backend") != "cpu"]
    devices = gpus or devices
    utils = [float(d["util_pct"]) for d in devices if d.get("util_pct") is not None]
    mem = [
        (int(d["mem_used_bytes"]), int(d["mem_total_bytes"]))
        for d in devices
        if d.get("mem_used_bytes") is not None and d.get("mem_total_bytes")
    ]
    util = f"{sum(utils) / len(utils):.0f}%" if utils else "N/A"
    used = f"{100 * sum(u for u, _ in mem) / sum(t for _, t in mem):.0f}%" if mem else "N/A"
    return util, used


NODE_COLUMNS: tuple[Column, ...] = (
    ("Host", "left", 16),
    ("Node", "left", 8),
    ("State", "left", 7),
    ("Drain", "left", 11),
    ("Util", "right", 5),
    ("Mem", "right", 4),
    ("Jobs", "right", 4),
    ("GPUs", "left", None),
)


def node_row(node: Mapping[str, Any]) -> list[str]:
    """One node; one that is not alive shows no readings (``stale`` while it may come back,
    ``-`` once it has left), and no jobs."""
    devices = node.get("devices") or []
    state = str(node.get("state", "?"))
    if state == "left":
        util, mem = "-", "-"
    elif devices and is_stale(node):
        util, mem = "stale", "-"
    else:
        util, mem = _readings(devices)
    alive = state == "alive"
    return [
        str((node.get("host") or {}).get("hostname") or "-"),
        short(node.get("node_id")),
        state,
        str(node.get("drain") or "-"),
        util,
        mem,
        str(len(node.get("running_jobs") or [])) if alive else "-",
        (_shared(node) if alive else "") + _gpu_names(devices),
    ]


def _shared(node: Mapping[str, Any]) -> str:
    """``1 shared (2 jobs); ``: how many GPUs run shares of one GPU, and how many jobs; first,
    so a narrow column still shows it."""
    shares = node.get("shares") or {}
    if not isinstance(shares, Mapping) or not shares:
        return ""
    jobs = sum(len(held) for held in shares.values() if isinstance(held, Mapping))
    return f"{len(shares)} shared ({jobs} job{'s' * (jobs != 1)}); "


def nodes_table(nodes: Sequence[Mapping[str, Any]], width: int) -> Table:
    """One row per node, ``width`` columns wide; stale readings shown as ``stale``."""
    return fitted_table(NODE_COLUMNS, [node_row(node) for node in nodes], width)


def hostnames(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """node id -> the name a node shows in ``shoal nodes`` (its short id when it has none)."""
    out = {}
    for node in nodes:
        node_id = str(node.get("node_id", ""))
        out[node_id] = str((node.get("host") or {}).get("hostname") or short(node_id))
    return out


EVENT_COLUMNS: tuple[tuple[str, int], ...] = (
    ("TIME", 8),
    ("NODE", 12),
    ("JOB", 8),
    ("KIND", 14),
    ("MESSAGE", 0),
)
"""The events table's columns and widths (0: the rest of the line)."""


def event_line(values: Sequence[str], width: int) -> str:
    """One row of the events table, cut to ``width`` columns (shared by the header)."""
    cells = []
    used = 0
    for (_, column_width), value in zip(EVENT_COLUMNS, values, strict=True):
        text = one_line(value)
        if column_width:
            cells.append(_fit(text, column_width).ljust(column_width))
            used += column_width + 2
        else:
            cells.append(_fit(text, max(8, width - used)))
    return "  ".join(cells).rstrip()


def event_header(width: int) -> str:
    return event_line([name for name, _ in EVENT_COLUMNS], width)


def event_row(event: Mapping[str, Any], names: Mapping[str, str], width: int) -> str:
    at = event.get("at")
    when = time.strftime("%H:%M:%S", time.localtime(float(at))) if at is not None else "-"
    node = str(event.get("node") or "")
    return event_line(
        (
            when,
            names.get(node, short(node)),
            short(event.get("job_id")),
            str(event.get("kind", "")),
            str(event.get("message", "")),
        ),
        width,
    )


def line_width(stream: TextIO | None = None) -> int:
    """The terminal's width, or 80 columns when piped."""
    import shutil

    out = stream or sys.stdout
    return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns if out.isatty() else PIPED_WIDTH
