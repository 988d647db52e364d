"""The fleet's GPU history, sans I/O: utilization by vendor and by model, and the GPU-hours left
idle while jobs waited, from every node's ``gpu.util_pct`` history, the usage rows (who held
which GPUs when) and the job records.

Nothing gossips history: each node answers for its own GPUs (``GET /v1/history``), each runner
for the attempts it ran (``GET /v1/usage``). :mod:`agent.operator.fleet_read` asks them and hands
the answers here on one grid of time steps (:class:`Grid`).

What is counted, step by step (a step is ``step_s`` long):

- **reporting**: a GPU whose node's history has a sample of its ``gpu.util_pct`` in the step. A
  node that did not answer, or a GPU with no sample (its agent down), is not counted at all:
  shares are of the GPUs that reported, never of an assumed fleet.
- **busy**: the mean of the reporting GPUs' utilization (the step's average), as a share.
- **allocated**: GPUs held by attempts (usage rows; a row covering part of a step counts for that
  part; a share of a GPU counts its fraction), per node and model, capped at that node's
  reporting GPUs of the model, over the reporting GPUs.
- **free** on a node, for a model: its reporting GPUs of the model less those allocated.
- **idle while jobs waited**, for a model: the free GPUs of that model (every node's), counted
  for the part of the step during which at least one job waited that could have used them: the
  job accepts the model (its per-GPU constraints, judged by the scheduling policy's own device
  filters) and at least ``gpus_per_node`` whole GPUs of the model stood free on each of
  ``nodes`` nodes (one for a single-node job). A job waits from its submission to its first
  attempt's start, and from an attempt's end to the next one's start (a requeue). Within a
  step this is exact, cut at every attempt's and wait's start and end.

Not counted as reasons: a free GPU on a cordoned or draining node, a team over its quota, a
dataset still staging and the interconnect a job asks for all count the GPU as free, since
history keeps no drain state or quota over time. The figure is the capacity that stood idle
while work that fits it waited, the number to look into, not a proof of a scheduler fault.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

Split = Literal["vendor", "model"]
_EPS: Final = 1e-9


@dataclass(frozen=True, slots=True)
class Grid:
    """``steps`` steps of ``step_s`` from ``from_s`` (aligned down to ``step_s``, as a node's
    ``GET /v1/history`` aligns its points)."""

    from_s: int
    step_s: int
    steps: int

    @classmethod
    def over(cls, from_s: int, to_s: int, step_s: int) -> Grid:
        if step_s < 1 or to_s <= from_s:
            raise ValueError(f"a grid needs step_s >= 1 and from < to, not {from_s}..{to_s}")
        first = from_s // step_s * step_s
        return cls(first, step_s, -(-(to_s - first) // step_s))

    @property
    def to_s(self) -> int:
        return self.from_s + self.steps * self.step_s

    def start(self, i: int) -> int:
        return self.from_s + i * self.step_s

    def covered(self, start_s: float, end_s: float | None) -> list[tuple[int, float]]:
        """The steps ``[start_s, end_s)`` overlaps (``None``: on past the grid's end), each with
        the seconds of it covered."""
        end = self.to_s if end_s is None else min(end_s, self.to_s)
        start = max(start_s, self.from_s)
        if end <= start:
            return []
        first = int((start - self.from_s) // self.step_s)
        last = min(self.steps - 1, math.ceil((end - self.from_s) / self.step_s) - 1)
        out = []
        for i in range(first, last + 1):
            t0 = self.start(i)
            part = min(end, t0 + self.step_s) - max(start, t0)
            if part > 0:
                out.append((i, part))
        return out


@dataclass(frozen=True, slots=True)
class GpuTrack:
    """One GPU's utilization on the grid: one value (percent) per step, ``None`` where its node
    kept no sample."""

    node: str
    device: str
    vendor: str
    model: str
    util_pct: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class Held:
    """GPUs an attempt held on one node (a usage row): ``gpus`` of ``model`` over
    ``[start_s, end_s)`` (``None``: still held)."""

    node: str
    model: str
    gpus: float
    start_s: float
    end_s: float | None


@dataclass(frozen=True, slots=True)
class Wait:
    """A job waiting for GPUs over ``[start_s, end_s)`` (``None``: still waiting); ``models``:
    the GPU models its constraints accept."""

    job_id: str
    gpus_per_node: int
    nodes: int
    models: frozenset[str]
    start_s: float
    end_s: float | None


@dataclass(frozen=True, slots=True)
class GroupLine:
    """One vendor's or model's GPUs over the grid."""

    name: str
    gpus: tuple[int, ...]
    """GPUs reporting in each step."""
    busy: tuple[float | None, ...]
    """Mean utilization of those GPUs, 0..1 (``None``: none reported)."""
    allocated: tuple[float | None, ...]
    """Share of those GPUs held by attempts, 0..1."""

    @property
    def busy_avg(self) -> float | None:
        return _weighted(self.busy, self.gpus)

    @property
    def allocated_avg(self) -> float | None:
        return _weighted(self.allocated, self.gpus)

    @property
    def gpus_last(self) -> int:
        return next((n for n in reversed(self.gpus) if n), 0)


def _weighted(values: Sequence[float | None], weights: Sequence[int]) -> float | None:
    total = sum(w for v, w in zip(values, weights, strict=True) if v is not None)
    if not total:
        return None
    return sum(v * w for v, w in zip(values, weights, strict=True) if v is not None) / total


@dataclass(frozen=True, slots=True)
class IdleLine:
    """GPU-seconds of one model left idle while a job that could use them waited, per step."""

    model: str
    idle_gpu_s: tuple[float, ...]
    free_gpu_s: float
    """Every free GPU-second of the model over the grid, waiting or not (the context)."""

    @property
    def total_gpu_s(self) -> float:
        return sum(self.idle_gpu_s)


@dataclass(frozen=True, slots=True)
class IdleWhileWaiting:
    lines: tuple[IdleLine, ...]
    waits: int
    """Jobs' waits that overlap the grid (each job's each wait)."""

    @property
    def total_gpu_s(self) -> float:
        return sum(line.total_gpu_s for line in self.lines)

    @property
    def free_gpu_s(self) -> float:
        return sum(line.free_gpu_s for line in self.lines)


# -- the counting --------------------------------------------------------------------------------

_Cell = tuple[str, str]
"""(node, model)"""


def _present(grid: Grid, tracks: Iterable[GpuTrack]) -> dict[_Cell, list[int]]:
    out: dict[_Cell, list[int]] = {}
    for t in tracks:
        if len(t.util_pct) != grid.steps:
            raise ValueError(f"{t.node[:8]}/{t.device}: {len(t.util_pct)} points, not {grid.steps}")
        row = out.setdefault((t.node, t.model), [0] * grid.steps)
        for i, v in enumerate(t.util_pct):
            if v is not None:
                row[i] += 1
    return out


def _allocated(
    grid: Grid, held: Iterable[Held], present: Mapping[_Cell, list[int]]
) -> dict[_Cell, list[float]]:
    """GPUs held per (node, model) in each step (time-weighted), capped at those reporting."""
    out: dict[_Cell, list[float]] = {}
    for h in held:
        cell = (h.node, h.model)
        if cell not in present or h.gpus <= 0:
            continue  # a node that did not answer, or a model none of its GPUs reported
        row = out.setdefault(cell, [0.0] * grid.steps)
        for i, part_s in grid.covered(h.start_s, h.end_s):
            row[i] += h.gpus * part_s / grid.step_s
    for cell, row in out.items():
        have = present[cell]
        out[cell] = [min(a, float(n)) for a, n in zip(row, have, strict=True)]
    return out


def utilization(
    grid: Grid, tracks: Sequence[GpuTrack], held: Sequence[Held], split: Split
) -> tuple[GroupLine, ...]:
    """Busy and allocated shares of the reporting GPUs, one line per vendor or per model."""
    present = _present(grid, tracks)
    allocated = _allocated(grid, held, present)
    group_of = {(t.node, t.model): t.vendor if split == "vendor" else t.model for t in tracks}
    names = sorted(set(group_of.values()))
    lines = []
    for name in names:
        counts = [0] * grid.steps
        sums = [0.0] * grid.steps
        held_gpus = [0.0] * grid.steps
        for t in tracks:
            if group_of[(t.node, t.model)] != name:
                continue
            for i, v in enumerate(t.util_pct):
                if v is not None:
                    counts[i] += 1
                    sums[i] += min(100.0, max(0.0, v)) / 100
        for cell, row in allocated.items():
            if group_of.get(cell) == name:
                for i, a in enumerate(row):
                    held_gpus[i] += a
        lines.append(
            GroupLine(
                name,
                tuple(counts),
                tuple(s / n if n else None for s, n in zip(sums, counts, strict=True)),
                tuple(a / n if n else None for a, n in zip(held_gpus, counts, strict=True)),
            )
        )
    return tuple(lines)


def _end(end_s: float | None) -> float:
    return math.inf if end_s is None else end_s


def _during(span: Held | Wait, t: float) -> bool:
    return span.start_s <= t < _end(span.end_s)


def _idle_in_step(
    t0: float,
    t1: float,
    present: Mapping[_Cell, int],
    rows: Mapping[_Cell, Sequence[Held]],
    waits: Sequence[Wait],
) -> float:
    """The free GPU-seconds of one model in ``[t0, t1)`` while a job that fits them waited,
    exactly: the step is cut wherever an attempt or a wait starts or ends, so a GPU held for
    half the step is free for the other half (not half free for all of it)."""
    spans: list[Held | Wait] = [*waits]
    for held in rows.values():
        spans += held
    cuts = {t0, t1} | {c for x in spans for c in (x.start_s, _end(x.end_s)) if t0 < c < t1}
    idle = 0.0
    for a, b in itertools.pairwise(sorted(cuts)):
        mid = (a + b) / 2
        free = {
            c: max(0.0, n - sum(h.gpus for h in rows.get(c, ()) if _during(h, mid)))
            for c, n in present.items()
        }
        total = sum(free.values())
        if total <= _EPS:
            continue
        for w in waits:
            if _during(w, mid):
                roomy = sum(1 for f in free.values() if f + _EPS >= max(1, w.gpus_per_node))
                if roomy >= max(1, w.nodes):
                    idle += total * (b - a)
                    break
    return idle


def idle_while_waiting(
    grid: Grid, tracks: Sequence[GpuTrack], held: Sequence[Held], waits: Sequence[Wait]
) -> IdleWhileWaiting:
    """Per model, the free GPU-seconds of each step counted for the part of the step during
    which a job that could have used them waited (see the module's docstring)."""
    present = _present(grid, tracks)
    allocated = _allocated(grid, held, present)
    models = sorted({m for _, m in present})
    in_grid = [w for w in waits if grid.covered(w.start_s, w.end_s)]
    rows: dict[_Cell, list[Held]] = {}
    for h in held:
        if (h.node, h.model) in present and h.gpus > 0:
            rows.setdefault((h.node, h.model), []).append(h)
    lines = []
    for model in models:
        cells = [c for c in present if c[1] == model]
        mine = [w for w in in_grid if model in w.models]
        idle = [0.0] * grid.steps
        free_total = 0.0
        for i in range(grid.steps):
            have = {c: present[c][i] for c in cells if present[c][i]}
            held_now = sum(allocated[c][i] for c in have if c in allocated)
            free_total += max(0.0, sum(have.values()) - held_now) * grid.step_s
            t0, t1 = grid.start(i), grid.start(i) + grid.step_s
            waiting = [w for w in mine if w.start_s < t1 and _end(w.end_s) > t0]
            if not have or not waiting:
                continue
            overlapping = {
                c: [h for h in rows.get(c, ()) if h.start_s < t1 and _end(h.end_s) > t0]
                for c in have
            }
            idle[i] = _idle_in_step(t0, t1, have, overlapping, waiting)
        lines.append(IdleLine(model, tuple(idle), free_total))
    return IdleWhileWaiting(tuple(lines), len(in_grid))
