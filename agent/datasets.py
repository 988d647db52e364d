"""The datasets an agent holds: the names in its config, and the entries of its datasets folder.

Every entry directly under ``datasets_dir`` (a folder or a file, not starting with ``.``) is a
dataset of that name; its size is the bytes of the regular files under it. The entry itself may be
a symbolic link (a lab's ``/data/imagenet -> /mnt/nfs/imagenet`` is a dataset); links inside it
are not followed, so a dataset is counted once and never loops. A walk stops after
:data:`MAX_FILES_PER_DATASET` files and reports what it counted so far (a lower bound, said in
the log). The folder is scanned again every ``datasets_rescan_s``, off the event loop.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from agent.wire.place import dataset_name_problem

log = logging.getLogger("shoal.agent")

MAX_FILES_PER_DATASET: Final = 200_000


def scan_datasets(folder: Path | None, named: Iterable[str] = ()) -> dict[str, int]:
    """Dataset name -> bytes: those under ``folder`` measured, those only ``named`` as 0."""
    held = dict.fromkeys(named, 0)
    if folder is None:
        return held
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        log.warning("datasets folder %s: %s", folder, exc.strerror or exc)
        return held
    for entry in entries:
        if entry.name.startswith(".") or dataset_name_problem(entry.name) is not None:
            continue
        held[entry.name] = _size_bytes(Path(entry.path))
    return held


def _size_bytes(path: Path) -> int:
    try:
        if path.is_file():
            return path.stat().st_size
        if not path.is_dir():
            return 0
    except OSError:
        return 0
    total, files = 0, 0
    for root, _dirs, names in os.walk(path, followlinks=False):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
            files += 1
            if files >= MAX_FILES_PER_DATASET:
                log.warning("dataset %s: over %d files, size counted so far", path, files)
                return total
    return total
