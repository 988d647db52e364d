"""Serving the content store to the other members: the routes the fetcher of another agent asks.

Routes, role ``agent`` only (a certificate of another role is refused 403 by
``agent.daemon.api`` and counted there), under ``/v1/internal/content``:

- ``GET /<digest>``: the manifest of ``digest`` (JSON, :meth:`ContentManifest.to_wire`), when
  this node knows it (404 otherwise);
- ``GET /<digest>/have``: the chunks of it held here, compact (``{"whole": true}`` or a bitmap,
  :func:`agent.content.fetch.have_to_wire`);
- ``GET /chunk/<chunk digest>?of=<digest>``: one chunk's bytes, only when it is a chunk of the
  manifest ``of`` and this node holds that manifest (whole or in part) and the chunk: a member
  can read nothing of this node's store but the chunks of content it names by digest.

A digest that is not 64 lowercase hex digits is refused 400; each refusal is counted
(``shoal_content_total{what="served_refused"}``). A chunk is at most
:data:`~agent.content.manifest.MAX_CHUNK_BYTES`; reading it from the disk runs in a thread and
is given up after :data:`READ_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import Counter, OrderedDict
from typing import Final

from aiohttp import web

from agent.common.errors import ApiError
from agent.content.fetch import have_to_wire
from agent.content.manifest import ContentManifest
from agent.content.store_api import ContentStore

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
READ_TIMEOUT_S: Final = 30.0
_SETS_KEPT: Final = 16
CHUNK_CONTENT_TYPE: Final = "application/octet-stream"
CORRUPT_ENV: Final = "SHOAL_TEST_CORRUPT_CHUNKS"
"""Tests only: ``1`` makes this agent serve every chunk with its first byte changed (a holder
whose disk or memory lies), to show that the fetcher drops it."""


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
        self._sets: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._corrupt = os.environ.get(CORRUPT_ENV) == "1"

    def _refuse(self, status: int, message: str) -> ApiError:
        self.counts["served_refused"] += 1
        return ApiError(status, message)

    async def _manifest(self, digest: str) -> ContentManifest:
        manifest = await asyncio.to_thread(self.store.manifest, digest)
        if manifest is None:
            raise self._refuse(404, f"no content {digest[:12]} here")
        return manifest

    async def manifest(self, digest: str) -> ContentManifest:
        return await self._manifest(digest)

    async def have(self, digest: str) -> dict[str, object]:
        manifest = await self._manifest(digest)
        missing = await asyncio.to_thread(self.store.missing, digest)
        return have_to_wire(manifest, missing)

    async def chunk(self, chunk_digest: str, of: str) -> bytes:
        chunks = self._sets.get(of)
        if chunks is None:
            chunks = (await self._manifest(of)).chunk_digests()
            self._sets[of] = chunks
            while len(self._sets) > _SETS_KEPT:
                self._sets.popitem(last=False)
        else:
            self._sets.move_to_end(of)
        if chunk_digest not in chunks:
            raise self._refuse(404, f"chunk {chunk_digest[:12]} is not of content {of[:12]}")
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                data = await asyncio.to_thread(self.store.read_chunk, chunk_digest)
        except TimeoutError:
            raise self._refuse(503, f"chunk {chunk_digest[:12]}: the disk did not answer") from None
        if data is None:
            raise self._refuse(404, f"chunk {chunk_digest[:12]} is not held here")
        self.counts["served_chunks"] += 1
        self.counts["served_bytes"] += len(data)
        if self._corrupt and data:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data


class Routes:
    """The handlers, for ``agent.daemon.api`` to add behind its agent-role check."""

    def __init__(self, server: ContentServer) -> None:
        self.server = server

    def _digest(self, request: web.Request, key: str) -> str:
        try:
            return check_digest(request.match_info.get(key) or request.query.get(key, ""), key)
        except ApiError:
            self.server.counts["served_refused"] += 1
            raise

    async def manifest(self, request: web.Request) -> web.StreamResponse:
        manifest = await self.server.manifest(self._digest(request, "digest"))
        body = json.dumps(manifest.to_wire(), separators=(",", ":"))
        return web.Response(text=body, content_type="application/json")

    async def have(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(await self.server.have(self._digest(request, "digest")))

    async def chunk(self, request: web.Request) -> web.StreamResponse:
        chunk_digest = self._digest(request, "chunk")
        data = await self.server.chunk(chunk_digest, self._digest(request, "of"))
        return web.Response(body=data, content_type=CHUNK_CONTENT_TYPE)
