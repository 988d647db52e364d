"""Serving the content store to the other members: the routes the fetcher of another agent asks.

Routes, role ``agent`` only (a certificate of another role is refused 403 by
``agent.daemon.api`` and counted there), under ``/v1/internal/content``:

- ``GET /<digest>``: the manifest of ``digest`` (JSON, :meth:`ContentManifest.to_wire`), when
  this node knows it (404 otherwise);
- ``GET /<digest>/have``: the chunks of it held here, compact (``{"whole": true}`` or a bitmap,
  :func:`agent.content.fetch.have_to_wire`);
- ``GET /chunk/<chunk digest>?of=<digest>``: one chunk's bytes, only when it is a chunk of the
  manifest ``of`` and this node holds that manifest (whole or in part) and the chunk: a member
  can read nothing of this node's store but the chunks of content it names by digest;
- ``GET /<digest>/chunks?n=3,4,17``: several small chunks of ``digest`` in one answer, named by
  their place among its distinct chunks (the order of the ``have`` bitmap), their bytes one after
  another: at most :data:`~agent.content.fetch.MAX_BUNDLE_CHUNKS` of them and
  :data:`~agent.content.fetch.MAX_BUNDLE_BYTES` in all, every one held here (else 404).

Who may read: any member may read a dataset, a working folder, an environment or an image it names
by digest; the content of some kinds is further gated (:attr:`ContentServer.gates`: a
checkpoint is served only to an agent with a say over its job, ``agent.checkpoints.ckptstore``),
and anyone else is refused 403. A digest that is not 64 lowercase hex digits is refused 400; each
refusal is counted (``shoal_content_total{what="served_refused"}``). A chunk is at most
:data:`~agent.content.manifest.MAX_CHUNK_BYTES`; reading it from the disk runs in a thread and
is given up after :data:`READ_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from agent.common.errors import ApiError
from agent.content.fetch import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_CHUNKS,
    distinct_chunks,
    have_to_wire,
)
from agent.content.manifest import ContentManifest
from agent.content.store_api import ContentStore

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
READ_TIMEOUT_S: Final = 30.0
_SETS_KEPT: Final = 16
CHUNK_CONTENT_TYPE: Final = "application/octet-stream"
CORRUPT_ENV: Final = "SHOAL_TEST_CORRUPT_CHUNKS"
"""Tests only: ``1`` makes this agent serve every chunk with its first byte changed (a holder
whose disk or memory lies), to show that the fetcher drops it."""
DROP_ENV: Final = "SHOAL_TEST_DROP_CHUNK_AT"
"""Tests only: ``N`` cuts the connection of the Nth chunk answer this agent serves, once, half
sent (a transfer cut mid-stream, which the fetcher resumes)."""

Gate = Callable[[str, str], bool]
"""May ``caller`` (a member's node id) read content ``digest``? (it counts its refusals)"""


def check_digest(text: str, what: str = "digest") -> str:
    if not _DIGEST.fullmatch(text):
        raise ApiError(400, f"{what} must be 64 lowercase hex digits")
    return text


class ContentServer:
    """This agent's side of serving: what a member may read of the store."""

    def __init__(self, store: ContentStore, counts: Counter[str]) -> None:
        """``counts``: the agent's ``shoal_content_total`` counter (``served_chunks``,
        ``served_bytes``, ``served_refused``)."""
        self.store = store
        self.counts = counts
        self._sets: OrderedDict[str, _Chunks] = OrderedDict()
        self._corrupt = os.environ.get(CORRUPT_ENV) == "1"
        drop = os.environ.get(DROP_ENV, "")
        self._drop_at = int(drop) if drop.isdigit() else 0
        self._answered = 0
        self.gates: dict[str, Gate] = {}
        """Kind -> who may read content of that kind (a kind not listed: every member)."""

    def drop_now(self) -> bool:
        """The test hook: is this the chunk answer whose connection is to be cut?"""
        self._answered += 1
        if self._drop_at and self._answered == self._drop_at:
            self.counts["served_dropped"] += 1
            return True
        return False

    def _refuse(self, status: int, message: str) -> ApiError:
        self.counts["served_refused"] += 1
        return ApiError(status, message)

    async def _manifest(self, digest: str, caller: str) -> ContentManifest:
        manifest = await asyncio.to_thread(self.store.manifest, digest)
        if manifest is None:
            raise self._refuse(404, f"no content {digest[:12]} here")
        self._gate(manifest.kind, digest, caller)
        return manifest

    def _gate(self, kind: str, digest: str, caller: str) -> None:
        gate = self.gates.get(kind)
        if gate is not None and not gate(digest, caller):
            raise self._refuse(403, f"{caller[:8]} may not read the {kind} {digest[:12]}")

    async def manifest(self, digest: str, caller: str) -> ContentManifest:
        return await self._manifest(digest, caller)

    async def have(self, digest: str, caller: str) -> dict[str, object]:
        manifest = await self._manifest(digest, caller)
        missing = await asyncio.to_thread(self.store.missing, digest)
        return have_to_wire(manifest, missing)

    async def _chunks(self, of: str, caller: str) -> _Chunks:
        chunks = self._sets.get(of)
        if chunks is None:
            manifest = await self._manifest(of, caller)
            lengths = {c.digest: c.length_bytes for c in manifest.chunk_places()}
            chunks = _Chunks(manifest.kind, distinct_chunks(manifest), lengths)
            self._sets[of] = chunks
            while len(self._sets) > _SETS_KEPT:
                self._sets.popitem(last=False)
        else:
            self._sets.move_to_end(of)
            self._gate(chunks.kind, of, caller)  # asked at every chunk, never remembered
        return chunks

    async def chunk(self, chunk_digest: str, of: str, caller: str) -> bytes:
        if chunk_digest not in (await self._chunks(of, caller)).lengths:
            raise self._refuse(404, f"chunk {chunk_digest[:12]} is not of content {of[:12]}")
        [data] = await self._read([chunk_digest])
        return data

    async def bundle(self, of: str, numbers: str, caller: str) -> bytes:
        """The chunks of ``of`` at places ``numbers`` (``3,4,17``), one after another."""
        chunks = await self._chunks(of, caller)
        try:
            places = [int(n) for n in numbers.split(",")]
        except ValueError:
            raise self._refuse(400, "n must be chunk numbers, comma-separated") from None
        if not 0 < len(places) <= MAX_BUNDLE_CHUNKS:
            raise self._refuse(400, f"from 1 to {MAX_BUNDLE_CHUNKS} chunks in one ask")
        if any(not 0 <= n < len(chunks.order) for n in places):
            raise self._refuse(404, f"a chunk number beyond those of content {of[:12]}")
        digests = [chunks.order[n] for n in places]
        if sum(chunks.lengths[d] for d in digests) > MAX_BUNDLE_BYTES:
            raise self._refuse(400, f"over {MAX_BUNDLE_BYTES} bytes in one ask")
        return b"".join(await self._read(digests))

    async def _read(self, digests: list[str]) -> list[bytes]:
        """The chunks' bytes, read in one thread (404 when one is not held here)."""
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                read = await asyncio.to_thread(lambda: [self.store.read_chunk(d) for d in digests])
        except TimeoutError:
            raise self._refuse(503, f"chunk {digests[0][:12]}: the disk did not answer") from None
        out: list[bytes] = []
        for digest, data in zip(digests, read, strict=True):
            if data is None:
                raise self._refuse(404, f"chunk {digest[:12]} is not held here")
            self.counts["served_chunks"] += 1
            self.counts["served_bytes"] += len(data)
            out.append(bytes([data[0] ^ 0xFF]) + data[1:] if self._corrupt and data else data)
        return out


@dataclass(frozen=True, slots=True)
class _Chunks:
    """A manifest's distinct chunks as a holder serves them: in order, and their lengths."""

    kind: str
    order: list[str]
    lengths: dict[str, int]


async def _cut(request: web.Request, body: bytes) -> web.StreamResponse:
    """Send half of an answer, then drop the connection (the test hook, :data:`DROP_ENV`)."""
    response = web.StreamResponse(
        headers={"Content-Type": CHUNK_CONTENT_TYPE, "Content-Length": str(len(body))}
    )
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    if request.transport is not None:
        request.transport.abort()
    return response


class Routes:
    """The handlers, for ``agent.daemon.api`` to add behind its agent-role check; each gets
    the caller's node id (from its certificate)."""

    def __init__(self, server: ContentServer) -> None:
        self.server = server

    def _digest(self, request: web.Request, key: str) -> str:
        try:
            return check_digest(request.match_info.get(key) or request.query.get(key, ""), key)
        except ApiError:
            self.server.counts["served_refused"] += 1
            raise

    async def manifest(self, request: web.Request, caller: str) -> web.StreamResponse:
        manifest = await self.server.manifest(self._digest(request, "digest"), caller)
        body = json.dumps(manifest.to_wire(), separators=(",", ":"))
        return web.Response(text=body, content_type="application/json")

    async def have(self, request: web.Request, caller: str) -> web.StreamResponse:
        return web.json_response(await self.server.have(self._digest(request, "digest"), caller))

    async def chunk(self, request: web.Request, caller: str) -> web.StreamResponse:
        chunk_digest = self._digest(request, "chunk")
        data = await self.server.chunk(chunk_digest, self._digest(request, "of"), caller)
        return await self._answer(request, data)

    async def bundle(self, request: web.Request, caller: str) -> web.StreamResponse:
        digest = self._digest(request, "digest")
        data = await self.server.bundle(digest, request.query.get("n", ""), caller)
        return await self._answer(request, data)

    async def _answer(self, request: web.Request, data: bytes) -> web.StreamResponse:
        if self.server.drop_now():
            return await _cut(request, data)
        return web.Response(body=data, content_type=CHUNK_CONTENT_TYPE)
