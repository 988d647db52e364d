"""A job's output log: size-rotated files, and readers for the last lines and for following it.

The live file is ``output.log``; when a write would take it past ``max_bytes`` it becomes
``output.log.1`` (the older ones shift to ``.2`` .. ``.N`` and the oldest is dropped), so a job
never holds more than ``max_bytes * (backups + 1)`` on disk plus one write.

The log lives in the job's folder, which the job (its user) may write: a job could leave a
symlink, a hard link or a FIFO where the agent expects its log. So the agent opens the files
without following symlinks and without blocking, writes only a regular file it owns with a single
link (anything else is removed first), reads only regular files it owns, and creates them 0600.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, Final

LOG_NAME: Final = "output.log"
DEFAULT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_BACKUPS: Final = 3
_BLOCK: Final = 64 * 1024


def log_files(path: Path, backups: int = DEFAULT_BACKUPS) -> list[Path]:
    """The log's files that exist, oldest first (``output.log.3`` .. ``output.log``)."""
    names = [path.with_name(f"{path.name}.{i}") for i in range(backups, 0, -1)] + [path]
    return [p for p in names if _is_regular(p)]


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _open_for_append(path: Path) -> BinaryIO:
    """``path`` opened to append: a regular file of ours with one link, made 0600 if missing."""
    if sys.platform == "win32":
        return open(path, "ab")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(path, flags, 0o600)
        except OSError:  # ELOOP (a symlink), ENXIO (a FIFO nobody reads)...
            path.unlink(missing_ok=True)
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
            os.fchmod(fd, 0o600)
            return os.fdopen(fd, "ab")
        os.close(fd)
        path.unlink(missing_ok=True)
    raise PermissionError(f"{path} keeps being replaced; not writing the log there")


def _open_to_read(path: Path) -> BinaryIO | None:
    """``path`` opened to read when it is a regular file of ours; ``None`` when missing or not."""
    if sys.platform == "win32":
        try:
            return open(path, "rb")
        except FileNotFoundError:
            return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


class RotatingLog:
    """Appends bytes to ``path``, rotating by size. Not thread-safe; one writer per log."""

    def __init__(
        self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        if max_bytes <= 0 or backups < 0:
            raise ValueError("max_bytes must be positive and backups not negative")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = _open_for_append(path)
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._size > 0 and self._size + len(data) > self.max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        try:
            if self.backups == 0:
                self.path.unlink()
            else:
                oldest = self.path.with_name(f"{self.path.name}.{self.backups}")
                oldest.unlink(missing_ok=True)
                for i in range(self.backups - 1, 0, -1):
                    src = self.path.with_name(f"{self.path.name}.{i}")
                    if src.exists():
                        os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        except OSError:
            # A reader holding the file open on Windows blocks the rename: keep appending and
            # try again at the next write past the limit.
            pass
        self._file = _open_for_append(self.path)
        self._size = self._file.tell()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RotatingLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tail(path: Path, lines: int, backups: int = DEFAULT_BACKUPS) -> list[str]:
    """The last ``lines`` lines of the log, across rotated files, without reading it all."""
    return _tail(path, lines, backups, live_end=None)


def _tail(path: Path, lines: int, backups: int, live_end: int | None) -> list[str]:
    if lines <= 0:
        return []
    chunks: list[bytes] = []
    newlines = 0
    for file in reversed(log_files(path, backups)):
        opened = _open_to_read(file)
        if opened is None:
            continue  # rotated away while we looked
        with opened as f:
            pos = f.seek(0, os.SEEK_END)
            if file == path and live_end is not None:
                pos = min(pos, live_end)
            while pos > 0 and newlines <= lines:
                step = min(_BLOCK, pos)
                pos -= step
                f.seek(pos)
                block = f.read(step)
                chunks.append(block)
                newlines += block.count(b"\n")
        if newlines > lines:
            break
    text = b"".join(reversed(chunks)).decode("utf-8", errors="replace")
    return text.splitlines()[-lines:]


async def follow(
    path: Path,
    done: Callable[[], bool],
    *,
    from_lines: int = 0,
    poll_s: float = 0.1,
    backups: int = DEFAULT_BACKUPS,
) -> AsyncIterator[str]:
    """Yield the log's lines as they are written, starting with the last ``from_lines``.

    Ends once ``done()`` is true and everything written has been yielded; a last line without a
    newline is yielded then. Survives rotation: the rest of the rotated file is read before the
    new one.
    """
    handle: BinaryIO | None = None
    pending = b""
    try:
        handle = _open_to_read(path)
        # Lines up to where the open handle starts come from tail(); the rest from the handle.
        live_end = handle.seek(0, os.SEEK_END) if handle is not None else None
        for line in _tail(path, from_lines, backups, live_end):
            yield line
        while True:
            if handle is None:
                handle = _open_to_read(path)
            finished = done()
            if handle is not None:
                data = handle.read()
                if data:
                    pending += data
                    *complete, pending = pending.split(b"\n")
                    for raw in complete:
                        yield raw.decode("utf-8", errors="replace").rstrip("\r")
                    await asyncio.sleep(0)  # a busy writer must not starve the loop
                    continue
                if _rotated(path, handle):
                    handle.close()
                    handle = None
                    continue
            if finished:
                if pending:
                    yield pending.decode("utf-8", errors="replace")
                return
            await asyncio.sleep(poll_s)
    finally:
        if handle is not None:
            handle.close()


def _rotated(path: Path, handle: BinaryIO) -> bool:
    """Whether ``path`` now names another file than the one ``handle`` reads."""
    try:
        current = os.lstat(path)
        opened = os.fstat(handle.fileno())
    except OSError:
        return False
    return (current.st_ino, current.st_dev) != (opened.st_ino, opened.st_dev)
