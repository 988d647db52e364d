"""A job's working folder as content: packed on the submitter's machine, copied out on a runner.

``shoal submit --workdir DIR`` packs ``DIR`` into a manifest of kind ``workdir``
(:func:`pack_workdir`): every regular file below it (no link followed: :mod:`agent.content.walk`)
except ``.git/`` and what a ``.gitignore`` or ``.shoalignore`` excludes. Each ignore file applies to
the folder it is in and those below, in git's pattern language (``pathspec``); a file is left out
when any of them matches it. What is left must fit under a cap (:data:`DEFAULT_MAX_BYTES`), or the
pack is refused in one line that says how much it holds.

The manifest's digest goes into the signed spec (``workdir_digest``); the runner fetches the
content like any other, checks it against that digest (the fetcher refuses a manifest or a chunk
that does not match) and copies it into the job's folder (:func:`copy_out`): the job starts inside
``<job folder>/work``, writable, its own.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agent.content.build import Stamp, _build
from agent.content.manifest import ContentError, ContentLimits, ContentManifest
from agent.content.walk import Found, WalkCount, walk_files

DEFAULT_MAX_BYTES: Final = 512 << 20
"""512 MiB: a working folder is code and small inputs; datasets travel as datasets."""
MAX_FILES: Final = 100_000
WORKDIR_CHUNK_BYTES: Final = 256 << 10
"""256 KiB: a working folder's chunks go up in operator commands (1 MiB at most), a few at a
time."""
IGNORE_FILES: Final = (".gitignore", ".shoalignore")
ALWAYS_LEFT_OUT: Final = (".git",)
PENDING_DIGEST: Final = "0" * 64
"""A spec's ``workdir_digest`` before its folder is packed (the submitter's tools set the real
one before they sign)."""
COPY_THREADS: Final = 8
"""Files copied into a job's folder at once."""
WORK_DIR_NAME: Final = "work"
"""The job's copy of its working folder, inside its folder."""


class _NoCache:
    """The submitter hashes its folder afresh each time (a working folder is small)."""

    def cached_chunks(self, path: str, stamp: Stamp, chunk_bytes: int) -> tuple[str, ...] | None:
        return None

    def remember_chunks(
        self,
        fresh: Sequence[tuple[str, Stamp, int, tuple[str, ...]]],
        seen: Collection[str],
        drop_under: str,
    ) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Packed:
    manifest: ContentManifest
    ignored: int
    """Files an ignore file or ``.git`` left out."""
    skipped: int
    """Entries passed over: links, special files, unreadable ones."""


class IgnoreRules:
    """The ignore files of one folder tree: ``folder -> spec`` (``""`` is the top)."""

    def __init__(self, top: Path) -> None:
        import pathspec  # the spec's patterns are git's; imported only where a folder is packed

        self._specs: dict[str, Any] = {}
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d not in ALWAYS_LEFT_OUT]
            rel = os.path.relpath(root, top).replace(os.sep, "/")
            lines: list[str] = []
            for name in IGNORE_FILES:
                if name in files and not os.path.islink(os.path.join(root, name)):
                    try:
                        with open(os.path.join(root, name), encoding="utf-8") as f:
                            lines += f.read().splitlines()
                    except (OSError, UnicodeDecodeError) as exc:
                        raise ContentError(f"{os.path.join(root, name)}: {exc}") from None
            if lines:
                self._specs["" if rel == "." else rel] = pathspec.GitIgnoreSpec.from_lines(lines)

    def ignored(self, rel: str) -> bool:
        """Whether file ``rel`` (``/``-separated, below the top) is left out."""
        parts = rel.split("/")
        if any(p in ALWAYS_LEFT_OUT for p in parts[:-1]):
            return True
        for depth in range(len(parts)):
            spec = self._specs.get("/".join(parts[:depth]))
            if spec is not None and spec.match_file("/".join(parts[depth:])):
                return True
        return False


def pack_workdir(top: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Packed:
    """The manifest of working folder ``top``; :class:`ContentError` (one line) when it is not a
    folder, holds more than ``max_bytes`` once ignored files are left out, or cannot be read."""
    if not top.is_dir():
        raise ContentError(f"--workdir {top}: not a folder")
    rules = IgnoreRules(top)
    count = WalkCount()
    kept: list[Found] = []
    ignored = 0
    total = 0

    def kept_files() -> Iterator[Found]:
        nonlocal ignored, total
        for f in walk_files(top, count):
            if rules.ignored(f.rel):
                ignored += 1
                continue
            total += f.st.st_size
            if total > max_bytes:
                raise ContentError(
                    f"--workdir {top}: over {_mib(total)} once .gitignore and .shoalignore are"
                    f" applied, more than the cap of {_mib(max_bytes)}: leave out what the job"
                    " does not need (a .shoalignore) or send it as a dataset"
                )
            kept.append(f)
            yield f

    limits = ContentLimits(max_total_bytes=max_bytes, max_files=MAX_FILES)
    built = _build(
        kept_files(),
        top,
        str(top),
        top.name or "workdir",
        "workdir",
        _NoCache(),
        WORKDIR_CHUNK_BYTES,
        limits,
        count,
    )
    return Packed(built.manifest, ignored, count.skipped)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):.1f} MiB"


def read_chunks(top: Path, manifest: ContentManifest, wanted: Collection[str]) -> Iterator[Any]:
    """``(ChunkAt, bytes)`` of each chunk digest in ``wanted``, read from ``top`` (the folder
    the manifest was packed from), once each."""
    done: set[str] = set()
    for at in manifest.chunk_places():
        if at.digest not in wanted or at.digest in done:
            continue
        path = top / manifest.files[at.index].path
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            data = os.pread(fd, at.length_bytes, at.offset_bytes) if at.length_bytes else b""
        finally:
            os.close(fd)
        done.add(at.digest)
        yield at, data


def copy_out(tree: Path, dest: Path) -> None:
    """``dest``: a fresh, writable copy of ``tree`` (a complete manifest's folder in the store);
    folders 0755, files with their mode plus the owner's write bit. No link is followed."""
    if os.path.lexists(dest):
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        else:
            os.unlink(dest)
    os.mkdir(dest, 0o755)
    copies: list[tuple[Path, Path, int]] = []
    for root, dirs, files in os.walk(tree):
        rel = Path(root).relative_to(tree)
        for d in dirs:
            if not os.path.islink(Path(root) / d):
                os.mkdir(dest / rel / d, 0o755)
        for f in files:
            src = Path(root) / f
            st = os.lstat(src)
            if stat.S_ISREG(st.st_mode):
                copies.append((src, dest / rel / f, (st.st_mode & 0o777) | stat.S_IWUSR))
    if len(copies) < COPY_THREADS * 4:
        for copy in copies:
            _copy(*copy)
        return
    # a folder of many small files: the copies wait on the disk more than on Python
    with ThreadPoolExecutor(COPY_THREADS) as pool:
        for _ in pool.map(lambda c: _copy(*c), copies):
            pass


def _copy(src: Path, dst: Path, mode: int) -> None:
    shutil.copyfile(src, dst, follow_symlinks=False)
    os.chmod(dst, mode)


def chown_tree(top: Path, uid: int, gid: int) -> None:
    """Give ``top`` and everything below it (no link followed) to ``uid:gid``."""
    os.chown(top, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
