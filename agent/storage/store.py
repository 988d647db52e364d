"""The agent's durable memory: one SQLite file per node.

It holds the node's identity facts (node id, boot counter), the job records this node knows as
owner or replica, the processes it runs, and the results of finished attempts. A restarted agent
reads it back and calls ``reconcile`` to learn which recorded processes survived.

Durability: WAL journal with ``synchronous=FULL``. In WAL mode ``NORMAL`` survives a crash of the
agent but may lose the last commits on power loss; an acknowledged submission must survive its
host losing power (the promise is "durable on owner and one replica"), and the write rate (job
transitions, not telemetry) is low enough that an fsync per commit costs nothing worth saving.

Schema changes are numbered migrations recorded in ``PRAGMA user_version``; a file written by a
newer Shoal is refused rather than misread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from agent.job.jobspec import JobSpec
from agent.job.jobstate import TERMINAL_JOB_STATES, JobState
from agent.storage.sqlitefile import StoreError as StoreError
from agent.storage.sqlitefile import StoreFull as StoreFull
from agent.storage.sqlitefile import migrate, open_database, transaction

log = logging.getLogger("shoal.store")

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 0 -> 1
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE jobs (
            job_id TEXT PRIMARY KEY,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            owner TEXT NOT NULL,
            runner TEXT,
            submitted_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX jobs_by_owner ON jobs (owner, state)",
        """CREATE TABLE runs (
            job_id TEXT PRIMARY KEY,
            attempt INTEGER NOT NULL,
            pid INTEGER NOT NULL,
            pgid INTEGER,
            started_at REAL NOT NULL,
            log_path TEXT NOT NULL
        )""",
        """CREATE TABLE results (
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            exit_code INTEGER,
            signal TEXT,
            cause TEXT NOT NULL,
            started_at REAL NOT NULL,
            finished_at REAL NOT NULL,
            PRIMARY KEY (job_id, attempt)
        )""",
    ),
    # 1 -> 2: the owner's working facts of a job (devices, reason, exit code, times, version)
    ("ALTER TABLE jobs ADD COLUMN detail TEXT NOT NULL DEFAULT '{}'",),
    # 2 -> 3: the operator's sealed submission (the job's authority), and the operator commands
    # executed within the replay window (a restart must not forget them)
    (
        "ALTER TABLE jobs ADD COLUMN submission BLOB NOT NULL DEFAULT x''",
        """CREATE TABLE seen_commands (
            command_id TEXT PRIMARY KEY,
            issued_at REAL NOT NULL
        )""",
    ),
    # 3 -> 4: the jobs not ended, found without reading every job the store holds (the owner's
    # sweep asks for them every second); the ended ones and the attempts that ended before a
    # time, found the same way (what ``ended_jobs_disk_keep_s`` lets go)
    (
        "CREATE INDEX jobs_by_state ON jobs (state, updated_at)",
        "CREATE INDEX results_by_finish ON results (finished_at)",
    ),
)
"""``MIGRATIONS[n]`` takes a file from schema version ``n`` to ``n + 1``."""

SCHEMA_VERSION: Final = len(MIGRATIONS)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as its owner (or a replica of the owner) keeps it."""

    job_id: str
    spec: JobSpec
    state: JobState
    attempt: int
    """The current attempt number (0 before the first placement)."""
    owner: str
    """Node id of the owner."""
    runner: str | None
    """Node id running (or reserved for) the current attempt."""
    submitted_at: float
    updated_at: float
    detail: Mapping[str, Any] = field(default_factory=dict)
    """The owner's working facts, JSON-able (devices, reason, exit code, times, version)."""
    submission: bytes = b""
    """The operator's sealed ``submit`` command: what authorises every attempt of the job."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A process this node started for a job."""

    job_id: str
    attempt: int
    pid: int
    pgid: int | None
    started_at: float
    log_path: str


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """How one attempt that ran on this node ended."""

    job_id: str
    attempt: int
    exit_code: int | None
    signal: str | None
    cause: str
    """The executor's exit cause (``exit``, ``timeout``, ``cancel``...) or ``lost``."""
    started_at: float
    finished_at: float

    @property
    def ok(self) -> bool:
        return self.cause == "exit" and self.exit_code == 0


