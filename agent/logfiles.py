"""A job's output log: size-rotated files, and readers for the last lines and for following it.

The live file is ``output.log``; when a write would take it past ``max_bytes`` it becomes
``output.log.1`` (the older ones shift to ``.2`` .. ``.N`` and the oldest is dropped), so a job
never holds more than ``max_bytes * (backups + 1)`` on disk plus one write.

Readers are bounded whatever the log holds: a tail reads back from the end in blocks, at most
``MAX_TAIL_BYTES`` (the API refuses more than ``MAX_TAIL_LINES`` lines), and ``follow`` reads one
block at a time, in a thread, and holds at most ``MAX_LINE_BYTES`` of an unfinished line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import BinaryIO, Final

LOG_NAME: Final = "output.log"
DEFAULT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_BACKUPS: Final = 3
_BLOCK: Final = 64 * 1024
MAX_TAIL_LINES: Final = 10_000
"""The most lines one log request may ask for."""
MAX_TAIL_BYTES: Final = 4 * 1024 * 1024
"""The most a tail reads back, whatever the lines asked: 10,000 lines of ~400 bytes. Past it
the oldest (cut) line is dropped, so a job printing one endless line costs a request no more."""
MAX_LINE_BYTES: Final = 64 * 1024
"""``follow`` yields a longer line in pieces of this size instead of holding it whole."""


def log_files(path: Path, backups: int = DEFAULT_BACKUPS) -> list[Path]:
    """The log's files that exist, oldest first (``output.log.3`` .. ``output.log``)."""
    names = [path.with_name(f"{path.name}.{i}") for i in range(backups, 0, -1)] + [path]
    return [p for p in names if p.is_file()]


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
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - held open until close()
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
        self._file = open(self.path, "ab")  # noqa: SIM115
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


def tail(
    path: Path, lines: int, backups: int = DEFAULT_BACKUPS, max_bytes: int = MAX_TAIL_BYTES
) -> list[str]:
    """The last ``lines`` lines of the log, across rotated files, reading back from the end at
    most ``max_bytes`` (blocking: call it in a thread from async code)."""
    return _tail(path, lines, backups, live_end=None, max_bytes=max_bytes)


def _tail(
    path: Path, lines: int, backups: int, live_end: int | None, max_bytes: int = MAX_TAIL_BYTES
) -> list[str]:
    if lines <= 0:
        return []
    chunks: list[bytes] = []
    newlines = 0
    size = 0
    cut = False
    blocks = _blocks_backwards(path, backups, live_end)
    try:
        for block in blocks:
            chunks.append(block)
            newlines += block.count(b"\n")
            size += len(block)
            if newlines > lines:
                break
            if size >= max_bytes:
                excess = size - max_bytes
                chunks[-1] = chunks[-1][excess:]
                cut = excess > 0 or next(blocks, None) is not None
                break
    finally:
        blocks.close()
    found = b"".join(reversed(chunks)).decode("utf-8", errors="replace").splitlines()
    if cut and len(found) > 1:
        found = found[1:]  # the oldest line was cut by the byte bound
    return found[-lines:]


def _blocks_backwards(
    path: Path, backups: int, live_end: int | None
) -> Generator[bytes, None, None]:
    """The log's bytes in blocks from the end back, newest file first; the live file up to
    ``live_end`` when given."""
    for file in reversed(log_files(path, backups)):
        try:
            with open(file, "rb") as f:
                pos = f.seek(0, os.SEEK_END)
                if file == path and live_end is not None:
                    pos = min(pos, live_end)
                while pos > 0:
                    step = min(_BLOCK, pos)
                    pos -= step
                    f.seek(pos)
                    yield f.read(step)
        except FileNotFoundError:
            continue  # rotated away while we looked


class _LiveReader:
    """The live file as ``follow`` reads it: one block at a time, reopened after a rotation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: BinaryIO | None = None

    def open(self) -> int | None:
        """Open the live file if there is one; where reading it starts (its end)."""
        with contextlib.suppress(FileNotFoundError):
            self._handle = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        return self._handle.seek(0, os.SEEK_END) if self._handle is not None else None

    def read(self) -> bytes | None:
        """Up to one block of new bytes; ``b""`` when there is none yet, None when the file was
        rotated away after its last byte was read (the new one is read next)."""
        if self._handle is None:
            try:
                self._handle = open(self.path, "rb")  # noqa: SIM115 - closed in close()
            except FileNotFoundError:
                return b""
        data = self._handle.read(_BLOCK)
        if data or not _rotated(self.path, self._handle):
            return data
        self.close()
        return None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


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
    new one. Files are read in a thread, a block at a time, only as fast as the lines are taken,
    so a slow reader holds the log on disk rather than in memory.
    """
    live = _LiveReader(path)
    pending = b""
    try:
        # Lines up to where the live file was opened come from the tail; the rest as they come.
        live_end = await asyncio.to_thread(live.open)
        for line in await asyncio.to_thread(_tail, path, from_lines, backups, live_end):
            yield line
        while True:
            finished = done()
            data = await asyncio.to_thread(live.read)
            if data is None:
                continue  # rotated: on to the new file at once
            if data:
                *complete, pending = (pending + data).split(b"\n")
                if len(pending) >= MAX_LINE_BYTES:
                    complete.append(pending)
                    pending = b""
                for raw in complete:
                    yield raw.decode("utf-8", errors="replace").rstrip("\r")
                continue
            if finished:
                if pending:
                    yield pending.decode("utf-8", errors="replace")
                return
            await asyncio.sleep(poll_s)
    finally:
        live.close()


def _rotated(path: Path, handle: BinaryIO) -> bool:
    """Whether ``path`` now names another file than the one ``handle`` reads."""
    try:
        current = os.stat(path)
        opened = os.fstat(handle.fileno())
    except OSError:
        return False
    return (current.st_ino, current.st_dev) != (opened.st_ino, opened.st_dev)
