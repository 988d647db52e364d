"""What the chaos benchmark's jobs did, from their own ledger: runs, overlaps, checkpoint order.

The jobs (``bench/chaosjob.py``) append ``start``/``step``/``end`` lines to one ledger; the
benchmark adds, for each process, the last time it saw the pid alive (:meth:`Ledger.seen`). A
*run* is one process of one attempt. Sans-I/O apart from :meth:`Ledger.read_new`: the checks
are pure functions of the runs, so they are tested on ledgers written by hand.

- Two runs of one job (of one rank, for a gang) ran *at once* when one started (its own
  ``start`` line, written by the process itself) before the other was last known alive: its
  last ledger line, or the last time the benchmark saw its pid alive. Both are facts observed
  while both lived, so an overlap counted is certain; one shorter than the benchmark's pid poll
  may be missed.
- A checkpoint is *resumed out of order* when a run resumes from a step lower than a run of an
  earlier attempt resumed from (the owner handed out an older copy than one it had handed out
  before), or lower than a step a run of a later attempt had already written before it started
  (an older attempt started after a newer one); and when a run told to resume (``SHOAL_RESUME=1``)
  found no whole checkpoint.
- A job *ran again after it succeeded* when a run of it started after one had written its last
  step and ``end`` (at-least-once allows a rerun of an attempt cut short, never of a finished one).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    """One process of one attempt of one job, as the ledger and the pid watch tell it."""

    job: str
    attempt: int
    pid: int
    start_t: float
    rank: int = 0
    """Its member's rank in a gang (0 for a job on one node)."""
    world: int = 1
    """How many members its attempt has (a gang's ``WORLD_SIZE``; 1 for a job on one node)."""
    cwd: str = ""
    resumed_from: int | None = None
    last_t: float = 0.0
    """Its last ledger line."""
    end_t: float | None = None
    end_how: str | None = None
    steps: list[tuple[float, int]] = field(default_factory=list)
    """(time, step) of each checkpoint it wrote."""
    seen_alive_t: float | None = None
    gone_t: float | None = None
    """When the benchmark first saw the pid gone (None: not seen gone, or it wrote ``end``)."""

    @property
    def alive_until(self) -> float:
        """The last moment it is known to have been alive."""
        return max(self.last_t, self.seen_alive_t or 0.0)

    @property
    def finished(self) -> bool:
        return self.end_how == "done"

    @property
    def ended(self) -> bool:
        return self.end_t is not None or self.gone_t is not None


