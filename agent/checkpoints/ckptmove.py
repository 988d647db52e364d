"""Moving checkpoints between agents: the I/O around ``agent.checkpoints.transfer``, over the
agents' channel.

Only a job's owner moves its checkpoint, and only between agents: it *pulls* the checkpoint an
attempt left on its runner into its own :class:`~agent.checkpoints.ckptfiles.Vault` (after each
checkpoint the runner notices, and when the attempt stops), and *pushes* the copy it holds to the
node that runs the next attempt (and, when the owner is itself the runner, to the job's replica, so
that a copy survives the node; and to the new owner it hands the job to). Every request names
the job; the agent asked answers only an agent that may act as the job's owner
(``agent.job.authority``), or, for the folder of an attempt, the agent that started that attempt.
Anyone else is refused (403) and counted (``shoal_internal_refused_total{call="checkpoint"}``,
``shoal_checkpoint_total{what=...}``).
Jobs never hold an agent's key, so a job cannot ask for anything.

Routes, role ``agent``, under ``/v1/internal/checkpoint/<job id>``:

- ``GET ?attempt=N``: the manifest of the job's folder here, when N is the attempt that last
  ran here (409 otherwise: a stale folder is never served as a newer attempt's checkpoint);
- ``GET /chunk?attempt=N&file=I&offset=O&length=L``: one frame of it;
- ``POST /offer`` (the manifest, JSON): get ready to receive it; answers the bytes held of each
  file (``offsets``), all of them when the same checkpoint is held already;
- ``POST /chunk`` (one frame, ``application/octet-stream``): answers ``complete`` once the copy
  is whole and verified.

A transfer cut off (a dropped connection, a timeout) starts again from the offsets the receiver
holds, a few times (``shoal_checkpoint_total{what="resumed"}``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from agent.checkpoints.ckptfiles import FolderReader, Vault
from agent.checkpoints.transfer import (
    ChunkRef,
    Frame,
    Manifest,
    TransferError,
    TransferLimits,
    plan,
)
from agent.common.errors import ApiError
from agent.job.jobspec import check_job_id
from agent.mesh.context import AgentContext
from agent.mesh.peers import PeerClient, PeerError, PeerRefused, PeerUnreachable

log = logging.getLogger("shoal.checkpoint")

PATH = "/v1/internal/checkpoint"
FRAME_CONTENT_TYPE = "application/octet-stream"
TRANSFER_TRIES = 5
"""Starts of one transfer (the first, then resumes) before it is given up."""
RESUME_WAIT_S = 0.2
"""The wait before the first resume of a cut transfer; it doubles for each further one."""
CHUNK_TIMEOUT_S = 30.0
DROP_ENV = "SHOAL_TEST_DROP_CHUNK_AT"
"""Tests only: cut the connection of the Nth chunk this agent serves or receives, once."""


class NotAllowed(Exception):
    """A caller with no authority over the job's checkpoint."""


class LocalJobs(Protocol):
    """What the checkpoint service reads of the jobs run here (``agent.running.runner.Runner``)."""

    def checkpoint_folder(self, job_id: str) -> Path:
        """The job's checkpoint folder on this node."""
        ...

    def last_attempt(self, job_id: str) -> tuple[int, str | None] | None:
        """The attempt of the job that runs or last ran here, and the agent that started it."""
        ...


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """Which checkpoint an attempt resumes from: written by ``attempt``, content ``digest``."""

    attempt: int
    digest: str


