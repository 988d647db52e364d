"""Checkpoint folders on disk: a job's folder read safely into the store, restored for an attempt.

A job's checkpoint folder (``jobs/<id>/checkpoint/``) belongs to the job user. The agent reads it
without following links (:mod:`agent.content.walk`: each folder opened relative to its parent,
``O_NOFOLLOW``), and only the regular files of the job user: a symlink, a FIFO, a device or
another user's file is left out of the manifest (and counted in ``skipped``). Chunk digests are
cached by (path, size, mtime, inode) in the store's hash cache, so a folder read again hashes only
what changed. :func:`restore` copies a checkpoint held whole in the store (its tree of hardlinks)
into a job's folder, as the job user, after clearing what was there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Final

from agent.content.build import Built, HashCache, _build
from agent.content.manifest import (
    ChunkAt,
    ContentError,
    ContentLimits,
    ContentManifest,
    path_problem,
)
from agent.content.walk import READ_FLAGS, Found, WalkCount, walk_files
from agent.execution.jobuser import JobUser, prepare_job_folder

CHECKPOINT_CHUNK_BYTES: Final = 1 << 20
"""1 MiB: a checkpoint that changed little since the last one shares its unchanged chunks."""
LIMITS: Final = ContentLimits(max_total_bytes=64 << 30, max_files=100_000)
"""The largest checkpoint read into the store."""
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
_COPY_BLOCK: Final = 1 << 20


def build_checkpoint(folder: Path, job_id: str, uid: int | None, cache: HashCache) -> Built:
    """The manifest (kind ``checkpoint``, named by the job) of ``folder``: its regular files
    of user ``uid`` (``None``: any user), no link followed; raises :class:`ContentError` when
    it is over :data:`LIMITS`."""
    count = WalkCount()

    def owned() -> Iterator[Found]:
        for f in walk_files(folder, count):
            if uid is None or sys.platform == "win32" or f.st.st_uid == uid:
                yield f
            else:
                count.skipped += 1

    return _build(
        owned(),
        folder,
        str(folder),
        job_id,
        "checkpoint",
        cache,
        CHECKPOINT_CHUNK_BYTES,
        LIMITS,
        count,
    )


def read_chunks(
    folder: Path, manifest: ContentManifest, wanted: Collection[str]
) -> Iterator[tuple[ChunkAt, bytes]]:
    """``(ChunkAt, bytes)`` of each chunk digest in ``wanted``, read from ``folder`` without
    following links, once each (the store checks each against its digest: a file the job
    rewrote meanwhile is refused, never kept as the checkpoint)."""
    done: set[str] = set()
    for at in manifest.chunk_places():
        if at.digest not in wanted or at.digest in done:
            continue
        fd = _open_below(folder, manifest.files[at.index].path, READ_FLAGS)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ContentError(f"{manifest.files[at.index].path} is no longer a file")
            data = os.pread(fd, at.length_bytes, at.offset_bytes) if at.length_bytes else b""
        finally:
            os.close(fd)
        done.add(at.digest)
        yield at, data


def stamp(folder: Path, max_files: int = LIMITS.max_files) -> tuple[tuple[str, int, int], ...]:
    """A cheap fingerprint of the folder (names, sizes, mtimes, by lstat): it changes when the
    job writes a checkpoint."""
    out: list[tuple[str, int, int]] = []
    todo = [(folder, "")]
    while todo and len(out) <= max_files:
        path, prefix = todo.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and prefix.count("/") < 31:
                todo.append((Path(e.path), prefix + e.name + "/"))
            elif stat.S_ISREG(st.st_mode):
                out.append((prefix + e.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def _open_below(folder: Path, rel: str, flags: int, mode: int = 0o600) -> int:
    """Open ``folder/rel`` walking one component at a time, never following a link."""
    problem = path_problem(rel)
    if problem is not None:
        raise ContentError(problem)
    parts = rel.split("/")
    try:
        fd = os.open(folder, _DIR_FLAGS)
    except OSError as exc:
        raise ContentError(f"cannot open {folder}: {exc.strerror}") from None
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not flags & os.O_CREAT:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=fd)
    except OSError as exc:
        raise ContentError(f"cannot open {rel}: {exc.strerror}") from None
    finally:
        os.close(fd)


def restore(tree: Path, manifest: ContentManifest, dest: Path, user: JobUser) -> None:
    """Put the checkpoint ``manifest`` (its files in ``tree``, the store's) into ``dest`` (a
    job's checkpoint folder), as the job user, after clearing whatever was there."""
    clear_folder(dest, user)
    for f in manifest.files:
        parts = f.path.split("/")
        for i in range(1, len(parts)):
            prepare_job_folder(dest.joinpath(*parts[:i]), user)
        out = _open_below(dest, f.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, f.mode | 0o600)
        try:
            if user.switch:
                os.fchown(out, user.uid, user.gid)
            inp = _open_below(tree, f.path, READ_FLAGS)
            try:
                while block := os.read(inp, _COPY_BLOCK):
                    os.write(out, block)
            finally:
                os.close(inp)
        finally:
            os.close(out)


def clear_folder(dest: Path, user: JobUser) -> None:
    """Empty a job's checkpoint folder (what an earlier attempt left is never resumed)."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)  # does not follow the links it finds inside
    prepare_job_folder(dest, user)