@dataclass
class Ledger:
    path: Path
    runs: dict[tuple[str, int, int], Run] = field(default_factory=dict)
    malformed: int = 0
    _offset: int = 0
    _partial: bytes = b""

    def read_new(self) -> list[Run]:
        """Apply the lines appended since the last read; the runs that started in them."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        started = []
        for raw in lines:
            try:
                doc = json.loads(raw)
                run = self.apply(doc)
            except (ValueError, KeyError, TypeError):
                self.malformed += 1
                continue
            if run is not None:
                started.append(run)
        return started

    def apply(self, doc: dict[str, Any]) -> Run | None:
        key = (str(doc["job"]), int(doc["attempt"]), int(doc["pid"]))
        t = float(doc["t"])
        kind = doc["kind"]
        run = self.runs.get(key)
        started = None
        if run is None:
            run = self.runs[key] = Run(
                job=key[0], attempt=key[1], pid=key[2], start_t=t, rank=int(doc.get("rank", 0))
            )
            started = run
        run.last_t = max(run.last_t, t)
        if kind == "start":
            run.start_t = t
            run.cwd = str(doc.get("cwd", ""))
            run.world = int(doc.get("world", 1))
            resumed = doc.get("resumed_from")
            run.resumed_from = None if resumed is None else int(resumed)
        elif kind == "step":
            run.steps.append((t, int(doc["step"])))
        elif kind == "end":
            run.end_t, run.end_how = t, str(doc.get("how"))
        return started

    def live(self) -> list[Run]:
        """Runs with no end seen yet."""
        return [r for r in self.runs.values() if not r.ended]

    def seen(self, run: Run, alive: bool, now: float) -> None:
        """The benchmark looked at the run's pid at ``now``."""
        if alive:
            run.seen_alive_t = now
        elif run.gone_t is None and run.end_t is None:
            run.gone_t = now

    def by_job(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = {}
        for run in sorted(self.runs.values(), key=lambda r: (r.start_t, r.attempt)):
            out.setdefault(run.job, []).append(run)
        return out


@dataclass(frozen=True)
class Overlap:
    job: str
    first: tuple[int, int]
    """(attempt, pid) of the run that started first."""
    second: tuple[int, int]
    overlap_s: float
    second_start_t: float


def overlaps(runs: Iterable[Run]) -> list[Overlap]:
    """Pairs of runs of one job known to have been alive at the same moment."""
    ordered = sorted(runs, key=lambda r: r.start_t)
    found = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b.rank == a.rank and b.start_t < a.alive_until:  # a gang's members run at once
                b_until = b.alive_until if b.ended else a.alive_until
                found.append(
                    Overlap(
                        a.job,
                        (a.attempt, a.pid),
                        (b.attempt, b.pid),
                        round(min(a.alive_until, b_until) - b.start_t, 3),
                        b.start_t,
                    )
                )
    return found


@dataclass(frozen=True)
class Disorder:
    """A resume of a job's checkpoint that went back: by the run that resumed, when it started."""

    start_t: float
    line: str


def checkpoint_disorders(runs: Iterable[Run]) -> list[Disorder]:
    """Each resume of a job's checkpoint that went back (see the module doc)."""
    ordered = sorted(runs, key=lambda r: r.start_t)
    found = []
    for r in ordered:
        if r.resumed_from is None:
            continue
        if r.resumed_from < 0:
            line = f"{r.job} attempt {r.attempt}: told to resume, found no checkpoint"
            found.append(Disorder(r.start_t, line))
            continue
        for e in ordered:
            if e.attempt < r.attempt and (e.resumed_from or 0) > r.resumed_from:
                line = (
                    f"{r.job} attempt {r.attempt} resumed from step {r.resumed_from}, below "
                    f"attempt {e.attempt}'s resume point {e.resumed_from}"
                )
                found.append(Disorder(r.start_t, line))
            if e.attempt > r.attempt:
                written = [s for t, s in e.steps if t < r.start_t]
                if written and max(written) > r.resumed_from:
                    line = (
                        f"{r.job} attempt {r.attempt} resumed from step {r.resumed_from} after "
                        f"the later attempt {e.attempt} had written step {max(written)}"
                    )
                    found.append(Disorder(r.start_t, line))
    return found


@dataclass(frozen=True)
class Rerun:
    job: str
    attempt: int
    start_t: float
    finished_attempt: int
    finished_t: float

    @property
    def line(self) -> str:
        return (
            f"{self.job} attempt {self.attempt} started {self.start_t - self.finished_t:.1f} s "
            f"after attempt {self.finished_attempt} finished"
        )


def finished(runs: Iterable[Run]) -> tuple[int, float] | None:
    """The first attempt every member of which wrote its last step (a gang's, all its ranks),
    and when its last member did; None when none did."""
    done: dict[int, dict[int, float]] = {}
    world: dict[int, int] = {}
    for r in runs:
        world[r.attempt] = max(world.get(r.attempt, 1), r.world)
        if r.finished and r.end_t is not None:
            done.setdefault(r.attempt, {})[r.rank] = r.end_t
    whole = [
        (max(ends.values()), attempt)
        for attempt, ends in done.items()
        if set(ends) >= set(range(world[attempt]))
    ]
    if not whole:
        return None
    end_t, attempt = min(whole)
    return attempt, end_t


def reruns_after_success(runs: Iterable[Run]) -> list[Rerun]:
    """Each run of another attempt that started after an attempt of the job had finished."""
    runs = list(runs)
    first = finished(runs)
    if first is None:
        return []
    attempt, end_t = first
    return [
        Rerun(r.job, r.attempt, r.start_t, attempt, end_t)
        for r in runs
        if r.start_t > end_t and r.attempt != attempt
    ]
