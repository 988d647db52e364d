"""A node's history on disk: ``history.sqlite`` beside the agent's store, and the agent's glue.

A file of its own, not a table of ``agent.sqlite``: the job store commits with
``synchronous=FULL`` (an acknowledged submission survives a power cut), which a write every few
seconds of telemetry has no need of; history is written with ``synchronous=NORMAL`` (a power
cut may lose its last seconds, never corrupt it) and never holds the job store's lock or grows
its WAL. An operator may delete the file to start history afresh without touching a job, and a
disk too full for history does not stop the job store (each refuses on its own).

Rows: ``series`` names each series once (and whether it is unsupported, and why); ``blocks``
holds one packed block per tier, series and span (:mod:`agent.history.history`), keyed by all three,
``WITHOUT ROWID``. The open blocks are written every :data:`FLUSH_EVERY_S` (and at a graceful
stop), trimmed every :data:`TRIM_EVERY_S`; a restarted agent reads back the latest block of
each tier and series and carries on filling it.

:class:`History` is what the daemon holds: ``sample`` (every second), ``flush`` and ``trim``
when due, and ``query`` (called in a thread: one connection behind a lock).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.history.history import (
    TIER_BY_NAME,
    TIERS,
    HistoryCore,
    Point,
    Reading,
    SeriesKey,
    pick_tier,
    points,
    trim_before,
)
from agent.history.history_hints import WINDOW_S, GpuFacts, Hint, node_hints
from agent.storage.sqlitefile import StoreError, StoreFull, migrate, open_database, transaction
from agent.wire.history import HistoryDoc, HistoryHint, HistoryQuery, HistorySeries

log = logging.getLogger("shoal.history")

FILE_NAME: Final = "history.sqlite"
FLUSH_EVERY_S: Final = 10.0
"""The most a crash of the agent loses of its history (a graceful stop loses nothing)."""
TRIM_EVERY_S: Final = 600.0
MAX_POINTS: Final = 100_000
"""The most points one query answers per series (``(to - from) / step``)."""
MAX_SERIES: Final = 512
"""The most series one query answers."""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE series (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            subject TEXT NOT NULL,
            unsupported TEXT,
            UNIQUE (name, subject)
        )""",
        """CREATE TABLE blocks (
            tier TEXT NOT NULL,
            series INTEGER NOT NULL,
            start_s INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (tier, series, start_s)
        ) WITHOUT ROWID""",
    ),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)


class QueryError(ValueError):
    """A query that cannot be answered as asked (one line)."""


@dataclass(frozen=True, slots=True)
class SeriesAnswer:
    """One series of a query's answer."""

    key: SeriesKey
    unsupported: str | None
    """Why the device does not expose it (then ``points`` is empty), or ``None``."""
    tier: str
    step_s: int
    points: tuple[Point, ...]


