"""What every SQLite file of an agent shares (the job store, the history): private files, one
write transaction at a time that a full disk leaves undone, and numbered schema migrations."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gossip.fsmodes import ensure_dir, set_file_mode


class StoreError(Exception):
    """The store file cannot be used (newer schema, not a database...)."""


class StoreFull(StoreError):
    """A write that did not happen: the data folder's disk is full (or failed to write).
    Nothing of it was kept (the transaction rolled back); what was stored before stays."""


def unwritable(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite failed because the disk would not take the write."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
    return code in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR) or "disk is full" in str(exc)


def private_files(path: Path) -> None:
    """The database and its -wal/-shm files are 0600 whatever the umask; its folder, when made
    here, 0700. SQLite gives the -wal and -shm files the mode of the database file, so creating
    that one first (and fixing the mode of files an older version made) covers all three."""
    if not path.parent.is_dir():
        ensure_dir(path.parent, 0o700)
    if sys.platform != "win32":
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(path, flags, 0o600))
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        set_file_mode(path.with_name(name), 0o600)


def open_database(path: Path, synchronous: str) -> sqlite3.Connection:
    """``path`` opened as every agent file is: private, one connection shared between threads
    (callers hold their own lock), WAL, ``synchronous`` as given (``FULL`` for what must survive
    a power cut, ``NORMAL`` for what may lose its last seconds); a file that is not a usable
    database is :class:`StoreError`."""
    private_files(path)
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 5000")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {synchronous}")
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a usable SQLite database ({exc})") from None
    return db


@contextlib.contextmanager
def transaction(
    db: sqlite3.Connection, lock: contextlib.AbstractContextManager[Any], path: Path
) -> Iterator[sqlite3.Connection]:
    """One write transaction under ``lock``; a full disk is :class:`StoreFull` and leaves
    nothing half done (any error rolls the whole of it back)."""
    with lock:
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):  # none open: COMMIT ended it
                    db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if unwritable(exc):
                raise StoreFull(f"cannot write to {path}: {exc}") from None
            raise


def migrate(
    db: sqlite3.Connection, path: Path, migrations: Sequence[Sequence[str]], what: str
) -> None:
    """Bring the file's schema (``PRAGMA user_version``) up to ``len(migrations)``, inside the
    caller's transaction; a file of a newer Shoal is :class:`StoreError`. ``migrations[n]`` takes
    a file from version ``n`` to ``n + 1``."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > len(migrations):
        raise StoreError(
            f"{path}: written by a newer Shoal ({what} {version}; "
            f"this one knows up to {len(migrations)})"
        )
    for target in range(version + 1, len(migrations) + 1):
        for statement in migrations[target - 1]:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {target:d}")
