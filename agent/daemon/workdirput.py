"""A submitter's working folder coming up into the agent it talks to, before the submission.

Two operator commands (signed, as every command is): ``workdir_missing`` carries a manifest of
kind ``workdir``; the agent keeps it in its content store and answers the chunks it lacks (none
when an earlier submission brought the same files: nothing is sent twice). ``workdir_put`` carries
a few of those chunks (base64), each checked against its digest before it is kept. From there the
content moves as any other: the job's owner and replica fetch it when they take the submission,
and the runner and every gang member stage it before the start (``agent.running.workstage``).

An admin's team policy body comes up the same way, before the ``policy`` command that names it
(``policy_missing``, ``policy_put``: :data:`POLICY_UPLOAD`, admins only).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from agent.content.manifest import (
    ChunkAt,
    ContentError,
    ContentLimits,
    ContentManifest,
)
from agent.content.policybody import LIMITS as POLICY_LIMITS
from agent.content.stage import Stager
from agent.content.store import DiskStore
from agent.content.workdir import DEFAULT_MAX_BYTES, MAX_FILES

MAX_PUT_CHUNKS: Final = 64
WORKDIR_STORE_NAME: Final = "workdir"
LIMITS: Final = ContentLimits(max_total_bytes=DEFAULT_MAX_BYTES, max_files=MAX_FILES)


@dataclass(frozen=True, slots=True)
class Upload:
    """What one pair of commands brings up: content of ``kind`` within ``limits``."""

    kind: str
    what: str
    """How its refusals name it."""
    limits: ContentLimits
    first: str
    """The command that sends the manifest."""


WORKDIR_UPLOAD: Final = Upload("workdir", "working folder", LIMITS, "workdir_missing")
POLICY_UPLOAD: Final = Upload("policy", "policy body", POLICY_LIMITS, "policy_missing")


class WorkdirUploads:
    def __init__(
        self, store: DiskStore, counts: Counter[str], upload: Upload = WORKDIR_UPLOAD
    ) -> None:
        """``counts``: ``chunks_received``, ``bytes_received``, ``chunks_refused``,
        ``manifests`` (``shoal_workdir_uploads_total``)."""
        self.store = store
        self.counts = counts
        self.upload = upload

    async def missing(self, body: dict[str, Any]) -> dict[str, Any]:
        """Keep the manifest; the distinct chunk digests this store still lacks."""
        try:
            manifest = ContentManifest.from_wire(body.get("manifest"), self.upload.limits)
        except ContentError as exc:
            self.counts["manifests_refused"] += 1
            raise ValueError(str(exc)) from None
        if manifest.kind != self.upload.kind:
            self.counts["manifests_refused"] += 1
            raise ValueError(f"manifest of kind {manifest.kind!r}, not a {self.upload.what}")
        digest = manifest.digest
        if await asyncio.to_thread(self.store.manifest, digest) is None:
            await asyncio.to_thread(self.store.add_manifest, manifest)
        self.counts["manifests"] += 1
        lacking = await asyncio.to_thread(self.store.missing, digest)
        return {
            "digest": digest,
            "missing": [at.digest for at in lacking],
            "total_bytes": manifest.total_bytes,
        }

    async def put(self, body: dict[str, Any]) -> dict[str, Any]:
        """Keep each chunk of ``body["chunks"]`` (``[[digest, base64], ...]``) of manifest
        ``body["digest"]``; how many were kept (the operator asks ``workdir_missing`` again at
        the end)."""
        digest = body.get("digest")
        chunks = body.get("chunks")
        if not isinstance(digest, str) or not isinstance(chunks, list):
            raise ValueError("digest must be a string and chunks a list")
        if len(chunks) > MAX_PUT_CHUNKS:
            raise ValueError(f"more than {MAX_PUT_CHUNKS} chunks in one command")
        manifest = await asyncio.to_thread(self.store.manifest, digest)
        if manifest is None or manifest.kind != self.upload.kind:
            what, first = self.upload.what, self.upload.first
            raise ValueError(f"no {what} {digest[:12]} here: send {first} first")
        # The manifest's chunks by digest (not what is missing: working out that costs a query
        # over every file of the folder, and a chunk held already is kept again as a no-op).
        places = {at.digest: at for at in manifest.chunk_places()}
        rows: list[tuple[ChunkAt, str]] = []
        for row in chunks:
            if not _chunk_row(row):
                raise ValueError("each chunk must be [digest, base64]")
            at = places.get(row[0])
            if at is None:
                self.counts["chunks_refused"] += 1
                raise ValueError(f"chunk {row[0][:12]} is not of {self.upload.what} {digest[:12]}")
            rows.append((at, row[1]))
        try:  # decoding and hashing ~600 KiB: off the event loop, with the write
            kept = await asyncio.to_thread(self._keep, digest, rows)
        except ValueError:
            self.counts["chunks_refused"] += 1
            raise
        self.counts["chunks_received"] += len(kept)
        self.counts["bytes_received"] += sum(len(data) for _, data in kept)
        return {"digest": digest, "kept": len(kept)}

    def _keep(self, digest: str, rows: list[tuple[ChunkAt, str]]) -> list[tuple[ChunkAt, bytes]]:
        """Decode each chunk, then keep them together (one index transaction: the store checks
        each against its digest); ``ValueError`` naming the first that is not what it says, or
        not of the folder's manifest held here (nothing kept then)."""
        items: dict[str, tuple[ChunkAt, bytes]] = {}
        for at, text in rows:
            try:
                items[at.digest] = (at, base64.b64decode(text, validate=True))
            except binascii.Error as exc:
                raise ValueError(f"chunk {at.digest[:12]}: {exc}") from None
        if items:
            try:
                self.store.put_chunks(digest, list(items.values()))
            except ContentError as exc:
                raise ValueError(str(exc)) from None
        return list(items.values())


def _chunk_row(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)


HOLD_WAIT_S: Final = 8.0
"""How long the owner waits for its own copy of a working folder before it takes a submission
(within the operator's request); a fetch still under way then goes on after the answer."""


class WorkdirHolds:
    """The job's owner and replica keep its working folder, as they keep the submission."""

    def __init__(self, store: DiskStore, stager: Stager) -> None:
        self.store = store
        self.stager = stager

    def hold(self, digest: str) -> None:
        """Fetch ``digest`` from the members that hold it unless it is held whole here (the
        replica, told of a job: not waited for)."""
        held = self.store.held(digest)
        if held is None or not held.complete:
            self.stager.start(WORKDIR_STORE_NAME, digest, None)

    async def fetch(self, digest: str) -> str | None:
        """Hold ``digest`` whole here (the owner, before it takes the submission); why it could
        not (no member holds it), or ``None`` (held, or still coming after :data:`HOLD_WAIT_S`)."""
        held = await asyncio.to_thread(self.store.held, digest)
        if held is not None and held.complete:
            return None
        self.stager.start(WORKDIR_STORE_NAME, digest, None)
        try:
            state = await asyncio.wait_for(asyncio.shield(self.stager.wait(digest)), HOLD_WAIT_S)
        except TimeoutError:
            return None  # a large folder on a slow link: it goes on
        if state.state != "done":
            return f"working folder {digest[:12]}: {state.error or state.state}"
        return None
