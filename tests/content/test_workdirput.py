"""A working folder sent up by an operator: each chunk checked before it is kept; a chunk that is
not what it says, or not of the folder, refused in one line and counted, nothing of it kept."""

from __future__ import annotations

import base64
import hashlib
from collections import Counter
from pathlib import Path

import pytest

from agent.content.manifest import ContentFile, ContentManifest
from agent.content.store import DiskStore
from agent.daemon.workdirput import WorkdirUploads


def _folder() -> tuple[ContentManifest, dict[str, bytes]]:
    files, chunks = [], {}
    for name in ("a.py", "b.py"):
        data = f"print({name!r})\n".encode()
        digest = hashlib.sha256(data).hexdigest()
        chunks[digest] = data
        files.append(ContentFile(name, len(data), 0o644, (digest,)))
    return ContentManifest("workdir", "proj", 256 << 10, tuple(files)), chunks


async def test_chunks_are_checked_kept_together_and_forgeries_refused(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "store")
    counts: Counter[str] = Counter()
    uploads = WorkdirUploads(store, counts)
    m, chunks = _folder()
    answer = await uploads.missing({"manifest": m.to_wire()})
    assert sorted(answer["missing"]) == sorted(chunks)
    (first, data), (second, other) = chunks.items()

    def row(digest: str, body: bytes) -> list[str]:
        return [digest, base64.b64encode(body).decode()]

    with pytest.raises(ValueError, match=f"chunk {second[:12]}"):
        await uploads.put({"digest": m.digest, "chunks": [row(first, data), row(second, data)]})
    assert len(store.missing(m.digest)) == 2 and counts["chunks_refused"] == 1
    assert store.held_bytes(m.digest) == 0  # the good one was not kept either
    stranger = hashlib.sha256(b"elsewhere").hexdigest()
    with pytest.raises(ValueError, match="is not of working folder"):
        await uploads.put({"digest": m.digest, "chunks": [row(stranger, b"elsewhere")]})
    assert counts["chunks_refused"] == 2
    kept = await uploads.put({"digest": m.digest, "chunks": [row(first, data), row(second, other)]})
    assert kept == {"digest": m.digest, "kept": 2} and store.missing(m.digest) == ()
    assert counts["chunks_received"] == 2 and counts["bytes_received"] == len(data) + len(other)
    store.close()
