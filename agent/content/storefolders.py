"""The store's index of folders on this host: datasets an operator added (``shoal data add``)
and the hash cache of folders built in place (:class:`agent.content.build.HashCache`)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path


class FolderIndex:
    """Mixed into :class:`agent.content.store.DiskStore`: its connection, lock and clock."""

    _db: sqlite3.Connection
    _lock: threading.RLock
    clock: Callable[[], float]

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    # ---- folders an operator added as datasets (``shoal data add``) ---------------------------

    def add_source(self, name: str, path: Path) -> None:
        """Remember that dataset ``name`` is built from ``path`` on this node (across restarts)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO sources VALUES (?, ?, ?)", (name, str(path), self.clock())
            )

    def sources(self) -> dict[str, Path]:
        with self._lock:
            rows = self._db.execute("SELECT name, path FROM sources ORDER BY name").fetchall()
        return {str(n): Path(p) for n, p in rows}

    # ---- the hash cache of folders built in place (agent.content.build.HashCache) ---------

    def cached_chunks(
        self, path: str, stamp: tuple[int, int, int], chunk_bytes: int
    ) -> tuple[str, ...] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT chunks FROM hashes WHERE path = ? AND size_bytes = ? AND mtime_ns = ?"
                " AND inode = ? AND chunk_bytes = ?",
                (path, *stamp, chunk_bytes),
            ).fetchone()
        return None if row is None else tuple(json.loads(row[0]))

    def remember_chunks(
        self,
        fresh: Sequence[tuple[str, tuple[int, int, int], int, tuple[str, ...]]],
        seen: Collection[str],
        drop_under: str,
    ) -> None:
        prefix = drop_under.rstrip("/") + "/"
        bounds = (prefix, prefix[:-1] + "0")  # "/" + 1: every path under the folder, by index
        under = "path >= ? AND path < ?"
        with self._tx() as db:
            count = db.execute(f"SELECT COUNT(*) FROM hashes WHERE {under}", bounds).fetchone()
            if fresh or int(count[0]) != sum(1 for p in seen if p.startswith(prefix)):
                gone = [
                    r[0]
                    for r in db.execute(f"SELECT path FROM hashes WHERE {under}", bounds)
                    if r[0] not in seen
                ]
                db.executemany("DELETE FROM hashes WHERE path = ?", [(p,) for p in gone])
            db.executemany(
                "INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (path, *stamp, chunk_bytes, json.dumps(list(chunks)))
                    for path, stamp, chunk_bytes, chunks in fresh
                ],
            )
