"""The store's files on disk: partial files filled chunk by chunk, read-only objects named by
their whole SHA-256, and hardlink trees of them. No SQLite here; :mod:`agent.content.store`
decides what to write where."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, cast

from agent.storage.sqlitefile import StoreFull
from gossip.fsmodes import ensure_dir

_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_READ: Final = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
_WRITE: Final = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC
_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
_HASH_BLOCK: Final = 1 << 20


_fdatasync: Final = getattr(os, "fdatasync", os.fsync)


def _load_syncfs() -> Callable[[int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int
    return cast("Callable[[int], int]", call)


_SYNCFS: Final = _load_syncfs()


def _syncfs(fd: int) -> bool:
    """Flush the whole file system ``fd`` is on to the disk (Linux); False where this cannot
    be done (then each file is synced on its own)."""
    if _SYNCFS is None:
        return False
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return True


def full(exc: OSError) -> bool:
    """Whether a write failed because the disk (or a quota) is full."""
    return exc.errno in _FULL_ERRNOS


class StoreFiles:
    """``objects/ab/<sha256>`` (0444), ``partial/<file key>``, ``trees/<digest>/`` under root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        ensure_dir(root, 0o700)
        for sub in ("objects", "partial", "trees"):
            ensure_dir(root / sub, 0o700)

    def object_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha

    def partial_path(self, fkey: str) -> Path:
        return self.root / "partial" / fkey

    def tree_path(self, digest: str) -> Path:
        return self.root / "trees" / digest

    def write_many(self, writes: Sequence[tuple[str, int, int, bytes]]) -> None:
        """Write each ``(file key, size, offset, data)`` into its partial file (made at its
        size, sparse) and flush them all to the disk before returning (the index records them
        held only after): one ``syncfs`` of the store's file system where there is one (Linux),
        else each file synced on its own."""
        fds: list[int] = []
        try:
            for fkey, size_bytes, offset_bytes, data in writes:
                fd = os.open(self.partial_path(fkey), _WRITE, 0o600)
                fds.append(fd)
                if os.fstat(fd).st_size != size_bytes:
                    os.ftruncate(fd, size_bytes)
                if data:
                    os.pwrite(fd, data, offset_bytes)
            if len(fds) > 1 and _syncfs(fds[0]):
                return
            for fd in fds:
                _fdatasync(fd)
        except OSError as exc:
            if full(exc):
                raise StoreFull(f"store {self.root}: the disk is full ({exc.strerror})") from None
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def read_at(self, path: Path, offset_bytes: int, length_bytes: int) -> bytes | None:
        """``length_bytes`` of the regular file ``path`` from ``offset_bytes``, no link
        followed; ``None`` when it is gone, not a file, or too short."""
        try:
            fd = os.open(path, _READ)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.pread(fd, length_bytes, offset_bytes) if length_bytes else b""
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) == length_bytes else None

    def finish(
        self, fkey: str, chunk_bytes: int, chunks: Sequence[str]
    ) -> tuple[str | None, tuple[int, ...]]:
        """Check the whole partial file ``fkey`` chunk by chunk: ``(its SHA-256, ())`` once it
        is an object (read-only, moved under ``objects/``; a second copy of an object already
        there is dropped), or ``(None, bad chunk numbers)`` when some do not match."""
        path = self.partial_path(fkey)
        if len(chunks) == 1 and os.path.isfile(path):
            # one chunk, checked as it came and synced: the file's SHA-256 is the chunk's (a
            # folder of small files is mostly these; reading each back doubled the work)
            sha = chunks[0]
        else:
            checked, bad = _check(path, chunk_bytes, chunks)
            if checked is None:
                return None, bad
            sha = checked
        target = self.object_path(sha)
        ensure_dir(target.parent, 0o700)
        os.chmod(path, 0o444)
        if target.exists():
            path.unlink()
        else:
            os.replace(path, target)
        return sha, ()

    def drop_partial(self, fkey: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.partial_path(fkey).unlink()

    def drop_object(self, sha: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.object_path(sha).unlink()

    def drop_tree(self, digest: str) -> None:
        shutil.rmtree(self.tree_path(digest), ignore_errors=True)

    def link_tree(self, digest: str, files: Sequence[tuple[str, str]]) -> Path:
        """``trees/<digest>/`` as hardlinks of objects: ``files`` is (relative path, object
        SHA-256); made aside and renamed into place, so a tree is whole or absent."""
        final = self.tree_path(digest)
        if final.is_dir():
            return final
        work = self.root / "trees" / f".{digest}.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            for rel, sha in files:
                dest = work / rel
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.link(self.object_path(sha), dest)
            work.mkdir(exist_ok=True, mode=0o700)
            os.replace(work, final)
        except OSError as exc:
            shutil.rmtree(work, ignore_errors=True)
            if full(exc):
                raise StoreFull(f"store {self.root}: the disk is full ({exc.strerror})") from None
            raise
        return final

    def disk_free(self) -> tuple[int, int]:
        """Bytes free (to an unprivileged user) and in all, on the store's disk."""
        usage = shutil.disk_usage(self.root)
        return usage.free, usage.total


def _check(
    path: Path, chunk_bytes: int, chunks: Sequence[str]
) -> tuple[str | None, tuple[int, ...]]:
    """The file's SHA-256 once each chunk of it matches; else None and the chunks that do not."""
    whole = hashlib.sha256()
    bad: list[int] = []
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None, tuple(range(len(chunks)))
    try:
        for n, digest in enumerate(chunks):
            data = os.pread(fd, chunk_bytes, n * chunk_bytes)
            if hashlib.sha256(data).hexdigest() != digest:
                bad.append(n)
            whole.update(data)
    finally:
        os.close(fd)
    return (None, tuple(bad)) if bad else (whole.hexdigest(), ())
