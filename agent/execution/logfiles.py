"""A job's output log: size-rotated files, and readers for the last lines and for following it.

The live file is ``output.log``; when a write would take it past ``max_bytes`` it becomes
``output.log.1`` (the older ones shift to ``.2`` .. ``.N`` and the oldest is dropped), so a job
never holds more than ``max_bytes * (backups + 1)`` on disk plus one write.

The log lives in the job's folder, which the job (its user) may write: a job could leave a
symlink, a hard link or a FIFO where the agent expects its log. So the agent opens the files
without following symlinks and without blocking, writes only a regular file it owns with a single
link (anything else is removed first), reads only regular files it owns, and creates them 0600.

Readers hold one block whatever the log holds: :class:`TailReader` finds where the last lines
start by reading back from the end, at most ``MAX_TAIL_BYTES`` (the API refuses more than
``MAX_TAIL_LINES`` lines), then reads forward a block at a time; ``follow`` does the same and
then reads the live file a block at a time, holding at most ``MAX_LINE_BYTES`` of an
unfinished line. Both go only as fast as their reader takes the blocks.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

LOG_NAME: Final = "output.log"
DEFAULT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_BACKUPS: Final = 3
_BLOCK: Final = 64 * 1024
MAX_TAIL_LINES: Final = 10_000
"""The most lines one log request may ask for."""
MAX_TAIL_BYTES: Final = 4 * 1024 * 1024
"""The most a tail covers, whatever the lines asked: 10,000 lines of ~400 bytes. Past it the
oldest (cut) line is left out, so a job printing one endless line costs a request no more."""
MAX_LINE_BYTES: Final = 64 * 1024
"""``follow`` yields a longer line in pieces of this size instead of holding it whole."""
Earlier = Callable[[list[str]], list[str]]
"""What ``follow`` yields of the lines the log held when it began (the rest come as written)."""


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


def tail(
    path: Path, lines: int, backups: int = DEFAULT_BACKUPS, max_bytes: int = MAX_TAIL_BYTES
) -> list[str]:
    """The last ``lines`` lines of the log, across rotated files, at most ``max_bytes`` of them
    (blocking: call it in a thread from async code)."""
    if lines <= 0:
        return []
    with TailReader(path, lines, backups, max_bytes) as reader:
        data = b"".join(iter(reader.read, b""))
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


@dataclass(slots=True)
class _Span:
    file: BinaryIO
    start: int
    end: int


class TailReader:
    """The last ``lines`` lines of a log as bytes, read forward a block at a time.

    Opening finds where they start by reading back from the end in blocks, at most
    ``max_bytes`` (past it the oldest line, cut, is left out; a line longer than that comes as
    its last ``max_bytes``). The files stay open, so a rotation meanwhile changes nothing, and
    nothing is held in memory but the block being read. Blocking: use it from a thread.
    """

    def __init__(
        self,
        path: Path,
        lines: int,
        backups: int = DEFAULT_BACKUPS,
        max_bytes: int = MAX_TAIL_BYTES,
        *,
        live_end: int | None = None,
    ) -> None:
        self._spans: list[_Span] = []
        """What is left to read, oldest first; ``live_end``: the live file up to there."""
        try:
            for file in log_files(path, backups):
                f = _open_to_read(file)
                if f is not None:  # else rotated away while we looked, or not a file of ours
                    end = f.seek(0, os.SEEK_END)
                    if file == path and live_end is not None:
                        end = min(end, live_end)
                    self._spans.append(_Span(f, 0, end))
            self._seek_start(max(lines, 0), max_bytes)
        except BaseException:
            self.close()
            raise

    def _seek_start(self, lines: int, max_bytes: int) -> None:
        """Move the start back from the end past ``lines`` line ends (the very last byte's,
        if it ends a line, not counted), or to the first line end past ``max_bytes``."""
        if lines == 0:
            self._start_at(len(self._spans), 0)
            return
        budget = max_bytes
        first_end: tuple[int, int] | None = None
        """Just past the earliest line end seen: where the first whole line read back starts."""
        last_byte = True
        for index in reversed(range(len(self._spans))):
            span = self._spans[index]
            pos = span.end
            while pos > 0:
                if budget == 0:
                    self._start_at(*(first_end or (index, pos)))
                    return
                step = min(_BLOCK, pos, budget)
                pos -= step
                budget -= step
                span.file.seek(pos)
                block = span.file.read(step)
                if last_byte and block.endswith(b"\n"):
                    block = block[:-1]
                last_byte = False
                found = block.count(b"\n")
                if found >= lines:
                    cut = len(block)
                    for _ in range(lines):
                        cut = block.rfind(b"\n", 0, cut)
                    self._start_at(index, pos + cut + 1)
                    return
                lines -= found
                if found:
                    first_end = (index, pos + block.find(b"\n") + 1)
        self._start_at(0, 0)

    def _start_at(self, index: int, offset: int) -> None:
        for span in self._spans[:index]:
            span.file.close()
        del self._spans[:index]
        if self._spans:
            self._spans[0].start = offset

    def read(self, size: int = _BLOCK) -> bytes:
        """Up to ``size`` more bytes; ``b""`` once all has been read."""
        while self._spans:
            span = self._spans[0]
            if span.start < span.end:
                span.file.seek(span.start)
                data = span.file.read(min(size, span.end - span.start))
                if data:
                    span.start += len(data)
                    return data
            span.file.close()
            del self._spans[0]
        return b""

    def close(self) -> None:
        for span in self._spans:
            span.file.close()
        self._spans.clear()

    def __enter__(self) -> TailReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Lines:
    """Splits blocks of a log into lines, holding at most ``MAX_LINE_BYTES`` of an unfinished
    one (a longer one is given in pieces)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, block: bytes) -> list[str]:
        *complete, self._pending = (self._pending + block).split(b"\n")
        if len(self._pending) >= MAX_LINE_BYTES:
            complete.append(self._pending)
            self._pending = b""
        return [raw.decode("utf-8", errors="replace").rstrip("\r") for raw in complete]

    def rest(self) -> str | None:
        """The unfinished last line, if any."""
        return self._pending.decode("utf-8", errors="replace") if self._pending else None


