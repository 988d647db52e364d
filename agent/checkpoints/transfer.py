"""The checkpoint transfer protocol, sans I/O: manifest, chunk framing, resume offsets, limits.

A checkpoint is a folder of regular files. Its :class:`Manifest` lists every file (a safe
relative path, its size and SHA-256) and the attempt that wrote it; the manifest's ``digest``
names its content, so two copies are the same checkpoint when their digests are. A transfer
moves the files as :class:`Frame` s: one chunk of one file at one offset, with the chunk's own
SHA-256. The :class:`Receiver` takes frames in order per file, from the offsets it already holds
(a dropped connection resumes where the bytes on disk end), refuses anything the manifest does
not allow (an unknown file, a gap, bytes past the size, a chunk over the limit, a bad checksum),
and at the end checks every whole file against the manifest (:meth:`Receiver.verify`), so a
manifest that lies about a size or a checksum is refused, never stored as a checkpoint.

Nothing here touches a file, a socket or a clock: ``agent.checkpoints.ckptfiles`` reads and writes
folders, ``agent.checkpoints.ckptmove`` moves frames over the agents' mutual-TLS channel.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent.content.manifest import path_problem
from agent.job.jobspec import check_job_id
from agent.wire import codec as c
from agent.wire.codec import WireError

MAGIC: Final = b"SHCK"
VERSION: Final = 1
_HEADER: Final = struct.Struct("!4sBIQI32s")
HEADER_BYTES: Final = _HEADER.size
"""A frame's header: magic, version, file index, offset, length, SHA-256 of the chunk."""
_SHA_HEX: Final = re.compile(r"[0-9a-f]{64}")


class TransferError(ValueError):
    """A manifest or a frame the protocol refuses; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class TransferLimits:
    """What one checkpoint may be, and one chunk of it."""

    max_total_bytes: int = 4 << 30
    """The largest checkpoint moved or kept (all files together)."""
    max_files: int = 4096
    max_chunk_bytes: int = 512 << 10
    """The most bytes of one frame: one request or answer on the wire, within the API's
    1 MiB body limit."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    """Relative, ``/``-separated, with no empty, ``.`` or ``..`` part (:func:`check_path`)."""
    size_bytes: int
    sha256: str
    """Lowercase hex."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """One checkpoint of one job: what the attempt ``attempt`` left in its folder."""

    job_id: str
    attempt: int
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def digest(self) -> str:
        """SHA-256 over the files' paths, sizes and checksums (not the attempt): the content."""
        canon = json.dumps(
            [[f.path, f.size_bytes, f.sha256] for f in self.files], separators=(",", ":")
        )
        return hashlib.sha256(canon.encode()).hexdigest()

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "files": [
                {"path": f.path, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in self.files
            ],
            "digest": self.digest,
        }

    @classmethod
    def from_wire(cls, value: Any, limits: TransferLimits) -> Manifest:
        """Decode and check a manifest (:func:`check_manifest`); a ``digest`` that is given must
        match the files."""
        try:
            d = c.obj(value, "manifest")
            files = c.items(d.get("files"), "files", _entry)
            manifest = cls(
                job_id=check_job_id(c.field(d, "job_id", c.text)),
                attempt=c.field(d, "attempt", c.integer),
                files=files,
            )
        except (WireError, ValueError) as exc:
            raise TransferError(f"manifest refused: {exc}") from None
        check_manifest(manifest, limits)
        given = d.get("digest")
        if given is not None and given != manifest.digest:
            raise TransferError("manifest refused: its digest does not match its files")
        return manifest


def _entry(value: Any, name: str) -> FileEntry:
    d = c.obj(value, name)
    p = name + "."
    return FileEntry(
        path=c.field(d, "path", c.text, p),
        size_bytes=c.field(d, "size_bytes", c.integer, p),
        sha256=c.field(d, "sha256", c.text, p),
    )


def check_path(path: str) -> str:
    """``path`` if it is a safe relative file path inside a checkpoint folder, else raises."""
    problem = path_problem(path)
    if problem is not None:
        raise TransferError(problem)
    return path


def check_manifest(manifest: Manifest, limits: TransferLimits) -> None:
    """Raise :class:`TransferError` unless every path is safe and unique (no file is also
    another's folder), every size and checksum well formed, and the whole within ``limits``."""
    if manifest.attempt < 1:
        raise TransferError("manifest refused: attempt numbers start at 1")
    if len(manifest.files) > limits.max_files:
        raise TransferError(f"manifest refused: more than {limits.max_files} files")
    seen: set[str] = set()
    folders: set[str] = set()
    for f in manifest.files:
        check_path(f.path)
        if f.size_bytes < 0:
            raise TransferError(f"manifest refused: {f.path}: negative size")
        if not _SHA_HEX.fullmatch(f.sha256):
            raise TransferError(f"manifest refused: {f.path}: not a SHA-256")
        if f.path in seen or f.path in folders:
            raise TransferError(f"manifest refused: {f.path} listed twice")
        seen.add(f.path)
        parts = f.path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    if seen & folders:
        raise TransferError("manifest refused: a path is both a file and a folder")
    if manifest.total_bytes > limits.max_total_bytes:
        raise TransferError(
            f"manifest refused: {manifest.total_bytes} bytes, over the limit of "
            f"{limits.max_total_bytes}"
        )


