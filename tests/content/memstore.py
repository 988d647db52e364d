"""An in-memory :class:`~agent.content.store_api.ContentStore` for the transfer's tests (the one
on disk is ``agent.content.store``); it may keep its state in a folder, to stand for an agent
restarted."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from agent.content.manifest import ChunkAt, ContentManifest, check_chunk


class MemStore:
    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.manifests: dict[str, ContentManifest] = {}
        self.chunks: dict[str, bytes] = {}
        self.puts: Counter[str] = Counter()
        """How often each chunk digest was put."""
        self._lock = threading.Lock()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for p in folder.glob("*.manifest"):
                m = ContentManifest.from_wire(json.loads(p.read_text()))
                self.manifests[m.digest] = m
            for p in folder.glob("*.chunk"):
                self.chunks[p.stem] = p.read_bytes()

    def manifest(self, digest: str) -> ContentManifest | None:
        return self.manifests.get(digest)

    def add_manifest(self, manifest: ContentManifest) -> None:
        with self._lock:
            self.manifests.setdefault(manifest.digest, manifest)
            if self.folder is not None:
                path = self.folder / f"{manifest.digest}.manifest"
                path.write_text(json.dumps(manifest.to_wire()))

    def missing(self, digest: str) -> Sequence[ChunkAt]:
        m = self.manifests[digest]
        out: dict[str, ChunkAt] = {}
        for c in m.chunk_places():
            if c.digest not in self.chunks and c.digest not in out:
                out[c.digest] = c
        return list(out.values())

    def put_chunk(self, digest: str, chunk: ChunkAt, data: bytes) -> None:
        check_chunk(chunk.digest, data, chunk.length_bytes)
        with self._lock:
            self.chunks[chunk.digest] = data
            self.puts[chunk.digest] += 1
            if self.folder is not None:
                (self.folder / f"{chunk.digest}.chunk").write_bytes(data)

    def put_chunks(self, digest: str, items: Sequence[tuple[ChunkAt, bytes]]) -> None:
        for chunk, data in items:
            check_chunk(chunk.digest, data, chunk.length_bytes)
        for chunk, data in items:
            self.put_chunk(digest, chunk, data)

    def read_chunk(self, chunk_digest: str) -> bytes | None:
        return self.chunks.get(chunk_digest)

    def held_bytes(self, digest: str) -> int:
        m = self.manifests[digest]
        return sum(c.length_bytes for c in m.chunk_places() if c.digest in self.chunks)
