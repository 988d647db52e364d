"""The store's index, its schema and rows: what :mod:`agent.content.store` keeps in SQLite."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.content.manifest import ContentFile

BATCH: Final = 500
"""Values bound in one ``IN (...)`` at most."""
MIGRATIONS: Final = (
    (
        "CREATE TABLE manifests (digest TEXT PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT"
        " NULL, body TEXT NOT NULL, created_s REAL NOT NULL, total_bytes INTEGER NOT NULL,"
        " held_bytes INTEGER NOT NULL, last_use_s REAL NOT NULL, uses INTEGER NOT NULL,"
        " pinned INTEGER NOT NULL)",
        "CREATE TABLE names (name TEXT NOT NULL, digest TEXT NOT NULL, origin TEXT, created_s"
        " REAL NOT NULL, PRIMARY KEY (name, digest))",
        "CREATE INDEX names_digest ON names (digest)",
        "CREATE TABLE files (fkey TEXT PRIMARY KEY, size_bytes INTEGER NOT NULL, chunk_bytes"
        " INTEGER NOT NULL, object TEXT, local TEXT)",
        "CREATE TABLE entries (digest TEXT NOT NULL, idx INTEGER NOT NULL, fkey TEXT NOT NULL,"
        " path TEXT NOT NULL, PRIMARY KEY (digest, idx))",
        "CREATE INDEX entries_fkey ON entries (fkey)",
        "CREATE TABLE places (fkey TEXT NOT NULL, n INTEGER NOT NULL, chunk TEXT NOT NULL,"
        " length INTEGER NOT NULL, held INTEGER NOT NULL, PRIMARY KEY (fkey, n))",
        "CREATE INDEX places_chunk ON places (chunk, held)",
        "CREATE TABLE hashes (path TEXT PRIMARY KEY, size_bytes INTEGER NOT NULL, mtime_ns"
        " INTEGER NOT NULL, inode INTEGER NOT NULL, chunk_bytes INTEGER NOT NULL, chunks TEXT"
        " NOT NULL)",
        "CREATE TABLE sources (name TEXT PRIMARY KEY, path TEXT NOT NULL, added_s REAL NOT NULL)",
    ),
)


def file_key(chunk_bytes: int, f: ContentFile) -> str:
    """The content key of a file: equal for equal bytes cut the same way, whatever its path."""
    canon = json.dumps([chunk_bytes, f.size_bytes, list(f.chunks)], separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Held:
    """One manifest under one of its names, as the index records it (the same bytes under two
    names, two datasets whose contents are equal, are one manifest and two rows)."""

    digest: str
    kind: str
    name: str
    created_s: float
    total_bytes: int
    held_bytes: int
    last_use_s: float
    uses: int
    pinned: bool
    origin: str | None
    """The folder it was built from under this name (local origin); ``None``: the store's own."""

    @property
    def complete(self) -> bool:
        return self.held_bytes >= self.total_bytes


@dataclass(slots=True)
class StoreStats:
    hits: int = 0
    """Chunks asked of this store (to serve, or to fill another place) that it had."""
    misses: int = 0
    evictions: int = 0
    refused_chunks: int = 0
    """Chunks put that did not match their digest or length."""
    corrupt: int = 0
    """Held chunks found not matching when read again (unmarked, fetched again)."""
    by_reason: dict[str, int] = field(default_factory=dict)


HELD_SELECT: Final = (
    "SELECT m.digest, m.kind, n.name, n.created_s, m.total_bytes, m.held_bytes, m.last_use_s,"
    " m.uses, m.pinned, n.origin FROM names n JOIN manifests m ON m.digest = n.digest"
)


def held_row(row: Sequence[object]) -> Held:
    return Held(
        digest=str(row[0]),
        kind=str(row[1]),
        name=str(row[2]),
        created_s=float(row[3]),  # type: ignore[arg-type]
        total_bytes=int(row[4]),  # type: ignore[call-overload]
        held_bytes=int(row[5]),  # type: ignore[call-overload]
        last_use_s=float(row[6]),  # type: ignore[arg-type]
        uses=int(row[7]),  # type: ignore[call-overload]
        pinned=bool(row[8]),
        origin=None if row[9] is None else str(row[9]),
    )


def digests_of(db: sqlite3.Connection, fkeys: Sequence[str]) -> list[str]:
    """The manifests with a file among ``fkeys``."""
    out: set[str] = set()
    for i in range(0, len(fkeys), BATCH):
        part = fkeys[i : i + BATCH]
        marks = ",".join("?" * len(part))
        out.update(
            r[0]
            for r in db.execute(
                f"SELECT DISTINCT digest FROM entries WHERE fkey IN ({marks})", part
            )
        )
    return sorted(out)


def point_local(db: sqlite3.Connection, digest: str, origin: str) -> None:
    """The files of ``digest`` read from a folder are read from ``origin`` from now on."""
    rows = db.execute(
        "SELECT e.fkey, e.path FROM entries e JOIN files f USING (fkey) WHERE e.digest = ?"
        " AND f.local IS NOT NULL",
        (digest,),
    ).fetchall()
    db.executemany(
        "UPDATE files SET local = ? WHERE fkey = ?",
        [(str(Path(origin) / path), fkey) for fkey, path in rows],
    )


def recount(db: sqlite3.Connection, digests: Sequence[str]) -> None:
    """Each manifest's ``held_bytes`` from its places held."""
    for digest in digests:
        db.execute(
            "UPDATE manifests SET held_bytes = (SELECT COALESCE(SUM(p.length), 0) FROM"
            " entries e JOIN places p ON p.fkey = e.fkey AND p.held = 1 WHERE e.digest = ?)"
            " WHERE digest = ?",
            (digest, digest),
        )
