"""The CLI's tables: jobs, nodes and events as an operator reads them, one row each.

Cells never wrap: a long command, host or GPU name is cut with an ellipsis, and a command's
newlines are shown as ``\\n``, so a row is one line. Piped (stdout not a terminal) every table is
80 columns wide. Times are relative (``in 2h``, ``3m ago``); a node that is not alive, or whose
telemetry is older than one and a half of its heartbeat (``agent.wire.records.telemetry_stale``),
shows ``stale`` instead of its last readings.

The helpers every table uses (cells cut to fit, durations, the console) are
:mod:`agent.operator.terminal`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.job.deadlines import lateness_s
from agent.operator.terminal import (
    Column,
    command_line,
    fit_cell,
    fitted_table,
    one_line,
    relative,
    short,
    span,
)
from agent.wire.records import telemetry_stale

if TYPE_CHECKING:
    from rich.table import Table


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
    # Why it waits (placing: its runner stages its datasets) or why it failed (a launch error
    # says so in one line), else what it runs.
    why = job.get("reason") if job.get("state") in ("pending", "placing", "failed") else None
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
        if job.get("devices"):
            rows.append(("GPUs", ",".join(str(d) for d in job["devices"])))
    if job.get("started_at") is not None:
        rows.append(("Started", relative(job["started_at"], now)))
    if job.get("finished_at") is not None:
        rows.append(("Ended", _ended(job, now)))
    attempts = job.get("attempts") or ()
    if len(attempts) > 1:  # one attempt is what the lines above say
        for i, a in enumerate(attempts):
            rows.append(("Attempts" if i == 0 else "", _attempt_line(a, host)))
    if job.get("reason"):
        rows.append(("Why", one_line(str(job["reason"]))))
    return rows


def _how_it_ended(doc: Mapping[str, Any]) -> str:
    if doc.get("signal"):
        return f"signal {doc['signal']}"
    if doc.get("exit_code") is not None:
        return f"exit code {doc['exit_code']}"
    return str(doc.get("cause") or "")


def _ended(job: Mapping[str, Any], now: float) -> str:
    """``3m ago, exit code 0, after 2m``: when, how and how long the last attempt ran."""
    ended, started = job["finished_at"], job.get("started_at")
    parts = [relative(ended, now), _how_it_ended(job)]
    if started is not None:
        parts.append(f"after {span(float(ended) - float(started))}")
    return ", ".join(p for p in parts if p)


def _attempt_line(a: Mapping[str, Any], host: Callable[[Any], str]) -> str:
    """``2  h100-01  exit code 0  2m``: one attempt, where it ran and how it ended."""
    started, ended = a.get("started_at"), a.get("finished_at")
    ran = span(float(ended) - float(started)) if started is not None and ended else "-"
    return f"{a.get('attempt', '?')}  {host(a.get('node'))}  {_how_it_ended(a) or '-'}  {ran}"


def job_hints(events: Sequence[Mapping[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """The bottleneck hints told of ``job_id`` (events of kind ``hint``), the newest of each
    rule on each device, oldest first: ``{at, node, message}``."""
    latest: dict[str, Mapping[str, Any]] = {}
    for event in events:
        if event.get("kind") == "hint" and event.get("job_id") == job_id:
            latest[str(event.get("message", "")).split(": ", 1)[0]] = event
    ordered = sorted(latest.values(), key=lambda e: float(e.get("at") or 0.0))
    return [{k: e.get(k) for k in ("at", "node", "message")} for e in ordered]


def jobs_table(
    jobs: Sequence[Mapping[str, Any]], names: Mapping[str, str], now: float, width: int
) -> Table:
    """One row per job, ``width`` columns wide; ``names`` maps node ids to host names."""
    return fitted_table(JOB_COLUMNS, [job_row(job, names, now) for job in jobs], width)


def is_stale(node: Mapping[str, Any]) -> bool:
    """The node's readings are not current: it is not alive, or its telemetry is old."""
    age_s, every_s = node.get("telemetry_age_s"), node.get("telemetry_every_s")
    return node.get("state") != "alive" or telemetry_stale(
        None if age_s is None else float(age_s), None if every_s is None else float(every_s)
    )


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
        (_shared(node) if alive else "") + _gpu_names(devices) + _runtime(node),
    ]


def _runtime(node: Mapping[str, Any]) -> str:
    """``; podman``: the container runtime its agent runs jobs with an image through (from its
    inventory), after the GPUs, which a narrow column must show first; nothing where it has
    none."""
    runtime = node.get("container_runtime")
    return f"; {runtime}" if isinstance(runtime, str) and runtime else ""


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
            cells.append(fit_cell(text, column_width).ljust(column_width))
            used += column_width + 2
        else:
            cells.append(fit_cell(text, max(8, width - used)))
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