class Checkpoints:
    """This agent's side of checkpoint transfers: it serves and receives, and, for the jobs it
    owns, drives pulls and pushes."""

    def __init__(
        self,
        ctx: AgentContext,
        vault: Vault,
        local: LocalJobs,
        job_uid: int | None,
        refused: Counter[str],
    ) -> None:
        """``job_uid``: who owns the files of a job's folder (others are left out);
        ``refused``: the agent's ``shoal_internal_refused_total`` counter."""
        self.node_id = ctx.node_id
        self.authority = ctx.authority
        self.peers = ctx.peers
        self.addr_of = ctx.mesh.addr_of
        self.vault = vault
        self.local = local
        self.limits = vault.limits
        self.reader = FolderReader(job_uid, self.limits)
        self.counts: Counter[str] = Counter()
        """``shoal_checkpoint_total`` by what: pulled, pushed, resumed, refused, failed."""
        self._refused = refused
        self._served: dict[tuple[str, int], Manifest] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        drop = os.environ.get(DROP_ENV, "")
        self._drop_at = int(drop) if drop.isdigit() else 0
        self._chunks_seen = 0

    def forget(self, job_id: str) -> None:
        """The job has ended: drop the copy held of it."""
        if self.vault.has(job_id):
            self.vault.forget(job_id)
        self._locks.pop(job_id, None)

    def lock(self, job_id: str) -> asyncio.Lock:
        return self._locks.setdefault(job_id, asyncio.Lock())

    # -- serving ---------------------------------------------------------------------------------

    def _check(self, job_id: str, caller: str, *, started_by: str | None = None) -> None:
        if caller == started_by or self.authority.may_own(job_id, caller):
            return
        self.counts["refused_not_owner"] += 1
        self._refused["checkpoint"] += 1
        log.warning("refused a checkpoint transfer of %s from %s", job_id[:8], caller[:8])
        raise NotAllowed(f"{caller[:8]} may not move the checkpoint of job {job_id}")

    def _attempt_here(self, job_id: str, attempt: int, caller: str) -> Path:
        last = self.local.last_attempt(job_id)
        self._check(job_id, caller, started_by=last[1] if last else None)
        if last is None or last[0] != attempt:
            what = f"attempt {last[0]}" if last else "no attempt"
            raise ApiError(409, f"{what} of {job_id} ran here last, not attempt {attempt}")
        return self.local.checkpoint_folder(job_id)

    async def serve_manifest(self, job_id: str, attempt: int, caller: str) -> Manifest:
        folder = self._attempt_here(job_id, attempt, caller)
        scan = await asyncio.to_thread(self.reader.scan, folder, job_id, attempt)
        if scan.skipped:
            log.warning("checkpoint of %s: %d entries left out", job_id[:8], scan.skipped)
        self._served[(job_id, attempt)] = scan.manifest
        while len(self._served) > 256:
            self._served.pop(next(iter(self._served)))
        return scan.manifest

    async def serve_chunk(self, job_id: str, attempt: int, ref: ChunkRef, caller: str) -> bytes:
        folder = self._attempt_here(job_id, attempt, caller)
        manifest = self._served.get((job_id, attempt))
        if manifest is None or not 0 <= ref.index < len(manifest.files):
            raise ApiError(409, "ask for the manifest first")
        frame = await asyncio.to_thread(self.reader.read, folder, manifest, ref)
        return frame.encode()

    async def receive_offer(self, job_id: str, body: Any, caller: str) -> tuple[int, ...]:
        self._check(job_id, caller)
        manifest = self._manifest(body)
        if manifest.job_id != job_id:
            raise TransferError("manifest refused: it is of another job")
        async with self.lock(job_id):
            return await asyncio.to_thread(self.vault.begin, manifest)

    async def receive_chunk(self, job_id: str, raw: bytes, caller: str) -> bool:
        self._check(job_id, caller)
        try:
            frame = Frame.decode(raw, self.limits)
        except TransferError:
            self.counts["refused"] += 1
            raise
        async with self.lock(job_id):
            try:
                return await asyncio.to_thread(self.vault.put, job_id, frame)
            except TransferError:
                self.counts["refused"] += 1
                raise

    def _manifest(self, body: Any) -> Manifest:
        try:
            return Manifest.from_wire(body, self.limits)
        except TransferError:
            self.counts["refused"] += 1
            raise

    def drop_now(self) -> bool:
        """The test hook: is this the chunk whose connection is to be cut?"""
        self._chunks_seen += 1
        if self._drop_at and self._chunks_seen == self._drop_at:
            self.counts["dropped"] += 1
            return True
        return False

    # -- driving (as the job's owner) ------------------------------------------------------------

    async def pull(self, job_id: str, node: str, attempt: int) -> Manifest | None:
        """Copy the checkpoint attempt ``attempt`` left on ``node`` into the vault; the copy
        held afterwards (``None``: the folder was empty or the pull failed)."""
        async with self.lock(job_id):
            if node == self.node_id:
                source: _Source = _LocalFolder(self, job_id, attempt)
            else:
                addr = self.addr_of(node)
                if addr is None:
                    return None
                source = _RemoteFolder(self.peers, addr, job_id, attempt, self.limits)
            got = await self._copy(source, _VaultSink(self.vault), f"pull of {job_id[:8]}")
            if got is not None:
                self.counts["pulled"] += 1
            return got

    async def push(self, job_id: str, node: str) -> CheckpointRef | None:
        """Send the copy held of the job to ``node``; what it then holds (``None``: nothing
        held here to send). Raises :class:`PeerError` when the copy did not get there."""
        async with self.lock(job_id):  # a pull replacing the copy meanwhile would cut it
            held = self.vault.held(job_id)
            if held is None or not held.files:
                return None
            ref = CheckpointRef(held.attempt, held.digest)
            if node == self.node_id:
                return ref
            addr = self.addr_of(node)
            if addr is None:
                raise PeerUnreachable(f"no address for {node[:8]}")
            got = await self._copy(
                _VaultSource(self.vault, held),
                _RemoteSink(self.peers, addr, job_id, self.limits),
                f"push of {job_id[:8]} to {node[:8]}",
            )
        if got is None:
            raise PeerUnreachable(f"the checkpoint of {job_id[:8]} did not reach {node[:8]}")
        self.counts["pushed"] += 1
        return ref

    async def _copy(self, source: _Source, sink: _Sink, what: str) -> Manifest | None:
        for tries in range(TRANSFER_TRIES):
            if tries:
                self.counts["resumed"] += 1
                # A peer that just vanished is not hammered while gossip finds it dead.
                await asyncio.sleep(RESUME_WAIT_S * 2 ** (tries - 1))
            try:
                manifest = await source.manifest()
                if not manifest.files:
                    return None
                offsets = await sink.begin(manifest)
                complete = all(
                    o == f.size_bytes for o, f in zip(offsets, manifest.files, strict=True)
                )
                for ref in plan(manifest, offsets, self.limits.max_chunk_bytes):
                    complete = await sink.put(await source.chunk(ref))
                if not complete:
                    raise TransferError("the receiver holds less than the manifest says")
                return manifest
            except PeerRefused as exc:  # a refusal would only be repeated
                self.counts["failed"] += 1
                log.info("%s refused: %s", what, exc)
                return None
            except (PeerUnreachable, TransferError) as exc:
                log.info("%s cut (try %d): %s", what, tries + 1, exc)
        self.counts["failed"] += 1
        return None