class Store:
    """A node's SQLite store. Safe to share between threads (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_database(path, "FULL")
        self._lock = threading.RLock()
        self.unreadable_jobs = 0
        """Job rows read that did not decode (left out of what was read, each time)."""
        self._migrate()

    @property
    def schema_version(self) -> int:
        row = self._db.execute("PRAGMA user_version").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One transaction; a full disk is :class:`StoreFull`, and leaves nothing half done."""
        return transaction(self._db, self._lock, self.path)

    def _migrate(self) -> None:
        with self._tx() as db:
            migrate(db, self.path, MIGRATIONS, "schema")

    # -- node identity ---------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def node_id(self) -> str | None:
        return self.get_meta("node_id")

    def set_node_id(self, node_id: str) -> None:
        """Record this node's id; refuses to change it once set (the key is this node's)."""
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'node_id'").fetchone()
            if row is not None and row[0] != node_id:
                raise StoreError(f"{self.path} belongs to node {row[0]}, not {node_id}")
            db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('node_id', ?)", (node_id,))

    def boot_count(self) -> int:
        """How many times the agent has started on this store (0 before the first)."""
        value = self.get_meta("boot_count")
        return 0 if value is None else int(value)

    def next_boot(self) -> int:
        """Count one more start of the agent and return the new count (1 on the first)."""
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'boot_count'").fetchone()
            count = (0 if row is None else int(row[0])) + 1
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('boot_count', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(count),),
            )
        return count

    # -- job records -----------------------------------------------------------------------------

    def put_job(self, record: JobRecord) -> None:
        """Insert or replace the record of a job."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO jobs (job_id, spec, state, attempt, owner, runner, "
                "submitted_at, updated_at, detail, submission) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.job_id,
                    json.dumps(record.spec.to_dict(), separators=(",", ":")),
                    record.state.value,
                    record.attempt,
                    record.owner,
                    record.runner,
                    record.submitted_at,
                    record.updated_at,
                    json.dumps(dict(record.detail), separators=(",", ":")),
                    record.submission,
                ),
            )

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,))
            found = row.fetchone()
        return None if found is None else self._readable(found)

    def jobs(
        self,
        *,
        owner: str | None = None,
        states: Iterable[JobState] | None = None,
        updated_since: float | None = None,
    ) -> list[JobRecord]:
        """Job records, oldest submission first, filtered by ``owner``, ``states`` and last
        write (wall time) if given."""
        query = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE 1 = 1"
        args: list[Any] = []
        if owner is not None:
            query += " AND owner = ?"
            args.append(owner)
        if states is not None:
            wanted = [JobState(s).value for s in states]
            query += f" AND state IN ({', '.join('?' for _ in wanted)})"
            args.extend(wanted)
        if updated_since is not None:
            query += " AND updated_at >= ?"
            args.append(updated_since)
        query += " ORDER BY submitted_at, job_id"
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [job for row in rows if (job := self._readable(row)) is not None]

    def _readable(self, row: tuple[Any, ...]) -> JobRecord | None:
        """The row's job, or ``None`` for a row that does not decode (a spec this version
        cannot read, say): logged and counted, never an error of the whole read, so that one
        job's row stops no loop over the others, and a copy received later replaces it."""
        try:
            return _job(row)
        except (ValueError, KeyError, TypeError) as exc:
            self.unreadable_jobs += 1
            log.warning(
                "job %s: its stored row does not decode, left out: %s", str(row[0])[:8], exc
            )
            return None

    def delete_job(self, job_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))

    def ended_before(self, before: float, limit: int) -> list[str]:
        """Up to ``limit`` jobs this store holds nothing newer of than ``before`` (wall time):
        an ended record last written before it, or none, and attempts run here that all
        finished before it, none running. The oldest first."""
        ended = [s.value for s in TERMINAL_JOB_STATES]
        marks = ", ".join("?" for _ in ended)
        query = (
            "SELECT c.job_id FROM (SELECT job_id, updated_at AS at FROM jobs "
            f"WHERE state IN ({marks}) AND updated_at < ? "
            "UNION ALL SELECT job_id, finished_at AS at FROM results WHERE finished_at < ?) AS c "
            "GROUP BY c.job_id "
            "HAVING NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.job_id = c.job_id "
            f"AND (j.state NOT IN ({marks}) OR j.updated_at >= ?)) "
            "AND NOT EXISTS (SELECT 1 FROM results AS r WHERE r.job_id = c.job_id "
            "AND r.finished_at >= ?) "
            "AND NOT EXISTS (SELECT 1 FROM runs AS u WHERE u.job_id = c.job_id) "
            "ORDER BY MIN(c.at) LIMIT ?"
        )
        args = (*ended, before, before, *ended, before, before, limit)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [str(r[0]) for r in rows]

    def held(self, job_ids: Iterable[str]) -> set[str]:
        """Which of these jobs this store holds any row of (a record, a result, a run)."""
        found: set[str] = set()
        with self._lock:
            for job_id in job_ids:
                row = self._db.execute(
                    "SELECT 1 FROM jobs WHERE job_id = ? UNION ALL "
                    "SELECT 1 FROM results WHERE job_id = ? UNION ALL "
                    "SELECT 1 FROM runs WHERE job_id = ?",
                    (job_id, job_id, job_id),
                ).fetchone()
                if row is not None:
                    found.add(job_id)
        return found

    def forget_jobs(self, job_ids: Iterable[str]) -> None:
        """Drop every row of these jobs: their records and their attempts' results."""
        ids = [(j,) for j in job_ids]
        with self._tx() as db:
            db.executemany("DELETE FROM jobs WHERE job_id = ?", ids)
            db.executemany("DELETE FROM results WHERE job_id = ?", ids)

    # -- operator commands executed (replay memory) ----------------------------------------------

    def remember_command(self, command_id: str, issued_at: float, forget_before: float) -> None:
        """Record an executed command, and forget those issued before ``forget_before`` (they
        are refused as stale anyway)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO seen_commands (command_id, issued_at) VALUES (?, ?)",
                (command_id, issued_at),
            )
            db.execute("DELETE FROM seen_commands WHERE issued_at < ?", (forget_before,))

    def seen_commands(self, since: float) -> list[tuple[str, float]]:
        """Commands executed that were issued at or after ``since``: (id, issued_at)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT command_id, issued_at FROM seen_commands WHERE issued_at >= ?", (since,)
            ).fetchall()
        return [(str(r[0]), float(r[1])) for r in rows]

    # -- processes this node runs ----------------------------------------------------------------

    def record_run(self, run: RunRecord) -> None:
        """Remember a started process (replacing an older attempt of the same job)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO runs (job_id, attempt, pid, pgid, started_at, log_path) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run.job_id, run.attempt, run.pid, run.pgid, run.started_at, run.log_path),
            )

    def running_jobs(self) -> list[RunRecord]:
        """Processes recorded as running here, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, attempt, pid, pgid, started_at, log_path FROM runs "
                "ORDER BY started_at, job_id"
            ).fetchall()
        return [RunRecord(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def finish_run(self, result: ResultRecord) -> None:
        """Record how an attempt ended and forget its process, in one transaction."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM runs WHERE job_id = ? AND attempt = ?",
                (result.job_id, result.attempt),
            )
            db.execute(
                "INSERT OR REPLACE INTO results (job_id, attempt, exit_code, signal, cause, "
                "started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    result.job_id,
                    result.attempt,
                    result.exit_code,
                    result.signal,
                    result.cause,
                    result.started_at,
                    result.finished_at,
                ),
            )

    def last_attempt_run(self, job_id: str) -> int:
        """The highest attempt of the job that ran here and ended (0: none)."""
        with self._lock:
            row = self._db.execute(
                "SELECT MAX(attempt) FROM results WHERE job_id = ?", (job_id,)
            ).fetchone()
        return int(row[0] or 0)

    def results(self, job_id: str | None = None) -> list[ResultRecord]:
        """Results of finished attempts, in the order they finished."""
        query = (
            "SELECT job_id, attempt, exit_code, signal, cause, started_at, finished_at FROM results"
        )
        args: tuple[str, ...] = ()
        if job_id is not None:
            query += " WHERE job_id = ?"
            args = (job_id,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY finished_at, job_id, attempt", args)
            found = rows.fetchall()
        return [ResultRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in found]


_JOB_COLUMNS: Final = (
    "job_id, spec, state, attempt, owner, runner, submitted_at, updated_at, detail, submission"
)


def _job(row: tuple[Any, ...]) -> JobRecord:
    return JobRecord(
        job_id=row[0],
        spec=JobSpec.from_dict(json.loads(row[1])),
        state=JobState(row[2]),
        attempt=row[3],
        owner=row[4],
        runner=row[5],
        submitted_at=row[6],
        updated_at=row[7],
        detail=json.loads(row[8]),
        submission=bytes(row[9]),
    )


# -- reconciling after a restart -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What a restarted agent found of the processes it had recorded."""

    alive: tuple[RunRecord, ...]
    """Still there. Their output pipe died with the old agent: stop them and requeue, or let them
    finish; either way the owner decides with fencing (a newer attempt wins)."""
    gone: tuple[RunRecord, ...]
    """No longer there; recorded as results with cause ``lost``, to be requeued by their owner."""


def reconcile(
    store: Store,
    is_alive: Callable[[int, int | None], bool],
    *,
    now: float,
) -> Reconciliation:
    """Sort the recorded running processes into living and gone; the gone ones become ``lost``
    results (so a second call does not report them again). Finished results are kept."""
    alive: list[RunRecord] = []
    gone: list[RunRecord] = []
    for run in store.running_jobs():
        (alive if is_alive(run.pid, run.pgid) else gone).append(run)
    for run in gone:
        store.finish_run(
            ResultRecord(
                job_id=run.job_id,
                attempt=run.attempt,
                exit_code=None,
                signal=None,
                cause="lost",
                started_at=run.started_at,
                finished_at=now,
            )
        )
    return Reconciliation(tuple(alive), tuple(gone))


def process_alive(pid: int, pgid: int | None) -> bool:
    """Whether the process (or, given a group, any process of that group) still exists."""
    if sys.platform == "win32":
        import psutil

        return bool(psutil.pid_exists(pid))
    try:
        if pgid is not None:
            os.killpg(pgid, 0)
        else:
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it is not ours to signal
    return True
