"""What the simulated mesh holds besides its GPUs and jobs: the datasets on its hosts.

Deterministic in the host's index, as the rest of :mod:`tui.simmesh`: the same mesh gives the
same copies at every read, so screenshots and snapshot tests are stable.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple

from agent.wire.history import HistoryDoc
from agent.wire.place import HeldVersion
from agent.wire.usage import UsageRow

GB: Final[int] = 1024**3
DAY_S: Final[float] = 86400.0

_DATASETS: Final[tuple[tuple[str, int, float], ...]] = (
    ("imagenet", 150 * GB, 40 * DAY_S),
    ("imagenet", 148 * GB, 3 * DAY_S),
    ("c4-en", 806 * GB, 20 * DAY_S),
    ("wikitext-103", 515 * 1024**2, 90 * DAY_S),
    ("laion-aesth", 1900 * GB, 6 * 3600.0),
)
"""(name, size, age): two versions of imagenet, the newer one the training jobs read."""


def _digest(name: str, age_s: float) -> str:
    return hashlib.sha256(f"shoal-sim-data|{name}|{age_s}".encode()).hexdigest()


def held_versions(index: int, hosts: int, now: float) -> tuple[HeldVersion, ...]:
    """The dataset versions host ``index`` of ``hosts`` holds, whole or in part, at ``now``."""
    out: list[HeldVersion] = []
    for n, (name, size, age_s) in enumerate(_DATASETS):
        held: int | None = None
        if n == 0 and index == 0:
            held = size  # the old imagenet, on one host only
        elif n == 1 and index % 3 == 0:
            held = size  # the new one where the training jobs run
        elif n == 1 and index == 1:
            held = size * 2 // 5  # and a copy being staged
        elif n == 2 and index in (1, 2):
            held = size
        elif n == 3 and index < hosts - 1:
            held = size  # small: nearly everywhere
        elif n == 4 and index == 2:
            held = size * 7 // 10  # the newest and biggest: no whole copy yet
        if held is not None:
            created = round(now - age_s, 1)
            out.append(HeldVersion(name, _digest(name, age_s), size, held, created))
    return tuple(out)


TEAMS: Final[Mapping[str, str]] = {
    "alice": "vision",
    "bob": "vision",
    "carol": "language",
    "dmitri": "language",
    "erin": "platform",
}
_WATTS_PER_GPU: Final[float] = 320.0
HISTORY_DAYS: Final[int] = 7


class Attempt(NamedTuple):
    """One attempt of a simulated job, as its runner's usage ledger keeps it."""

    job_id: str
    attempt: int
    node: str
    user: str
    model: str
    gpus: int
    started_at: float
    finished_at: float | None


def _row(a: Attempt, now: float) -> UsageRow:
    end = a.finished_at if a.finished_at is not None else now
    measured = "apple" not in a.model.lower() and not a.model.startswith("M")
    energy = a.gpus * _WATTS_PER_GPU * max(0.0, end - a.started_at) if measured else None
    return UsageRow(
        job_id=a.job_id,
        attempt=a.attempt,
        node=a.node,
        person=hashlib.sha256(a.user.encode()).hexdigest()[:16],
        name=a.user,
        team=TEAMS.get(a.user),
        model=a.model,
        gpus=float(a.gpus),
        started_at=a.started_at,
        finished_at=a.finished_at,
        energy_j=None if energy is None else round(energy, 1),
    )


def usage_rows(
    attempts: Sequence[Attempt], hosts: Sequence[tuple[str, str, int]], now: float, since: float
) -> list[UsageRow]:
    """The usage rows of the mesh's jobs (``attempts``) and of a week of earlier work on
    ``hosts`` (``(node id, GPU model, GPUs)``), those that overlap ``[since, now]``."""
    past: list[Attempt] = []
    owners = tuple(TEAMS)
    for day in range(1, HISTORY_DAYS + 1):
        for i, (node, model, count) in enumerate(hosts):
            if count == 0 or (i + day) % 4 == 3:
                continue
            start = now - day * DAY_S + (i * 37 % 12) * 3600.0
            hours = 2 + (i * day) % 7
            user = owners[(i + day) % len(owners)]
            gpus = max(1, count // (1 + (i + day) % 3))
            job_id = hashlib.sha256(f"shoal-sim-past|{day}|{i}".encode()).hexdigest()[:32]
            past.append(Attempt(job_id, 1, node, user, model, gpus, start, start + hours * 3600.0))
    out = []
    for a in (*past, *attempts):
        end = a.finished_at if a.finished_at is not None else now
        if end >= since and a.started_at <= now:
            out.append(_row(a, now))
    return out


class RowsByNode:
    """Usage rows grouped by node, made again only when ``key`` changes: a fleet read asks
    every host's history at one moment, and each needs its host's rows."""

    def __init__(self) -> None:
        self.key: object = None
        self.rows: dict[str, list[UsageRow]] = {}

    def get(self, key: object, make: Callable[[], list[UsageRow]], node: str) -> list[UsageRow]:
        if key != self.key:
            self.rows = {}
            for row in make():
                self.rows.setdefault(row.node, []).append(row)
            self.key = key
        return self.rows.get(node, [])


IDLE_SCALE: Final[float] = 0.04
"""A GPU no attempt holds idles: its simulated utilization is scaled down to a few percent."""


def idle_when_free(doc: HistoryDoc, held: Sequence[UsageRow], keys: Sequence[str]) -> HistoryDoc:
    """``doc`` (one host's simulated history) with each GPU's ``gpu.util_pct`` brought down to
    idle while no attempt held it: the host's first ``n`` GPUs are taken as held while its
    usage rows hold ``n``, so the history agrees with the usage rows and the jobs."""
    order = {key: i for i, key in enumerate(keys)}
    series = []
    for s in doc.series:
        if s.name != "gpu.util_pct" or s.subject not in order:
            series.append(s)
            continue
        points = []
        for t, low, avg, high in s.points:
            mid = t + s.step_s / 2
            busy = sum(
                r.gpus
                for r in held
                if r.started_at <= mid < (r.finished_at if r.finished_at is not None else math.inf)
            )
            if order[s.subject] >= busy:
                low, avg, high = (_idle(low), _idle(avg), _idle(high))
            points.append((t, low, avg, high))
        series.append(s._replace(points=tuple(points)))
    return doc._replace(series=tuple(series))


def _idle(value: float | None) -> float | None:
    return None if value is None else round(value * IDLE_SCALE, 2)


def log_line(step: int) -> str:
    """Line ``step`` of a simulated training job's log: a falling loss, a steady throughput."""
    loss = 2.5 * math.exp(-step / 40.0) + 0.05 * math.sin(step)
    return f"step {step:5d}  loss {loss:.4f}  tok/s {9000 + (step * 37) % 700}"