class _Source(Protocol):
    async def manifest(self) -> Manifest: ...

    async def chunk(self, ref: ChunkRef) -> Frame: ...


class _Sink(Protocol):
    async def begin(self, manifest: Manifest) -> tuple[int, ...]: ...

    async def put(self, frame: Frame) -> bool: ...


class _LocalFolder:
    def __init__(self, cp: Checkpoints, job_id: str, attempt: int) -> None:
        self._cp, self._job_id, self._attempt = cp, job_id, attempt
        self._manifest: Manifest | None = None

    async def manifest(self) -> Manifest:
        """As a remote folder answers: a refusal (another attempt ran here last, or this node
        has no say over the job now) is :class:`PeerRefused`, which a retry would only repeat."""
        try:
            self._manifest = await self._cp.serve_manifest(
                self._job_id, self._attempt, self._cp.node_id
            )
        except ApiError as exc:
            raise PeerRefused(exc.status, str(exc)) from None
        except NotAllowed as exc:
            raise PeerRefused(403, str(exc)) from None
        return self._manifest

    async def chunk(self, ref: ChunkRef) -> Frame:
        assert self._manifest is not None
        folder = self._cp.local.checkpoint_folder(self._job_id)
        return await asyncio.to_thread(self._cp.reader.read, folder, self._manifest, ref)


class _RemoteFolder:
    def __init__(
        self, peers: PeerClient, addr: str, job_id: str, attempt: int, limits: TransferLimits
    ) -> None:
        self._peers, self._addr, self._limits = peers, addr, limits
        self._base = f"{PATH}/{job_id}"
        self._attempt = attempt

    async def manifest(self) -> Manifest:
        raw = await self._peers.fetch(
            self._addr, f"{self._base}?attempt={self._attempt}", max_bytes=16 << 20
        )
        try:
            return Manifest.from_wire(json.loads(raw), self._limits)
        except ValueError as exc:
            raise TransferError(f"manifest refused: {exc}") from None

    async def chunk(self, ref: ChunkRef) -> Frame:
        query = urllib.parse.urlencode(
            {
                "attempt": self._attempt,
                "file": ref.index,
                "offset": ref.offset_bytes,
                "length": ref.length_bytes,
            }
        )
        raw = await self._peers.fetch(
            self._addr,
            f"{self._base}/chunk?{query}",
            max_bytes=self._limits.max_chunk_bytes + 64,
            timeout_s=CHUNK_TIMEOUT_S,
        )
        frame = Frame.decode(raw, self._limits)
        if (frame.index, frame.offset_bytes, len(frame.data)) != (
            ref.index,
            ref.offset_bytes,
            ref.length_bytes,
        ):
            raise TransferError("frame refused: not the chunk asked for")
        return frame


class _VaultSource:
    def __init__(self, vault: Vault, held: Manifest) -> None:
        self._vault, self._held = vault, held

    async def manifest(self) -> Manifest:
        return self._held

    async def chunk(self, ref: ChunkRef) -> Frame:
        return await asyncio.to_thread(self._vault.read, self._held.job_id, self._held, ref)


