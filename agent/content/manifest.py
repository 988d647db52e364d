"""What the content store holds, sans I/O: a manifest of files cut into fixed-size chunks.

Everything that moves between agents as bytes (a dataset, a job's working folder, a built
environment, an exported image, later checkpoints) is a :class:`ContentManifest`: its kind, a name,
the chunk size, and each file's safe relative path, size, mode bits and the SHA-256 of each of its
chunks (the last one shorter). The manifest's own :attr:`~ContentManifest.digest` (SHA-256 of its
canonical JSON, the name and kind left out) names the content: two manifests with one digest are
the same bytes, whatever they are called. A chunk is named by its SHA-256, so a receiver checks each
chunk as it arrives, before it is kept, and a chunk held for one version or dataset serves every
other that has it.

Nothing here touches a file, a socket or a clock.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agent.wire import codec as c
from agent.wire.codec import WireError

Kind = Literal["dataset", "workdir", "env", "image", "checkpoint", "policy"]
KINDS: Final[tuple[Kind, ...]] = ("dataset", "workdir", "env", "image", "checkpoint", "policy")

DEFAULT_CHUNK_BYTES: Final = 4 << 20
"""4 MiB: a terabyte is 262,144 chunks, a manifest of a few tens of MB."""
MIN_CHUNK_BYTES: Final = 64 << 10
MAX_CHUNK_BYTES: Final = 16 << 20
_SHA_HEX: Final = re.compile(r"[0-9a-f]{64}")
_MODE_BITS: Final = 0o777


MAX_PATH_BYTES: Final = 1024
MAX_DEPTH: Final = 32


class ContentError(ValueError):
    """A manifest or a chunk the store refuses; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class ContentLimits:
    """What one manifest may be."""

    max_total_bytes: int = 4 << 40
    max_files: int = 1_000_000
    max_chunks: int = 2_000_000


@dataclass(frozen=True, slots=True)
class ContentFile:
    path: str
    """Relative, ``/``-separated, with no empty, ``.`` or ``..`` part."""
    size_bytes: int
    mode: int
    """Permission bits only (``0o755``, ``0o644``): the store never keeps set-id or sticky bits."""
    chunks: tuple[str, ...]
    """SHA-256 (lowercase hex) of each chunk, in order: ``ceil(size / chunk_bytes)`` of them
    (one, of the empty string, for an empty file)."""


@dataclass(frozen=True, slots=True)
class ChunkAt:
    """Where one chunk sits: file ``index`` of the manifest, from ``offset_bytes``."""

    digest: str
    index: int
    offset_bytes: int
    length_bytes: int


@dataclass(frozen=True, slots=True)
class ContentManifest:
    kind: Kind
    name: str
    chunk_bytes: int
    files: tuple[ContentFile, ...]
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)
    """The digest, once asked (a 1,000-file manifest takes a millisecond to hash, and the
    serving and fetching sides name it with every chunk)."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def digest(self) -> str:
        """SHA-256 over the chunk size and each file's path, size, mode and chunks."""
        if self._digest is None:
            object.__setattr__(self, "_digest", self._hash())
        assert self._digest is not None
        return self._digest

    def _hash(self) -> str:
        canon = json.dumps(
            [
                self.chunk_bytes,
                [[f.path, f.size_bytes, f.mode, list(f.chunks)] for f in self.files],
            ],
            separators=(",", ":"),
        )
        return hashlib.sha256(canon.encode()).hexdigest()

    def chunk_places(self) -> Iterator[ChunkAt]:
        """Every chunk of every file, in order (a digest repeats where the content does)."""
        for i, f in enumerate(self.files):
            for n, digest in enumerate(f.chunks):
                offset = n * self.chunk_bytes
                yield ChunkAt(
                    digest, i, offset, max(0, min(self.chunk_bytes, f.size_bytes - offset))
                )

    def chunk_digests(self) -> frozenset[str]:
        return frozenset(d for f in self.files for d in f.chunks)

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "chunk_bytes": self.chunk_bytes,
            "files": [[f.path, f.size_bytes, f.mode, list(f.chunks)] for f in self.files],
            "digest": self.digest,
        }

    @classmethod
    def from_wire(cls, value: Any, limits: ContentLimits | None = None) -> ContentManifest:
        """Decode and check a manifest (:func:`check_content`); a ``digest`` that is given must
        match the files."""
        try:
            d = c.obj(value, "manifest")
            manifest = cls(
                kind=c.field(d, "kind", c.one_of(KINDS)),  # type: ignore[arg-type]
                name=c.field(d, "name", c.text),
                chunk_bytes=c.field(d, "chunk_bytes", c.integer),
                files=c.items(d.get("files"), "files", _file),
            )
        except (WireError, ValueError) as exc:
            raise ContentError(f"manifest refused: {exc}") from None
        check_content(manifest, limits or ContentLimits())
        given = d.get("digest")
        if given is not None and given != manifest.digest:
            raise ContentError("manifest refused: its digest does not match its files")
        return manifest


