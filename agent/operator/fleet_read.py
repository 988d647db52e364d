"""The fleet's history, read: every node's ``gpu.util_pct`` history, the usage rows and the job
records over one window, counted by :mod:`agent.operator.fleet_history` (the TUI's fleet view
and ``shoal history --fleet`` read through here).

Reading is bounded: at most :data:`IN_FLIGHT` nodes are asked at once, each given
:data:`NODE_TIMEOUT_S`; a node that does not answer in time, or answers an error, is listed as
missing and its GPUs are left out of the shares (never counted as idle).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Final, Protocol

from agent.operator.client import ApiClient, ApiError
from agent.operator.fleet_history import (
    GpuTrack,
    Grid,
    GroupLine,
    IdleWhileWaiting,
    idle_while_waiting,
    utilization,
)
from agent.operator.fleet_inputs import UTIL_SERIES, FleetGpus, held, tracks, waits
from agent.wire.codec import WireError
from agent.wire.history import HistoryDoc, HistoryQuery
from agent.wire.usage import UsageRow


class FleetSource(Protocol):
    """The reads the fleet's history needs (the TUI's mesh source is one)."""

    def now(self) -> float: ...

    async def nodes(self) -> list[dict[str, Any]]: ...

    async def jobs(self) -> list[dict[str, Any]]: ...

    async def history(self, query: HistoryQuery, address: str) -> HistoryDoc:
        """``GET /v1/history`` of the node whose agent listens at ``address``."""
        ...

    async def usage(self, since: float) -> tuple[list[UsageRow], list[str]]:
        """Every live agent's usage rows since ``since``, and a line for each that did not
        answer."""
        ...


async def ask_history(client: ApiClient, query: HistoryQuery, address: str) -> HistoryDoc:
    """``GET /v1/history`` asked of the node itself (each node keeps its own history), as the
    operator ``client`` was made with."""
    if address == client.address:
        return HistoryDoc.from_wire(await client.get("/v1/history", query.to_params()))
    async with ApiClient(client.identity, address) as there:
        return HistoryDoc.from_wire(await there.get("/v1/history", query.to_params()))


FLEET_POINTS: Final = 120
"""Steps over a window (the widest chart a terminal shows)."""
IN_FLIGHT: Final = 4
NODE_TIMEOUT_S: Final = 10.0
LIVE: Final = ("alive", "suspect")


@dataclass(frozen=True, slots=True)
class FleetReport:
    """The fleet over one window, as the view draws it."""

    span_s: int
    grid: Grid
    by_vendor: tuple[GroupLine, ...]
    by_model: tuple[GroupLine, ...]
    idle: IdleWhileWaiting
    nodes_read: int
    missing: tuple[str, ...]
    """One line for each node (or read) that did not answer: ``host: why``."""
    unreadable_jobs: int = 0


def _name(node: dict[str, Any]) -> str:
    host = node.get("host") or {}
    return str(host.get("hostname") or str(node.get("node_id", "?"))[:8])


async def read_fleet(
    source: FleetSource,
    span_s: int,
    *,
    in_flight: int = IN_FLIGHT,
    timeout_s: float = NODE_TIMEOUT_S,
) -> FleetReport:
    """Ask every live agent with GPUs for the last ``span_s`` of its GPUs' utilization (a few
    at a time), and the mesh for its usage rows and jobs; count what answered."""
    now = source.now()
    nodes, jobs = await asyncio.gather(source.nodes(), source.jobs())
    grid = Grid.over(int(now) - span_s, math.ceil(now) + 1, max(1, span_s // FLEET_POINTS))
    gpus = FleetGpus.from_nodes(nodes)
    with_gpus = {node for node, _ in gpus.statics}
    asked = [n for n in nodes if n.get("node_id") in with_gpus]
    missing = [f"{_name(n)}: {n.get('state')}" for n in asked if n.get("state") not in LIVE]
    asked = [n for n in asked if n.get("state") in LIVE]
    gate = asyncio.Semaphore(max(1, in_flight))

    async def one(node: dict[str, Any]) -> HistoryDoc:
        query = HistoryQuery(
            (UTIL_SERIES,), str(node["node_id"]), None, None, grid.from_s, grid.to_s, grid.step_s
        )
        async with gate:
            return await asyncio.wait_for(
                source.history(query, str(node.get("addr") or "")), timeout_s
            )

    answers = await asyncio.gather(*(one(n) for n in asked), return_exceptions=True)
    found: list[GpuTrack] = []
    for node, answer in zip(asked, answers, strict=True):
        if isinstance(answer, HistoryDoc):
            found += tracks(grid, answer, gpus)
        elif isinstance(answer, TimeoutError):
            missing.append(f"{_name(node)}: no answer in {timeout_s:g} s")
        elif isinstance(answer, ApiError | WireError | OSError):
            missing.append(f"{_name(node)}: {answer}")
        else:
            raise answer
    try:
        rows, unanswered = await asyncio.wait_for(source.usage(grid.from_s), timeout_s)
        missing += [f"usage rows of {line}" for line in unanswered]
    except (TimeoutError, ApiError, WireError, OSError) as exc:
        rows = []  # every GPU then counts as free: said, not hidden
        missing.append(f"usage rows: {exc or f'no answer in {timeout_s:g} s'}")
    read = len(asked) - sum(1 for a in answers if not isinstance(a, HistoryDoc))
    # counted off the event loop: a large fleet's week is a lot of steps and rows
    return await asyncio.to_thread(
        _count, span_s, grid, found, rows, jobs, gpus, read, tuple(missing)
    )


def _count(
    span_s: int,
    grid: Grid,
    found: list[GpuTrack],
    rows: list[UsageRow],
    jobs: list[dict[str, Any]],
    gpus: FleetGpus,
    nodes_read: int,
    missing: tuple[str, ...],
) -> FleetReport:
    holding = held(rows)
    waited = waits(jobs, gpus)
    return FleetReport(
        span_s=span_s,
        grid=grid,
        by_vendor=utilization(grid, found, holding, "vendor"),
        by_model=utilization(grid, found, holding, "model"),
        idle=idle_while_waiting(grid, found, holding, waited.waits),
        nodes_read=nodes_read,
        missing=missing,
        unreadable_jobs=waited.unreadable,
    )


def report_json(report: FleetReport) -> dict[str, Any]:
    """The report as ``shoal history --fleet --json`` prints it: shares 0..1 (``null`` where no
    GPU reported), GPU-seconds."""

    def group(g: GroupLine) -> dict[str, Any]:
        return {
            "name": g.name,
            "gpus": list(g.gpus),
            "busy": list(g.busy),
            "allocated": list(g.allocated),
            "busy_avg": g.busy_avg,
            "allocated_avg": g.allocated_avg,
        }

    return {
        "from": report.grid.from_s,
        "to": report.grid.to_s,
        "step_s": report.grid.step_s,
        "by_vendor": [group(g) for g in report.by_vendor],
        "by_model": [group(g) for g in report.by_model],
        "idle_while_waiting": {
            "gpu_s": report.idle.total_gpu_s,
            "free_gpu_s": report.idle.free_gpu_s,
            "waits": report.idle.waits,
            "by_model": [
                {
                    "model": line.model,
                    "gpu_s": line.total_gpu_s,
                    "free_gpu_s": line.free_gpu_s,
                    "per_step_gpu_s": list(line.idle_gpu_s),
                }
                for line in report.idle.lines
            ],
        },
        "nodes_read": report.nodes_read,
        "missing": list(report.missing),
        "unreadable_jobs": report.unreadable_jobs,
    }