class _VaultSink:
    def __init__(self, vault: Vault) -> None:
        self._vault = vault
        self._job_id = ""

    async def begin(self, manifest: Manifest) -> tuple[int, ...]:
        self._job_id = manifest.job_id
        return await asyncio.to_thread(self._vault.begin, manifest)

    async def put(self, frame: Frame) -> bool:
        return await asyncio.to_thread(self._vault.put, self._job_id, frame)


class _RemoteSink:
    def __init__(self, peers: PeerClient, addr: str, job_id: str, limits: TransferLimits) -> None:
        self._peers, self._addr, self._limits = peers, addr, limits
        self._base = f"{PATH}/{job_id}"

    async def begin(self, manifest: Manifest) -> tuple[int, ...]:
        data = json.dumps(manifest.to_wire(), separators=(",", ":")).encode()
        answer = await self._post(f"{self._base}/offer", data, "application/json")
        offsets = answer.get("offsets")
        if not isinstance(offsets, list) or len(offsets) != len(manifest.files):
            raise TransferError("the receiver's offsets do not match the manifest")
        return tuple(int(o) for o in offsets)

    async def put(self, frame: Frame) -> bool:
        answer = await self._post(f"{self._base}/chunk", frame.encode(), FRAME_CONTENT_TYPE)
        return bool(answer.get("complete"))

    async def _post(self, path: str, data: bytes, content_type: str) -> dict[str, Any]:
        status, answer = await self._peers.post(
            self._addr, path, data, content_type, timeout_s=CHUNK_TIMEOUT_S
        )
        if status >= 500:
            raise PeerUnreachable(f"{self._addr} {path}: {status} {answer.get('error', '')}")
        if status >= 400:
            raise PeerRefused(status, str(answer.get("error", "")))
        return answer


# -- the routes ----------------------------------------------------------------------------------


def _int(request: web.Request, name: str, high: int = 1 << 62) -> int:
    text = request.query.get(name, "")
    if not text.isdigit() or int(text) > high:
        raise ApiError(400, f"{name} must be a non-negative integer")
    return int(text)


async def _cut(request: web.Request, body: bytes) -> web.StreamResponse:
    """Send part of an answer, then drop the connection (the test hook)."""
    response = web.StreamResponse(
        headers={"Content-Type": FRAME_CONTENT_TYPE, "Content-Length": str(len(body))}
    )
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    if request.transport is not None:
        request.transport.abort()
    return response


class Routes:
    """The handlers of the routes above, for ``agent.daemon.api`` to add behind its agent-role
    check."""

    def __init__(self, cp: Checkpoints) -> None:
        self.cp = cp

    async def _run(self, coro: Any) -> Any:
        try:
            return await coro
        except NotAllowed as exc:
            raise ApiError(403, str(exc)) from None
        except TransferError as exc:
            raise ApiError(400, str(exc)) from None
        except PeerError as exc:  # pragma: no cover - the handlers make no calls
            raise ApiError(502, str(exc)) from None

    async def manifest(self, request: web.Request, caller: str) -> web.StreamResponse:
        job_id = check_job_id(request.match_info["job_id"])
        attempt = _int(request, "attempt")
        manifest = await self._run(self.cp.serve_manifest(job_id, attempt, caller))
        return web.json_response(manifest.to_wire())

    async def chunk(self, request: web.Request, caller: str) -> web.StreamResponse:
        job_id = check_job_id(request.match_info["job_id"])
        ref = ChunkRef(
            _int(request, "file", 1 << 31),
            _int(request, "offset"),
            _int(request, "length", self.cp.limits.max_chunk_bytes),
        )
        body = await self._run(self.cp.serve_chunk(job_id, _int(request, "attempt"), ref, caller))
        if self.cp.drop_now():
            return await _cut(request, body)
        return web.Response(body=body, content_type=FRAME_CONTENT_TYPE)

    async def offer(self, request: web.Request, caller: str) -> web.StreamResponse:
        job_id = check_job_id(request.match_info["job_id"])
        if request.content_type != "application/json":
            raise ApiError(415, "content type must be application/json")
        try:
            body = json.loads(await request.read())
        except ValueError:
            raise ApiError(400, "body is not JSON") from None
        offsets = await self._run(self.cp.receive_offer(job_id, body, caller))
        return web.json_response({"offsets": list(offsets)})

    async def put(self, request: web.Request, caller: str) -> web.StreamResponse:
        job_id = check_job_id(request.match_info["job_id"])
        if request.content_type != FRAME_CONTENT_TYPE:
            raise ApiError(415, f"content type must be {FRAME_CONTENT_TYPE}")
        raw = await request.read()
        complete = await self._run(self.cp.receive_chunk(job_id, raw, caller))
        if self.cp.drop_now() and request.transport is not None:
            request.transport.abort()  # written, but the sender never hears so: it resumes
        return web.json_response({"complete": complete})