class _LiveReader:
    """The live file as ``follow`` reads it: one block at a time, reopened after a rotation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: BinaryIO | None = None

    def open(self) -> int | None:
        """Open the live file if there is one; where reading it starts (its end)."""
        self._handle = _open_to_read(self.path)
        return self._handle.seek(0, os.SEEK_END) if self._handle is not None else None

    def read(self) -> bytes | None:
        """Up to one block of new bytes; ``b""`` when there is none yet, None when the file was
        rotated away after its last byte was read (the new one is read next)."""
        if self._handle is None:
            self._handle = _open_to_read(self.path)
            if self._handle is None:
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
    earlier: Earlier | None = None,
) -> AsyncIterator[str]:
    """Yield the log's lines as they are written, starting with the last ``from_lines``
    (``earlier``: those given as one list, and the lines it answers yielded instead: at most
    ``MAX_TAIL_BYTES`` of them are held).

    Ends once ``done()`` is true and everything written has been yielded; a last line without a
    newline is yielded then. Survives rotation: the rest of the rotated file is read before the
    new one. Files are read in a thread, a block at a time, only as fast as the lines are taken,
    so a slow reader holds the log on disk rather than in memory.
    """
    live = _LiveReader(path)
    lines = _Lines()
    try:
        # Lines up to where the live file was opened come from the tail; the rest as they come.
        live_end = await asyncio.to_thread(live.open)
        with await asyncio.to_thread(
            TailReader, path, from_lines, backups, live_end=live_end
        ) as tail_reader:
            held: list[str] = []
            while block := await asyncio.to_thread(tail_reader.read):
                if earlier is not None:
                    held += lines.feed(block)
                    continue
                for line in lines.feed(block):
                    yield line
        for line in earlier(held) if earlier is not None else ():
            yield line
        while True:
            finished = done()
            data = await asyncio.to_thread(live.read)
            if data is None:
                continue  # rotated: on to the new file at once
            if data:
                for line in lines.feed(data):
                    yield line
                continue
            if finished:
                if (last := lines.rest()) is not None:
                    yield last
                return
            await asyncio.sleep(poll_s)
    finally:
        live.close()


def _rotated(path: Path, handle: BinaryIO) -> bool:
    """Whether ``path`` now names another file than the one ``handle`` reads."""
    try:
        current = os.lstat(path)
        opened = os.fstat(handle.fileno())
    except OSError:
        return False
    return (current.st_ino, current.st_dev) != (opened.st_ino, opened.st_dev)


_MARKER = re.compile(r"^\[shoal\] attempt (\d+) (starting|exited|stopping|cannot)\b")


def lines_of_attempt(lines: Iterable[str], attempt: int) -> Iterator[str]:
    """The lines of one attempt in a job's log, by the ``[shoal] attempt N ...`` markers the
    executor writes around each attempt (its start, stop and end lines included). Lines before
    the first marker seen belong to the attempt that marker ends, if it is an end."""
    held: list[str] = []
    current: int | None = None
    for line in lines:
        found = _MARKER.match(line)
        if found is not None:
            n, what = int(found.group(1)), found.group(2)
            if current is None and what != "starting" and n == attempt:
                yield from held
            held.clear()
            current = n
        elif current is None:
            held.append(line)
            continue
        if current == attempt:
            yield line
