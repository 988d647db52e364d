"""Checkpoint folders on disk: read a job's folder safely, keep copies, restore one for an attempt.

A job's checkpoint folder (``jobs/<id>/checkpoint/``) belongs to the job user. The agent reads it
without following links: each folder is opened relative to its parent (``O_NOFOLLOW``,
``O_DIRECTORY``), each file likewise and only when it is a regular file of the job user; a
symlink, a FIFO, a device or another user's file is left out of the manifest (and counted in
``skipped``). Checksums are cached by (path, size, mtime, inode), so a folder scanned again
hashes only what changed.

The :class:`Vault` (``<data_dir>/checkpoints/<job id>/``, the agent's own, 0700) keeps one
verified copy per job: ``current/`` with ``current.json`` (its manifest), and ``partial/`` with
``partial.json`` while a transfer is under way. A transfer resumes from the bytes ``partial/``
holds; a complete one is checked whole and only then replaces ``current/``. :meth:`Vault.restore`
copies a held checkpoint into a job's folder, as the job user, after clearing what was there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.checkpoints.transfer import (
    ChunkRef,
    FileEntry,
    Frame,
    Manifest,
    Receiver,
    TransferError,
    TransferLimits,
    check_path,
)
from agent.execution.jobuser import JobUser, prepare_job_folder
from agent.job.jobspec import check_job_id
from gossip.fsmodes import ensure_dir

_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
_READ_FLAGS: Final = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
_HASH_BLOCK: Final = 1 << 20


@dataclass(slots=True)
class Scan:
    manifest: Manifest
    skipped: int
    """Entries left out: links, FIFOs, devices, files of another user."""


class FolderReader:
    """Reads checkpoint folders of jobs run as ``uid`` (``None``: any owner), hashing once."""

    def __init__(self, uid: int | None, limits: TransferLimits) -> None:
        self.uid = uid
        self.limits = limits
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int], str]] = {}

    def scan(self, folder: Path, job_id: str, attempt: int) -> Scan:
        """The manifest of ``folder`` (empty when it is missing); raises
        :class:`TransferError` when it is over the limits."""
        files: list[FileEntry] = []
        skipped = 0
        seen: set[tuple[str, str]] = set()
        try:
            top = os.open(folder, _DIR_FLAGS)
        except OSError:
            return Scan(Manifest(job_id, attempt, ()), 0)
        total = 0
        stack: list[tuple[int, str]] = [(top, "")]
        try:
            while stack:
                fd, prefix = stack.pop()
                try:
                    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
                        rel = prefix + entry.name
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            if rel.count("/") >= 31:
                                skipped += 1
                                continue
                            try:
                                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                            except OSError:
                                skipped += 1
                                continue
                            stack.append((sub, rel + "/"))
                            continue
                        if not stat.S_ISREG(st.st_mode) or not self._owned(st):
                            skipped += 1
                            continue
                        try:
                            check_path(rel)
                        except TransferError:
                            skipped += 1
                            continue
                        total += st.st_size
                        if (
                            len(files) >= self.limits.max_files
                            or total > self.limits.max_total_bytes
                        ):
                            raise TransferError(
                                f"checkpoint of {job_id[:8]} is over the limits "
                                f"({self.limits.max_files} files, "
                                f"{self.limits.max_total_bytes} bytes)"
                            )
                        sha = self._hash(str(folder), rel, fd, entry.name, st)
                        if sha is None:
                            skipped += 1
                            continue
                        seen.add((str(folder), rel))
                        files.append(FileEntry(rel, st.st_size, sha))
                finally:
                    os.close(fd)
        finally:
            for fd, _ in stack:
                os.close(fd)
        for key in [k for k in self._cache if k[0] == str(folder) and k not in seen]:
            del self._cache[key]
        files.sort(key=lambda f: f.path)
        return Scan(Manifest(job_id, attempt, tuple(files)), skipped)

    def _owned(self, st: os.stat_result) -> bool:
        return self.uid is None or sys.platform == "win32" or st.st_uid == self.uid

    def _hash(
        self, folder: str, rel: str, dir_fd: int, name: str, st: os.stat_result
    ) -> str | None:
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        held = self._cache.get((folder, rel))
        if held is not None and held[0] == stamp:
            return held[1]
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            h = hashlib.sha256()
            remaining = st.st_size
            while remaining > 0:
                block = os.read(fd, min(_HASH_BLOCK, remaining))
                if not block:
                    break
                h.update(block)
                remaining -= len(block)
        finally:
            os.close(fd)
        sha = h.hexdigest()
        self._cache[(folder, rel)] = (stamp, sha)
        return sha

    def stamp(self, folder: Path) -> tuple[tuple[str, int, int], ...]:
        """A cheap fingerprint of the folder (names, sizes, mtimes, by lstat): it changes when
        the job writes a checkpoint."""
        out: list[tuple[str, int, int]] = []
        todo = [(folder, "")]
        while todo and len(out) <= self.limits.max_files:
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

    def read(self, folder: Path, manifest: Manifest, ref: ChunkRef) -> Frame:
        """One chunk of a file of ``manifest`` in ``folder``, opened without following links."""
        entry = manifest.files[ref.index]
        if ref.length_bytes > self.limits.max_chunk_bytes or ref.length_bytes < 0:
            raise TransferError("chunk over the limit")
        if ref.offset_bytes < 0 or ref.offset_bytes + ref.length_bytes > entry.size_bytes:
            raise TransferError("chunk past the end of the file")
        fd = _open_below(folder, entry.path, _READ_FLAGS)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not self._owned(st):
                raise TransferError(f"{entry.path} is no longer a file of the job")
            data = os.pread(fd, ref.length_bytes, ref.offset_bytes)
        finally:
            os.close(fd)
        if len(data) != ref.length_bytes:
            raise TransferError(f"{entry.path} changed while it was read")
        return Frame(ref.index, ref.offset_bytes, data)


def _open_below(folder: Path, rel: str, flags: int, mode: int = 0o600) -> int:
    """Open ``folder/rel`` walking one component at a time, never following a link."""
    check_path(rel)
    parts = rel.split("/")
    try:
        fd = os.open(folder, _DIR_FLAGS)
    except OSError as exc:
        raise TransferError(f"cannot open {folder}: {exc.strerror}") from None
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
        raise TransferError(f"cannot open {rel}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _sha_of(folder: Path, rel: str) -> str:
    fd = _open_below(folder, rel, _READ_FLAGS)
    h = hashlib.sha256()
    try:
        while block := os.read(fd, _HASH_BLOCK):
            h.update(block)
    finally:
        os.close(fd)
    return h.hexdigest()


class Vault:
    """Copies of checkpoints this agent keeps or receives, one verified copy per job."""

    def __init__(self, data_dir: Path, limits: TransferLimits) -> None:
        self.root = data_dir / "checkpoints"
        self.limits = limits
        self._receivers: dict[str, Receiver] = {}
        self._reader = FolderReader(None, limits)

    def _dir(self, job_id: str) -> Path:
        return self.root / check_job_id(job_id)

    def job_folder(self, job_id: str) -> Path:
        """Everything this vault keeps of the job's checkpoint."""
        return self._dir(job_id)

    def current_folder(self, job_id: str) -> Path:
        return self._dir(job_id) / "current"

    def held(self, job_id: str) -> Manifest | None:
        """The verified copy of the job's checkpoint this agent holds, if any."""
        try:
            doc = json.loads((self._dir(job_id) / "current.json").read_text())
            return Manifest.from_wire(doc, self.limits)
        except (OSError, ValueError):
            return None

    def read(self, job_id: str, manifest: Manifest, ref: ChunkRef) -> Frame:
        return self._reader.read(self.current_folder(job_id), manifest, ref)

    def begin(self, manifest: Manifest) -> tuple[int, ...]:
        """Get ready to receive ``manifest``: the bytes of each file already held (all of them
        when this very checkpoint is held; then only its attempt is updated when newer)."""
        job_id = manifest.job_id
        held = self.held(job_id)
        if held is not None and held.digest == manifest.digest:
            if manifest.attempt > held.attempt:
                self._write_json(self._dir(job_id) / "current.json", manifest)
            self._receivers.pop(job_id, None)
            return tuple(f.size_bytes for f in manifest.files)
        if held is not None and held.attempt > manifest.attempt:
            raise TransferError(
                f"a checkpoint of attempt {held.attempt} is held; attempt {manifest.attempt} "
                "is older"
            )
        base = self._dir(job_id)
        ensure_dir(self.root, 0o700)
        ensure_dir(base, 0o700)
        partial = base / "partial"
        offsets: list[int] = []
        same = False
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((base / "partial.json").read_text())
            same = Manifest.from_wire(doc, self.limits).digest == manifest.digest
        if same:
            for f in manifest.files:
                try:
                    fd = _open_below(partial, f.path, _READ_FLAGS)
                except (TransferError, FileNotFoundError):
                    offsets.append(0)
                    continue
                try:
                    offsets.append(os.fstat(fd).st_size)
                finally:
                    os.close(fd)
        else:
            shutil.rmtree(partial, ignore_errors=True)
            ensure_dir(partial, 0o700)
            self._write_json(base / "partial.json", manifest)
            offsets = self._reuse(manifest, held)
        receiver = Receiver(manifest, self.limits, offsets)
        self._receivers[job_id] = receiver
        if receiver.complete:
            self._commit(receiver)
        return receiver.offsets

    def _reuse(self, manifest: Manifest, held: Manifest | None) -> list[int]:
        """Files of the new checkpoint that the held copy has unchanged are linked from it
        into ``partial/`` (checked again with the rest): only what changed travels."""
        same = {(f.path, f.size_bytes, f.sha256) for f in held.files} if held else set()
        current = self.current_folder(manifest.job_id)
        partial = self._dir(manifest.job_id) / "partial"
        offsets: list[int] = []
        for f in manifest.files:
            if (f.path, f.size_bytes, f.sha256) not in same or f.size_bytes == 0:
                offsets.append(0)
                continue
            try:
                src = _open_below(current, f.path, _READ_FLAGS)
                os.close(src)
                (partial / f.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.link(current / f.path, partial / f.path, follow_symlinks=False)
            except (OSError, TransferError):
                with contextlib.suppress(OSError):
                    (partial / f.path).unlink()
                offsets.append(0)
                continue
            offsets.append(f.size_bytes)
        return offsets

    def put(self, job_id: str, frame: Frame) -> bool:
        """Write one frame of the transfer under way; ``True`` once the copy is complete and
        verified (then it is the held copy). A complete copy that does not match its manifest
        is thrown away and refused."""
        receiver = self._receivers.get(job_id)
        if receiver is None:
            raise TransferError(f"no transfer of {job_id[:8]} under way here; offer it first")
        if receiver.accept(frame):
            entry = receiver.manifest.files[frame.index]
            fd = _open_below(self._dir(job_id) / "partial", entry.path, os.O_WRONLY | os.O_CREAT)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise TransferError(f"{entry.path} is not a file")
                os.ftruncate(fd, frame.offset_bytes)
                os.pwrite(fd, frame.data, frame.offset_bytes)
            finally:
                os.close(fd)
        if receiver.complete:
            self._commit(receiver)
            return True
        return False

    def _commit(self, receiver: Receiver) -> None:
        manifest = receiver.manifest
        base = self._dir(manifest.job_id)
        partial = base / "partial"
        for f in manifest.files:  # empty files get no frame
            if f.size_bytes == 0:
                os.close(_open_below(partial, f.path, os.O_WRONLY | os.O_CREAT))
        self._receivers.pop(manifest.job_id, None)
        try:
            receiver.verify([_sha_of(partial, f.path) for f in manifest.files])
        except TransferError:
            shutil.rmtree(partial, ignore_errors=True)
            (base / "partial.json").unlink(missing_ok=True)
            raise
        current = base / "current"
        old = base / "old"
        shutil.rmtree(old, ignore_errors=True)
        if current.exists():
            current.rename(old)
        partial.rename(current)
        (base / "partial.json").rename(base / "current.json")
        shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def _write_json(path: Path, manifest: Manifest) -> None:
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(manifest.to_wire(), f)
        tmp.replace(path)

    def has(self, job_id: str) -> bool:
        return self._dir(job_id).exists()

    def forget(self, job_id: str) -> None:
        self._receivers.pop(job_id, None)
        shutil.rmtree(self._dir(job_id), ignore_errors=True)

    def restore(self, job_id: str, digest: str, dest: Path, user: JobUser) -> Manifest:
        """Put the held copy ``digest`` into ``dest`` (a job's checkpoint folder), as the job
        user, after clearing whatever was there; raises when that copy is not held."""
        held = self.held(job_id)
        if held is None or held.digest != digest:
            raise TransferError(f"checkpoint {digest[:12]} of {job_id[:8]} is not held here")
        clear_folder(dest, user)
        src = self.current_folder(job_id)
        for f in held.files:
            parts = f.path.split("/")
            for i in range(1, len(parts)):
                prepare_job_folder(dest.joinpath(*parts[:i]), user)
            out = _open_below(dest, f.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                if user.switch:
                    os.fchown(out, user.uid, user.gid)
                inp = _open_below(src, f.path, _READ_FLAGS)
                try:
                    while block := os.read(inp, _HASH_BLOCK):
                        os.write(out, block)
                finally:
                    os.close(inp)
            finally:
                os.close(out)
        return held


def clear_folder(dest: Path, user: JobUser) -> None:
    """Empty a job's checkpoint folder (what an earlier attempt left is never resumed)."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)  # does not follow the links it finds inside
    prepare_job_folder(dest, user)
