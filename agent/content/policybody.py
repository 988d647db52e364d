"""The team policy's body as content of kind ``policy``: one file, kept in the store, fetched.

An admin's policy (:mod:`agent.wire.policy`) is gossiped as a small record naming its body by
content digest; the body itself (up to :data:`~agent.wire.policy.MAX_POLICY_BODY_BYTES`) is
content like a working folder: one file, :data:`BODY_FILE`, cut into :data:`CHUNK_BYTES` chunks.
The admin's tools put it to the agent they talk to (``policy_missing``, ``policy_put``); every
other agent fetches it from the members that gossip its record (``agent.daemon.policywire``),
each chunk checked against its digest, and reads it back here before the keeper checks the
admin's signature over it. Nothing here touches a socket or a clock.
"""

from __future__ import annotations

import hashlib
from typing import Final

from agent.content.manifest import (
    ChunkAt,
    ContentError,
    ContentFile,
    ContentLimits,
    ContentManifest,
)
from agent.content.store_api import ContentStore
from agent.wire.policy import MAX_POLICY_BODY_BYTES, PolicyRecord, SignedPolicy

KIND: Final = "policy"
NAME: Final = "policy"
"""The store's name for every policy body (one is believed at a time; older ones may go)."""
BODY_FILE: Final = "policy.msgpack"
CHUNK_BYTES: Final = 256 << 10
"""256 KiB: a body of 1 MiB is four chunks, each well under an operator command."""
LIMITS: Final = ContentLimits(max_total_bytes=MAX_POLICY_BODY_BYTES, max_files=1)


def body_manifest(body_bytes: bytes) -> ContentManifest:
    """The manifest of a policy body: one file of its bytes (mode 0600)."""
    if not 0 < len(body_bytes) <= MAX_POLICY_BODY_BYTES:
        raise ContentError(f"a policy body is 1..{MAX_POLICY_BODY_BYTES} bytes")
    chunks = tuple(
        hashlib.sha256(body_bytes[at : at + CHUNK_BYTES]).hexdigest()
        for at in range(0, len(body_bytes), CHUNK_BYTES)
    )
    return ContentManifest(
        KIND, NAME, CHUNK_BYTES, (ContentFile(BODY_FILE, len(body_bytes), 0o600, chunks),)
    )


def pointer_of(signed: SignedPolicy) -> PolicyRecord:
    """What is gossiped of ``signed``: its body's content digest, size and signature."""
    return signed.pointer(body_manifest(signed.body_bytes).digest)


def check_body_manifest(manifest: ContentManifest) -> None:
    """:class:`ContentError` unless ``manifest`` has the shape of a policy body."""
    if (
        manifest.kind != KIND
        or manifest.chunk_bytes != CHUNK_BYTES
        or len(manifest.files) != 1
        or manifest.files[0].path != BODY_FILE
        or not 0 < manifest.total_bytes <= MAX_POLICY_BODY_BYTES
    ):
        raise ContentError(f"content {manifest.digest[:12]} is no policy body")


def chunks_of(body_bytes: bytes, manifest: ContentManifest) -> list[tuple[ChunkAt, bytes]]:
    """Each chunk of the body, with where it sits."""
    return [
        (at, body_bytes[at.offset_bytes : at.offset_bytes + at.length_bytes])
        for at in manifest.chunk_places()
    ]


def put_body(store: ContentStore, body_bytes: bytes) -> str:
    """Hold ``body_bytes`` whole in ``store`` as a policy body; its digest. Blocking."""
    manifest = body_manifest(body_bytes)
    store.add_manifest(manifest)
    missing = {at.digest for at in store.missing(manifest.digest)}
    wanted = [(at, data) for at, data in chunks_of(body_bytes, manifest) if at.digest in missing]
    if wanted:
        store.put_chunks(manifest.digest, wanted)
    return manifest.digest


def read_body(store: ContentStore, digest: str) -> bytes:
    """The bytes of the policy body ``digest`` held whole in ``store`` (each chunk checked
    against its digest again); :class:`ContentError` when it is not held whole or is no policy
    body. Blocking."""
    manifest = store.manifest(digest)
    if manifest is None:
        raise ContentError(f"no policy body {digest[:12]} here")
    check_body_manifest(manifest)
    parts: list[bytes] = []
    for at in manifest.chunk_places():
        data = store.read_chunk(at.digest)
        if data is None:
            raise ContentError(f"policy body {digest[:12]} is not held whole here")
        if len(data) != at.length_bytes or hashlib.sha256(data).hexdigest() != at.digest:
            raise ContentError(f"policy body {digest[:12]}: a chunk does not match its digest")
        parts.append(data)
    return b"".join(parts)
