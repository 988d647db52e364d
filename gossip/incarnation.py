"""The highest incarnation a node has used, kept on disk, so that each life starts above the last.

Peers order a member's Alive and records by ``(incarnation, counter)`` and keep the highest they
hold. A life that started at an incarnation no higher than the last one's would be taken for the
older life: its Alive and its records ignored until its counters passed the old ones, or for ever.
The wall clock alone does not prevent that: a restart within the same second, refutations that
raised the last life's incarnation past the clock, or a clock stepped back (NTP) all start a
node at or below what its peers hold.

So the node writes each incarnation here before it uses it (the one it starts at, and each raise
by a refutation), and starts at ``max(highest written + 1, whole seconds of the wall clock)``:
above its every earlier life, and, when its folder was lost, above what peers remember in the
common case (a clock that did not step back).

:func:`boot_incarnation` is the rule; :class:`IncarnationFile` its storage (a decimal number in a
file of mode 0600, replaced atomically and synced to disk).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

INCARNATION_FILE = "incarnation"
"""Its name in a node's data folder."""

MAX_INCARNATION = (1 << 63) - 1
"""The highest incarnation the wire carries (a msgpack int64)."""

_MAX_FILE_BYTES = 32


class IncarnationError(ValueError):
    """The incarnation file cannot be read as one, or written; the message says which and why."""


def boot_incarnation(highest: int | None, floor: int) -> int:
    """The incarnation to start at: past ``highest`` (the last one used, None if unknown) and at
    least ``floor`` (the wall clock in whole seconds)."""
    return floor if highest is None else max(floor, highest + 1)


class IncarnationFile:
    """The highest incarnation this node has used, in the file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int | None:
        """The incarnation written last; None when no file is there (a first start, or a lost
        folder). Raises :class:`IncarnationError` for anything but one number in range."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(_MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise IncarnationError(f"{self.path}: cannot read ({exc.strerror})") from None
        text = raw.decode("ascii", "replace").strip()
        if len(raw) > _MAX_FILE_BYTES or not text.isdigit() or int(text) > MAX_INCARNATION:
            raise IncarnationError(
                f"{self.path}: not an incarnation ({raw[:_MAX_FILE_BYTES]!r}); remove it to start"
                " from the wall clock"
            )
        return int(text)

    def write(self, incarnation: int) -> None:
        """Keep ``incarnation`` as the highest used, durably, before it is used."""
        if not 0 <= incarnation <= MAX_INCARNATION:
            raise ValueError(f"incarnation {incarnation} out of range")
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            if sys.platform != "win32":
                os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, f"{incarnation}\n".encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):  # the rename itself durable, where a folder opens
            dfd = os.open(self.path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def boot(self, floor: int) -> int:
        """The incarnation to start at (:func:`boot_incarnation`), written before it is returned;
        :class:`IncarnationError` when it cannot be read or written."""
        incarnation = boot_incarnation(self.read(), floor)
        try:
            self.write(incarnation)
        except OSError as exc:
            raise IncarnationError(f"{self.path}: cannot write ({exc.strerror})") from None
        return incarnation

    def keep(self, incarnation: int) -> bool:
        """Write a refutation's raise (the core calls this before the Alive carrying it goes
        out); False, logged, when it cannot be written (the core counts it and refutes anyway: a
        live node that did not refute would be declared dead, and a later start still begins at
        least at the wall clock)."""
        try:
            self.write(incarnation)
        except OSError as exc:
            log.error("cannot keep incarnation %d in %s: %s", incarnation, self.path, exc.strerror)
            return False
        return True
