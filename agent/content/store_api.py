"""The content store as the transfer sees it: what one node holds, and how bytes go in and out.

:class:`ContentStore` is the contract between the store on disk (``agent.content.store``) and the
transfer between agents (``agent.content.fetch``, the routes that serve chunks): the transfer
never touches the store's files itself. Every method may block on the disk; async callers run
them in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agent.content.manifest import ChunkAt, ContentManifest


class ContentStore(Protocol):
    def manifest(self, digest: str) -> ContentManifest | None:
        """The manifest of ``digest`` when this node knows it (whole, partial or being fetched)."""
        ...

    def add_manifest(self, manifest: ContentManifest) -> None:
        """Remember ``manifest`` (its chunks still to come); holding it already changes nothing."""
        ...

    def missing(self, digest: str) -> Sequence[ChunkAt]:
        """The chunks of manifest ``digest`` this node does not hold yet, one per distinct chunk
        digest (a chunk held for another file, version or dataset counts as held)."""
        ...

    def put_chunk(self, digest: str, chunk: ChunkAt, data: bytes) -> None:
        """Keep ``data`` as ``chunk`` of manifest ``digest`` (everywhere in it that chunk sits),
        after checking it against the chunk's digest and length; raises
        :class:`~agent.content.manifest.ContentError` for bytes that do not match (nothing kept),
        :class:`~agent.storage.sqlitefile.StoreFull` when the disk or the budget is full."""
        ...

    def put_chunks(self, digest: str, items: Sequence[tuple[ChunkAt, bytes]]) -> None:
        """:meth:`put_chunk` of several chunks of manifest ``digest`` at once (a few hundred at
        most): one index transaction for all; nothing is kept when one does not match."""
        ...

    def read_chunk(self, chunk_digest: str) -> bytes | None:
        """The bytes of a chunk this node holds (checked again before they are served), or
        ``None``."""
        ...

    def held_bytes(self, digest: str) -> int:
        """The bytes of manifest ``digest`` held here (``total_bytes`` when complete)."""
        ...