class HistoryStore:
    """The SQLite file. Safe to share between threads (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_database(path, "NORMAL")
        self._lock = threading.Lock()
        self._ids: dict[SeriesKey, int] = {}
        self._migrate()
        for sid, name, subject in self._db.execute("SELECT id, name, subject FROM series"):
            self._ids[SeriesKey(name, subject)] = sid

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db, self._lock, self.path)

    def _migrate(self) -> None:
        with self._tx() as db:
            migrate(db, self.path, MIGRATIONS, "history schema")

    # -- writing -----------------------------------------------------------------------------------

    def _series_id(self, db: sqlite3.Connection, key: SeriesKey) -> int:
        sid = self._ids.get(key)
        if sid is None:
            cursor = db.execute(
                "INSERT INTO series (name, subject) VALUES (?, ?)", (key.name, key.subject)
            )
            sid = self._ids[key] = int(cursor.lastrowid or 0)
        return sid

    def write(self, core: HistoryCore) -> int:
        """Write what the core changed since the last write; the blocks written."""
        changes = core.support_changes()
        blocks = core.take_dirty()
        if not changes and not blocks:
            return 0
        with self._tx() as db:
            for key, why in changes:
                db.execute(
                    "UPDATE series SET unsupported = ? WHERE id = ?",
                    (why, self._series_id(db, key)),
                )
            db.executemany(
                "INSERT OR REPLACE INTO blocks (tier, series, start_s, data) VALUES (?, ?, ?, ?)",
                [(b.tier, self._series_id(db, b.key), b.start_s, b.data) for b in blocks],
            )
        return len(blocks)

    def trim(self, now_s: float, live: Collection[SeriesKey] = ()) -> int:
        """Let go of the blocks past their tier's keep, and of the series left without a block
        that are not ``live`` (still sampled); the blocks let go of."""
        gone = 0
        with self._tx() as db:
            ids = [sid for (sid,) in db.execute("SELECT id FROM series")]
            for tier, before in trim_before(now_s).items():
                for sid in ids:  # along the primary key: no scan of the whole tier
                    cursor = db.execute(
                        "DELETE FROM blocks WHERE tier = ? AND series = ? AND start_s < ?",
                        (tier, sid, before),
                    )
                    gone += cursor.rowcount
            held = {
                sid
                for tier in TIER_BY_NAME
                for sid in ids
                if db.execute(
                    "SELECT 1 FROM blocks WHERE tier = ? AND series = ? LIMIT 1", (tier, sid)
                ).fetchone()
            }
            names = {sid: key for key, sid in self._ids.items()}
            dead = [(sid, names[sid]) for sid in ids if sid not in held and sid in names]
            dead = [(sid, key) for sid, key in dead if key not in live]
            db.executemany("DELETE FROM series WHERE id = ?", [(sid,) for sid, _ in dead])
        for _, key in dead:
            self._ids.pop(key, None)
        return gone

    def restore(self, core: HistoryCore) -> None:
        """Give the core back every series and the latest block of each tier and series."""
        names = {sid: key for key, sid in self._ids.items()}
        with self._lock:
            support = self._db.execute("SELECT id, unsupported FROM series").fetchall()
            rows = self._db.execute(
                "SELECT b.tier, b.series, b.start_s, b.data FROM blocks b JOIN "
                "(SELECT tier, series, MAX(start_s) AS last FROM blocks GROUP BY tier, series) l "
                "ON b.tier = l.tier AND b.series = l.series AND b.start_s = l.last"
            ).fetchall()
        for tier, sid, start_s, data in rows:
            if tier in TIER_BY_NAME and sid in names:
                with contextlib.suppress(ValueError):  # a block of another size: left as is
                    core.restore(tier, names[sid], start_s, data)
        for sid, why in support:
            if sid in names:
                core.supported[names[sid]] = why
        core.support_changes()  # what the file says is recorded already

    # -- reading -----------------------------------------------------------------------------------

    def series(self) -> dict[SeriesKey, str | None]:
        """Every series the file names, and why it is unsupported (``None``: it is supported)."""
        with self._lock:
            rows = self._db.execute("SELECT name, subject, unsupported FROM series").fetchall()
        return {SeriesKey(name, subject): why for name, subject, why in rows}

    def blocks(self, tier: str, key: SeriesKey, from_s: int, to_s: int) -> list[tuple[int, bytes]]:
        """The blocks of one series in one tier that overlap ``[from_s, to_s)``."""
        sid = self._ids.get(key)
        if sid is None:
            return []
        span = TIER_BY_NAME[tier].span_s
        with self._lock:
            rows = self._db.execute(
                "SELECT start_s, data FROM blocks WHERE tier = ? AND series = ? "
                "AND start_s > ? AND start_s < ? ORDER BY start_s",
                (tier, sid, from_s - span, to_s),
            ).fetchall()
        return [(int(start), bytes(data)) for start, data in rows]

    def size_bytes(self) -> int:
        with self._lock:
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            size = self._db.execute("PRAGMA page_size").fetchone()[0]
        return int(pages) * int(size)


class History:
    """The daemon's history: the core, its file, and when to write and trim."""

    def __init__(self, data_dir: Path, hints_window_s: int = WINDOW_S) -> None:
        self.core = HistoryCore()
        self.store = HistoryStore(data_dir / FILE_NAME)
        self.store.restore(self.core)
        self._flushed_s: float | None = None
        self._trimmed_s: float | None = None
        self.write_failures = 0
        self.hints_window_s = hints_window_s
        """The window the bottleneck hints judge (the agent's ``hints_window_s``)."""

    def dropped(self) -> dict[str, int]:
        """What was not kept, by reason (``shoal_history_dropped_total``)."""
        counts = self.core.counts
        return {
            "late": counts.late_samples,
            "not_finite": counts.bad_values,
            "write_failed": self.write_failures,
        }

    def sample(self, now_s: float, readings: Mapping[SeriesKey, Reading]) -> None:
        """One second's readings; writes and trims when due."""
        self.core.add(now_s, readings)
        if self._flushed_s is None or now_s - self._flushed_s >= FLUSH_EVERY_S:
            self.flush(now_s)
        if self._trimmed_s is None or now_s - self._trimmed_s >= TRIM_EVERY_S:
            self._trimmed_s = now_s
            try:
                self.store.trim(now_s, self.core.supported.keys())
            except StoreFull as exc:
                log.warning("could not trim the history: %s", exc)

    def flush(self, now_s: float) -> None:
        self._flushed_s = now_s
        self.core.close_idle(now_s)
        try:
            self.store.write(self.core)
        except StoreFull as exc:  # the blocks stay open in memory: the next flush retries
            self.write_failures += 1
            log.warning("could not write the history: %s", exc)

    def close(self, now_s: float) -> None:
        self.flush(now_s)
        self.store.close()

    def query(
        self,
        now_s: float,
        keys: Sequence[SeriesKey],
        from_s: int,
        to_s: int,
        step_s: int | None,
    ) -> list[SeriesAnswer]:
        """The points of each series of ``keys`` from ``from_s`` to ``to_s`` every ``step_s``
        (default: about 600 points), from the tier that holds them."""
        if to_s <= from_s:
            raise QueryError("'from' must be before 'to'")
        if len(keys) > MAX_SERIES:
            raise QueryError(f"at most {MAX_SERIES} series at once, not {len(keys)}")
        step = step_s if step_s is not None else max(1, (to_s - from_s) // 600)
        tier = pick_tier(now_s, from_s, step)
        step = max(step, tier.step_s)
        step -= step % tier.step_s
        if (to_s - from_s) // step > MAX_POINTS:
            raise QueryError(f"at most {MAX_POINTS} points a series: ask for a larger step")
        support = self.store.series()
        out = []
        for key in keys:
            why = support.get(key)
            if why is not None:
                out.append(SeriesAnswer(key, why, tier.name, step, ()))
                continue
            found = points(
                tier, self.store.blocks(tier.name, key, from_s, to_s), from_s, to_s, step
            )
            out.append(SeriesAnswer(key, None, tier.name, step, tuple(found)))
        return out

    def select(self, names: Sequence[str], subjects: Sequence[str] | None) -> list[SeriesKey]:
        """The series stored whose name is one of ``names`` or starts with one followed by a dot
        (``gpu`` is every ``gpu.*``; none: all), of one of ``subjects`` (none: any)."""
        known = self.store.series()
        chosen = [
            key
            for key in sorted(known)
            if (not names or any(key.name == n or key.name.startswith(n + ".") for n in names))
            and (subjects is None or key.subject in subjects)
        ]
        return chosen

    def answer(
        self,
        query: HistoryQuery,
        node_id: str,
        devices: Mapping[int, str],
        now_s: float,
        gpus: Mapping[str, GpuFacts] | None = None,
    ) -> HistoryDoc:
        """``GET /v1/history`` on node ``node_id`` (``devices``: index -> key, to take a device
        by either; ``gpus``: what the hints need); :class:`QueryError` for a query this node
        cannot answer."""
        if query.node is not None and not node_id.startswith(query.node):
            raise QueryError(
                f"this agent is node {node_id[:12]}: each node answers for itself, ask "
                f"{query.node[:40]}'s agent"
            )
        subjects: list[str] | None = None
        if query.device is not None or query.job is not None:
            subjects = [s for s in (query.job,) if s is not None]
            if query.device is not None:
                device = query.device
                if device.isdigit():
                    if int(device) not in devices:
                        raise QueryError(f"this node has no device {device}")
                    device = devices[int(device)]
                subjects.append(device)
        keys = self.select(query.series, subjects)
        answers = self.query(now_s, keys, query.from_s, query.to_s, query.step_s)
        series = tuple(
            HistorySeries(
                a.key.name,
                a.key.subject,
                a.unsupported,
                a.tier,
                a.step_s,
                tuple((p.t_s, p.min, p.avg, p.max) for p in a.points),
            )
            for a in answers
        )
        hints: tuple[HistoryHint, ...] = ()
        if query.hints:
            found = self.hints(now_s, gpus or {}, query.to_s)
            hints = tuple(HistoryHint(k, h.rule, h.evidence, h.unjudged) for k, h in found)
        return HistoryDoc(node_id, query.from_s, query.to_s, series, hints)

    def hints(
        self, now_s: float, gpus: Mapping[str, GpuFacts], to_s: int | None = None
    ) -> list[tuple[str, Hint]]:
        """Each GPU's bottleneck hints (and the host's) over the window ending at ``to_s``
        (default: now)."""
        end = int(now_s) if to_s is None else to_s
        window_s = self.hints_window_s
        return node_hints(
            gpus, lambda key: self._window(now_s, key, end, window_s), _mem_total_bytes(), window_s
        )

    def _window(
        self, now_s: float, key: SeriesKey, to_s: int, window_s: int
    ) -> list[float | None] | None:
        [found] = self.query(now_s, [key], to_s - window_s, to_s, 1)
        if found.unsupported is not None or key not in self.store.series():
            return None
        return [p.avg for p in found.points]


def _mem_total_bytes() -> float | None:
    """The host's memory, for the memory-pressure hint (``None``: psutil cannot tell)."""
    import psutil

    try:
        return float(psutil.virtual_memory().total)
    except (OSError, RuntimeError, psutil.Error):
        return None


def open_history(data_dir: Path, now_s: float, hints_window_s: int = WINDOW_S) -> History:
    """The node's history, its hints judged over ``hints_window_s``; a file that cannot be used
    (not a database, a newer schema) is moved aside, kept for the operator, and history starts
    afresh: history never stops an agent."""
    try:
        return History(data_dir, hints_window_s)
    except StoreError as exc:
        path = data_dir / FILE_NAME
        aside = path.with_name(f"{FILE_NAME}.unusable-{int(now_s)}")
        log.warning("%s: moved to %s, history starts afresh", exc, aside.name)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + suffix).rename(aside.with_name(aside.name + suffix))
        return History(data_dir, hints_window_s)


__all__ = ["TIERS", "History", "HistoryStore", "QueryError", "SeriesAnswer", "open_history"]