def _file(value: Any, name: str) -> ContentFile:
    row = c.row(value, name, 4)
    return ContentFile(
        path=c.text(row[0], f"{name}[0]"),
        size_bytes=c.integer(row[1], f"{name}[1]"),
        mode=c.integer(row[2], f"{name}[2]"),
        chunks=c.texts(row[3], f"{name}[3]"),
    )


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a safe relative file path inside a folder, or ``None`` when it is."""
    if not path or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        return f"path {path[:40]!r}: empty or too long"
    if "\\" in path or "\0" in path or path.startswith("/") or ":" in path.split("/")[0]:
        return f"path {path[:40]!r}: not a relative path"
    parts = path.split("/")
    if len(parts) > MAX_DEPTH or any(p in ("", ".", "..") for p in parts):
        return f"path {path[:40]!r}: not a plain relative path"
    return None


def chunk_count(size_bytes: int, chunk_bytes: int) -> int:
    """How many chunks a file of ``size_bytes`` has (an empty file has one, of no bytes)."""
    return max(1, -(-size_bytes // chunk_bytes))


def check_content(manifest: ContentManifest, limits: ContentLimits) -> None:
    """Raise :class:`ContentError` unless every path is safe and unique (no file is also another's
    folder), every size, mode and chunk list well formed, and the whole within ``limits``."""
    if not MIN_CHUNK_BYTES <= manifest.chunk_bytes <= MAX_CHUNK_BYTES:
        raise ContentError(
            f"manifest refused: chunk size {manifest.chunk_bytes} is outside"
            f" {MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}"
        )
    if len(manifest.files) > limits.max_files:
        raise ContentError(f"manifest refused: more than {limits.max_files} files")
    seen: set[str] = set()
    folders: set[str] = set()
    chunks = 0
    for f in manifest.files:
        problem = path_problem(f.path)
        if problem is not None:
            raise ContentError(f"manifest refused: {problem}")
        if f.size_bytes < 0:
            raise ContentError(f"manifest refused: {f.path}: negative size")
        if f.mode & ~_MODE_BITS:
            raise ContentError(
                f"manifest refused: {f.path}: mode {f.mode:o} has more than rwx bits"
            )
        if len(f.chunks) != chunk_count(f.size_bytes, manifest.chunk_bytes):
            raise ContentError(f"manifest refused: {f.path}: chunks do not match its size")
        if not all(_SHA_HEX.fullmatch(d) for d in f.chunks):
            raise ContentError(f"manifest refused: {f.path}: a chunk is not a SHA-256")
        chunks += len(f.chunks)
        if f.path in seen or f.path in folders:
            raise ContentError(f"manifest refused: {f.path} listed twice")
        seen.add(f.path)
        parts = f.path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    if seen & folders:
        raise ContentError("manifest refused: a path is both a file and a folder")
    if chunks > limits.max_chunks:
        raise ContentError(f"manifest refused: more than {limits.max_chunks} chunks")
    if manifest.total_bytes > limits.max_total_bytes:
        raise ContentError(
            f"manifest refused: {manifest.total_bytes} bytes, over the limit of"
            f" {limits.max_total_bytes}"
        )


def check_chunk(digest: str, data: bytes, length_bytes: int) -> None:
    """Raise :class:`ContentError` unless ``data`` is the chunk ``digest`` names, of its length."""
    if len(data) != length_bytes:
        raise ContentError(f"chunk {digest[:12]}: {len(data)} bytes where {length_bytes} are due")
    if hashlib.sha256(data).hexdigest() != digest:
        raise ContentError(f"chunk {digest[:12]}: its bytes do not match its digest")
