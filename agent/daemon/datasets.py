"""The datasets an agent holds: the names in its config, and the entries of its datasets folder.

Every entry directly under ``datasets_dir`` (a folder or a file) whose name is a dataset name
(``agent.wire.place.dataset_name_problem``: letters, digits, ``.``, ``_``, ``-``; not starting
with ``.`` or ``-``) is a dataset of that name; its size is the bytes of the regular files under
it. No link leads out of the folder: an entry that is a symbolic link counts only when it points
at another entry inside the folder, and links inside a dataset are never followed, so a dataset is
counted once, never loops, and the scan never reaches ``/etc``, another agent's folder or the
whole disk (a lab that keeps a dataset elsewhere bind-mounts it into the folder, or names it in
``datasets``). An entry refused, for its name or as a link out, is said in the log once, with its
reason, and counted (``shoal_datasets_refused_total``); entries starting with ``.`` (a download
in progress) are passed over silently. A walk stops after :data:`MAX_FILES_PER_DATASET` files and
reports what it counted so far (a lower bound, said in the log). The folder is scanned again
every ``datasets_rescan_s``, off the event loop.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from agent.content.walk import WalkCount, walk_files
from agent.wire.place import dataset_name_problem

log = logging.getLogger("shoal.agent")

MAX_FILES_PER_DATASET: Final = 200_000
_SAID_KEPT: Final = 10_000

RefusedReason = Literal["name", "link_out"]


@dataclass(frozen=True, slots=True)
class Refused:
    """One entry of the folder that is not a dataset."""

    entry: str
    reason: RefusedReason
    why: str
    """One line, for the log."""


@dataclass(frozen=True, slots=True)
class DatasetScan:
    """What one scan found."""

    held: dict[str, int]
    """Dataset name -> bytes: those in the folder measured, those only named as 0."""
    refused: tuple[Refused, ...] = ()
    paths: dict[str, Path] = field(default_factory=dict)
    """Dataset name -> where it is (a link inside the folder resolved)."""


def scan_datasets(
    folder: Path | None, named: Iterable[str] = (), measure: bool = True
) -> DatasetScan:
    """Measure the datasets under ``folder`` (see the module docstring; ``measure=False``: find
    them, their sizes left 0); nothing is logged."""
    held = dict.fromkeys(named, 0)
    if folder is None:
        return DatasetScan(held)
    try:
        root = os.path.realpath(folder)
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        log.warning("datasets folder %s: %s", folder, exc.strerror or exc)
        return DatasetScan(held)
    refused: list[Refused] = []
    paths: dict[str, Path] = {}
    for entry in entries:
        if entry.name.startswith("."):
            continue
        problem = dataset_name_problem(entry.name)
        if problem is not None:
            refused.append(Refused(entry.name, "name", f"{problem}: not gossiped"))
            continue
        path = entry.path
        if entry.is_symlink():
            target = os.path.realpath(path)
            if target == root or os.path.commonpath((root, target)) != root:
                why = (
                    f"dataset {entry.name!r} is a link out of the folder: not measured, not"
                    " gossiped (bind-mount it into the folder, or name it in datasets)"
                )
                refused.append(Refused(entry.name, "link_out", why))
                continue
            path = target
        paths[entry.name] = Path(path)
        held[entry.name] = _size_bytes(Path(path)) if measure else 0
    return DatasetScan(held, tuple(refused), paths)


class DatasetScanner:
    """Scans one agent's datasets folder, saying each refused entry once and counting it."""

    def __init__(self, folder: Path | None, named: Iterable[str] = ()) -> None:
        self.folder = folder
        self.named = tuple(named)
        self.refused: Counter[RefusedReason] = Counter()
        """Entries refused, each counted once, by reason."""
        self._said: set[tuple[str, RefusedReason]] = set()

    def scan(self) -> dict[str, int]:
        """Dataset name -> bytes (blocking: run it off the event loop)."""
        return self._said_once(scan_datasets(self.folder, self.named)).held

    def scan_paths(self) -> dict[str, Path]:
        """Dataset name -> where it is in the folder, unmeasured (the content store indexes
        each one: ``agent.daemon.datastore``); blocking."""
        return self._said_once(scan_datasets(self.folder, (), measure=False)).paths

    def _said_once(self, found: DatasetScan) -> DatasetScan:
        for r in found.refused:
            if (r.entry, r.reason) in self._said:
                continue
            if len(self._said) >= _SAID_KEPT:
                self._said.clear()
            self._said.add((r.entry, r.reason))
            self.refused[r.reason] += 1
            log.warning("datasets folder %s: %s", self.folder, r.why)
        return found


def _size_bytes(path: Path) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if not stat.S_ISDIR(st.st_mode):
        return 0
    total = 0
    for files, found in enumerate(walk_files(path, WalkCount()), start=1):
        total += found.st.st_size
        if files >= MAX_FILES_PER_DATASET:
            log.warning("dataset %s: over %d files, size counted so far", path, files)
            return total
    return total
