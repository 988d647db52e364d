"""What ran here, for accounting: one row per attempt this node's runner started, kept in
``usage.sqlite`` beside the agent's store for :data:`KEEP_S` (400 days).

No master adds anything up. Each node keeps the rows of the attempts that ran on it: the runner
opens a row when an attempt's process starts (the devices, their model, the submitter and their
name and team in the policy held then) and closes it with the very start and end times it
reports to the job's owner, so the rows add up, to the second, to the job records' attempts.
``shoal usage`` asks every agent for its rows and sums them, deduplicated by
``(job_id, attempt, node)``. A node lost with its disk takes its rows with it.

Energy comes from measured power: every telemetry refresh adds, for each open row, the power its
devices draw times the time since the last refresh (a device shared by several jobs is divided
among them). A row whose devices report no power has none; an attempt cut by an agent restart
keeps the energy counted up to the last write (every :data:`ENERGY_WRITE_S`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.wire.usage import MAX_USAGE_ROWS, UsageRow

log = logging.getLogger(__name__)

KEEP_S: Final = 400 * 86_400.0
ENERGY_WRITE_S: Final = 60.0
MAX_STEP_S: Final = 30.0
"""A gap between two refreshes longer than this (a stalled host) counts this long, no more."""

_SCHEMA = """CREATE TABLE IF NOT EXISTS usage (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    person TEXT,
    name TEXT,
    team TEXT,
    model TEXT NOT NULL,
    gpus REAL NOT NULL,
    devices TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    energy_j REAL,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX IF NOT EXISTS usage_by_finish ON usage (finished_at)"""


@dataclass(slots=True)
class _Open:
    devices: tuple[str, ...]
    energy_j: float | None = None
    last_at: float | None = None
    written_at: float = 0.0
    watts: float | None = None
    """The power drawn at the last sample, counted on to the attempt's end."""


class UsageBook:
    """The rows of this node; ``who`` names a submitter (their name and team, or ``None``s)."""

    def __init__(
        self,
        path: Path,
        node_id: str,
        who: Callable[[str | None], tuple[str | None, str | None]] = lambda p: (None, None),
    ) -> None:
        self.node_id = node_id
        self._who = who
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._open: dict[tuple[str, int], _Open] = {}
        self.write_failures = 0
        for job_id, attempt, devices, energy in self._db.execute(
            "SELECT job_id, attempt, devices, energy_j FROM usage WHERE finished_at IS NULL"
        ):
            self._open[(job_id, attempt)] = _Open(tuple(filter(None, devices.split(","))), energy)

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        try:
            with self._lock:
                self._db.execute(sql, args)
        except sqlite3.Error as exc:  # accounting never stops a job: logged, counted
            self.write_failures += 1
            log.warning("usage not kept: %s", exc)

    def opened(
        self,
        job_id: str,
        attempt: int,
        person: str | None,
        model: str,
        gpus: float,
        devices: tuple[str, ...],
        started_at: float,
    ) -> None:
        """An attempt's process started here."""
        name, team = self._who(person)
        self._open[(job_id, attempt)] = _Open(devices, last_at=started_at)
        self._write(
            "INSERT OR REPLACE INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
            (job_id, attempt, person, name, team, model, gpus, ",".join(devices), started_at),
        )

    def sample(self, now: float, power_mw: Mapping[str, int | None]) -> None:
        """Add the energy the open rows' devices drew since the last sample."""
        sharing: dict[str, int] = {}
        for run in self._open.values():
            for key in run.devices:
                sharing[key] = sharing.get(key, 0) + 1
        for (job_id, attempt), run in self._open.items():
            step_s = 0.0 if run.last_at is None else min(MAX_STEP_S, max(0.0, now - run.last_at))
            run.last_at = now if run.last_at is None else max(now, run.last_at)
            measured = [power_mw.get(k) for k in run.devices]
            if not measured or any(p is None for p in measured):
                continue
            watts = sum(
                (p or 0) / 1000.0 / sharing[k] for p, k in zip(measured, run.devices, strict=True)
            )
            run.watts = watts
            run.energy_j = (run.energy_j or 0.0) + watts * step_s
            if now - run.written_at >= ENERGY_WRITE_S:
                run.written_at = now
                self._write(
                    "UPDATE usage SET energy_j = ? WHERE job_id = ? AND attempt = ?",
                    (run.energy_j, job_id, attempt),
                )

    def closed(self, job_id: str, attempt: int, started_at: float, finished_at: float) -> None:
        """The attempt ended: its times as reported to its owner. An attempt never opened here
        (stopped as it started, so never offered as started) is not counted."""
        run = self._open.pop((job_id, attempt), None)
        if run is None:
            return
        if run.watts is not None and run.last_at is not None:  # from the last sample to the end
            step_s = min(MAX_STEP_S, max(0.0, finished_at - run.last_at))
            run.energy_j = (run.energy_j or 0.0) + run.watts * step_s
        self._write(
            "UPDATE usage SET started_at = ?, finished_at = ?, energy_j = ? "
            "WHERE job_id = ? AND attempt = ?",
            (started_at, finished_at, run.energy_j, job_id, attempt),
        )

    def rows(self, since_s: float) -> tuple[tuple[UsageRow, ...], bool]:
        """Rows still open or ended at or after ``since_s``, oldest first (at most
        :data:`MAX_USAGE_ROWS`, the newest kept); and whether some were left out."""
        with self._lock:
            found = self._db.execute(
                "SELECT job_id, attempt, person, name, team, model, gpus, started_at, "
                "finished_at, energy_j FROM usage WHERE finished_at IS NULL OR finished_at >= ? "
                "ORDER BY started_at DESC LIMIT ?",
                (since_s, MAX_USAGE_ROWS + 1),
            ).fetchall()
        rows = [
            UsageRow(r[0], r[1], self.node_id, r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])
            for r in found[:MAX_USAGE_ROWS]
        ]
        live = {k: r.energy_j for k, r in self._open.items()}
        rows = [
            r._replace(energy_j=live[(r.job_id, r.attempt)])
            if (r.job_id, r.attempt) in live and r.finished_at is None
            else r
            for r in rows
        ]
        return tuple(reversed(rows)), len(found) > MAX_USAGE_ROWS

    def purge(self, now: float) -> None:
        self._write("DELETE FROM usage WHERE finished_at < ?", (now - KEEP_S,))

    def close(self) -> None:
        for (job_id, attempt), run in self._open.items():
            if run.energy_j is not None:
                self._write(
                    "UPDATE usage SET energy_j = ? WHERE job_id = ? AND attempt = ?",
                    (run.energy_j, job_id, attempt),
                )
        with self._lock:
            self._db.close()