# -- frames --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Which bytes to send next: ``length_bytes`` of file ``index`` from ``offset_bytes``."""

    index: int
    offset_bytes: int
    length_bytes: int


@dataclass(frozen=True, slots=True)
class Frame:
    """One chunk on the wire."""

    index: int
    offset_bytes: int
    data: bytes

    def encode(self) -> bytes:
        digest = hashlib.sha256(self.data).digest()
        return (
            _HEADER.pack(MAGIC, VERSION, self.index, self.offset_bytes, len(self.data), digest)
            + self.data
        )

    @classmethod
    def decode(cls, raw: bytes, limits: TransferLimits) -> Frame:
        """A frame from its bytes; raises unless the header, the length and the chunk's
        checksum all agree."""
        if len(raw) < HEADER_BYTES:
            raise TransferError("frame refused: shorter than its header")
        magic, version, index, offset, length, digest = _HEADER.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            raise TransferError("frame refused: not a checkpoint frame of this version")
        if length > limits.max_chunk_bytes:
            raise TransferError(f"frame refused: {length} bytes, over {limits.max_chunk_bytes}")
        data = raw[HEADER_BYTES:]
        if len(data) != length:
            raise TransferError(f"frame refused: {len(data)} bytes where the header says {length}")
        if hashlib.sha256(data).digest() != digest:
            raise TransferError("frame refused: the chunk's checksum does not match")
        return cls(index, offset, data)


def plan(manifest: Manifest, offsets: Sequence[int], max_chunk_bytes: int) -> Iterator[ChunkRef]:
    """The chunks still to send, in order, from the offsets the receiver holds."""
    if len(offsets) != len(manifest.files):
        raise TransferError("offsets do not match the manifest")
    for i, (f, held) in enumerate(zip(manifest.files, offsets, strict=True)):
        offset = max(0, min(held, f.size_bytes))
        while offset < f.size_bytes:
            length = min(max_chunk_bytes, f.size_bytes - offset)
            yield ChunkRef(i, offset, length)
            offset += length


class Receiver:
    """Where a transfer of one manifest stands on the receiving side."""

    def __init__(
        self, manifest: Manifest, limits: TransferLimits, held: Sequence[int] | None = None
    ) -> None:
        """``held``: the bytes of each file already on disk (a transfer resumed); more than
        a file's size counts as none (the partial file is rewritten)."""
        check_manifest(manifest, limits)
        self.manifest = manifest
        self.limits = limits
        sizes = [f.size_bytes for f in manifest.files]
        given = list(held) if held is not None else [0] * len(sizes)
        if len(given) != len(sizes):
            raise TransferError("held offsets do not match the manifest")
        self._offsets = [h if 0 <= h <= s else 0 for h, s in zip(given, sizes, strict=True)]

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(self._offsets)

    @property
    def complete(self) -> bool:
        return all(
            o == f.size_bytes for o, f in zip(self._offsets, self.manifest.files, strict=True)
        )

    @property
    def received_bytes(self) -> int:
        return sum(self._offsets)

    def accept(self, frame: Frame) -> bool:
        """Take a frame: ``True`` when its bytes are to be written at its offset, ``False`` for
        a repeat of bytes already held (an answer lost with a dropped connection). Raises for a
        frame the manifest does not allow."""
        if not 0 <= frame.index < len(self.manifest.files):
            raise TransferError(f"frame refused: no file {frame.index} in the manifest")
        if len(frame.data) > self.limits.max_chunk_bytes:
            raise TransferError("frame refused: over the chunk limit")
        entry = self.manifest.files[frame.index]
        end = frame.offset_bytes + len(frame.data)
        if end > entry.size_bytes:
            raise TransferError(f"frame refused: past the end of {entry.path} ({entry.size_bytes})")
        held = self._offsets[frame.index]
        if end <= held and frame.data:
            return False
        if frame.offset_bytes != held:
            raise TransferError(
                f"frame refused: {entry.path} at {frame.offset_bytes}, expected {held}"
            )
        self._offsets[frame.index] = end
        return True

    def verify(self, sha256_by_index: Sequence[str]) -> None:
        """Check the whole files, as written, against the manifest; raises on any mismatch."""
        if not self.complete:
            raise TransferError("transfer incomplete")
        for f, got in zip(self.manifest.files, sha256_by_index, strict=True):
            if got != f.sha256:
                raise TransferError(f"checkpoint refused: {f.path} does not match its checksum")
