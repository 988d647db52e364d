"""A manifest built from a folder on this node, in place: nothing is copied into the store.

The folder is walked without following links (:mod:`agent.content.walk`) and each regular file
hashed in chunks. Hashes are cached by (path, size, mtime_ns, inode) in the store's index
(:class:`HashCache`), so building the manifest of an unchanged folder again reads no file: a
rescan of a terabyte dataset costs one ``lstat`` per file.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from agent.content.manifest import (
    DEFAULT_CHUNK_BYTES,
    ContentError,
    ContentFile,
    ContentLimits,
    ContentManifest,
    Kind,
    check_content,
    chunk_count,
)
from agent.content.walk import READ_FLAGS, Found, WalkCount, walk_files

_MODE_BITS: Final = 0o777

Stamp = tuple[int, int, int]
"""(size, mtime_ns, inode) of a file as ``lstat`` saw it."""


class HashCache(Protocol):
    def cached_chunks(self, path: str, stamp: Stamp, chunk_bytes: int) -> tuple[str, ...] | None:
        """The chunk digests of ``path`` last hashed at ``stamp`` and ``chunk_bytes``."""
        ...

    def remember_chunks(
        self,
        fresh: Sequence[tuple[str, Stamp, int, tuple[str, ...]]],
        seen: Collection[str],
        drop_under: str,
    ) -> None:
        """Keep the (path, stamp, chunk_bytes, chunks) rows of the files just hashed, and forget
        the paths under the folder ``drop_under`` that are not in ``seen`` (files gone since);
        an unchanged folder writes nothing."""
        ...


@dataclass(frozen=True, slots=True)
class Built:
    manifest: ContentManifest
    skipped: int
    """Entries left out: links, special files, too deep, unsafe names, unreadable files."""
    hashed_bytes: int
    """Bytes read and hashed (0 when every file was in the cache)."""


def build_manifest(
    top: Path,
    name: str,
    kind: Kind,
    cache: HashCache,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    limits: ContentLimits | None = None,
) -> Built:
    """The manifest of ``top`` (a folder, or one regular file: a manifest of that one file);
    raises :class:`ContentError` when it is over ``limits`` or cannot be read."""
    limits = limits or ContentLimits()
    count = WalkCount()
    try:
        st = os.lstat(top)
    except OSError as exc:
        raise ContentError(f"{top}: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        fd = os.open(top.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            one = [Found(top.name, st, fd, top.name)]
            return _build(one, top.parent, str(top), name, kind, cache, chunk_bytes, limits, count)
        finally:
            os.close(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise ContentError(f"{top}: not a folder nor a regular file")
    walk = walk_files(top, count)
    return _build(walk, top, str(top), name, kind, cache, chunk_bytes, limits, count)


def _build(
    found: Iterable[Found],
    base: Path,
    drop_under: str,
    name: str,
    kind: Kind,
    cache: HashCache,
    chunk_bytes: int,
    limits: ContentLimits,
    count: WalkCount,
) -> Built:
    files: list[ContentFile] = []
    fresh: list[tuple[str, Stamp, int, tuple[str, ...]]] = []
    seen: set[str] = set()
    hashed = 0
    total = 0
    for f in found:
        total += f.st.st_size
        if len(files) >= limits.max_files or total > limits.max_total_bytes:
            raise ContentError(
                f"{base}: over the limits ({limits.max_files} files,"
                f" {limits.max_total_bytes} bytes)"
            )
        path = str(base / f.rel)
        stamp: Stamp = (f.st.st_size, f.st.st_mtime_ns, f.st.st_ino)
        chunks = cache.cached_chunks(path, stamp, chunk_bytes)
        if chunks is None:
            chunks = _hash_file(f, chunk_bytes)
            if chunks is None:
                count.skipped += 1
                continue
            hashed += f.st.st_size
            fresh.append((path, stamp, chunk_bytes, chunks))
        seen.add(path)
        files.append(ContentFile(f.rel, f.st.st_size, f.st.st_mode & _MODE_BITS, chunks))
    files.sort(key=lambda f: f.path)
    manifest = ContentManifest(kind, name, chunk_bytes, tuple(files))
    check_content(manifest, limits)
    cache.remember_chunks(fresh, seen, drop_under)
    return Built(manifest, count.skipped, hashed)


def _hash_file(f: Found, chunk_bytes: int) -> tuple[str, ...] | None:
    """The chunk digests of one file, or ``None`` when it cannot be read or changed size."""
    try:
        fd = os.open(f.name, READ_FLAGS, dir_fd=f.dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        out: list[str] = []
        for n in range(chunk_count(f.st.st_size, chunk_bytes)):
            want = max(0, min(chunk_bytes, f.st.st_size - n * chunk_bytes))
            if _in_hole(fd, n * chunk_bytes, want):
                out.append(zeros_digest(want))
                continue
            data = os.pread(fd, want, n * chunk_bytes) if want else b""
            if len(data) != want:
                return None
            out.append(hashlib.sha256(data).hexdigest())
        return tuple(out)
    except OSError:
        return None
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=8)
def zeros_digest(length_bytes: int) -> str:
    """The digest of a chunk of ``length_bytes`` zero bytes (a hole of a sparse file)."""
    return hashlib.sha256(bytes(length_bytes)).hexdigest()


def _in_hole(fd: int, offset_bytes: int, length_bytes: int) -> bool:
    """Whether the ``length_bytes`` from ``offset_bytes`` are all a hole of a sparse file (they
    read as zeros: hashed without reading them), where the OS can say (``SEEK_DATA``)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None or length_bytes == 0:
        return False
    try:
        data_at = os.lseek(fd, offset_bytes, seek_data)
    except OSError as exc:  # ENXIO: no data at or after the offset
        return exc.errno == errno.ENXIO
    return data_at >= offset_bytes + length_bytes
