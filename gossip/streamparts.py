"""What a gossip stream is made of (:mod:`gossip.streams` runs them): the limits and counters of
a member's streams, the delegate the stream pool serves, the frames of calls, and one stream's
record with its queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import aiohttp
import msgpack
from aiohttp import web

from gossip.certtrust import Admission, CertTrust
from gossip.droplist import dropped
from gossip.identity import IdentityError, Role
from gossip.tls import PeerIdentity, peer_identity
from gossip.transport import (
    DEFAULT_MAX_BODY_BYTES,
)

log = logging.getLogger("gossip.streams")

CALL_REQUEST, CALL_ANSWER = 0, 1
_CALL_MARK = b"\x95"
"""A call frame is a five-element msgpack array; a gossip body is a two-element one."""


class CallFailed(Exception):
    """A call over a stream got no answer (the stream could not be opened, ended, or its queue
    was full): the peer may or may not have acted. ``legacy``: the peer predates streams, so the
    caller may use HTTP instead (nothing was sent)."""

    def __init__(self, reason: str, *, legacy: bool = False) -> None:
        super().__init__(reason)
        self.legacy = legacy


def call_frame(kind: int, call_id: int, head: str | int, content_type: str, body: bytes) -> bytes:
    frame: bytes = msgpack.packb([kind, call_id, head, content_type, body], use_bin_type=True)
    return frame


def is_call(body: bytes) -> bool:
    return body[:1] == _CALL_MARK


WebSocket = aiohttp.ClientWebSocketResponse | web.WebSocketResponse


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What one member holds for its streams."""

    max_streams: int = 64
    """Open streams, both directions together; the least recently used gives way. Sized for
    the fan-out, not for N: a member probes and gossips to its ring neighbours (at most
    ``2 * probe_rings``, :mod:`gossip.rings`) and answers its observers, so those streams stay;
    the rest of the bound serves push-pull partners, indirect probes and calls, and beyond it a
    stream is reopened (on a resumed TLS session) rather than held for every peer."""
    max_queued_frames: int = 256
    """Messages waiting on one stream (while it connects, or while its peer is slow)."""
    max_queued_bytes: int = 2 * DEFAULT_MAX_BODY_BYTES
    send_timeout_s: float = 3.0
    """A write that cannot drain this long closes its stream (the peer stalled)."""
    connect_timeout_s: float = 3.0
    """To open a stream: TCP, TLS and the upgrade (a starting mesh on two busy cores took up to
    1.3 s for a handshake)."""
    max_sessions: int = 1024
    """TLS sessions kept for resumption, by address (a few KB each)."""
    legacy_s: float = 300.0
    """A peer without streams is sent POSTs this long before it is asked again."""


@dataclass(slots=True)
class StreamStats:
    """Counters of one member's streams (mutable; read with ``snapshot``)."""

    dialed: int = 0
    """Streams this member opened (each a TLS handshake)."""
    dialed_resumed: int = 0
    """Of those, on a resumed TLS session."""
    dial_failed: int = 0
    accepted_resumed: int = 0
    """Streams peers opened on a resumed session (``transport_streams_accepted`` counts all)."""
    closed_lru: int = 0
    closed_duplicate: int = 0
    """Retired because the pair had opened two at once, or the peer opened a second."""
    closed_gone: int = 0
    """Closed because the peer was declared dead, left, or was revoked."""
    closed_by_peer: int = 0
    send_timeouts: int = 0
    frames_sent: int = 0
    frames_dropped: int = 0
    """Messages never written: their stream's queue was full, or it failed or closed first."""
    posted: int = 0
    """Messages sent as POSTs, to peers that predate streams."""
    calls_sent: int = 0
    calls_failed: int = 0
    """Calls that got no answer (stream gone, queue full, dial failed, timed out)."""
    calls_served: int = 0
    calls_malformed: int = 0

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


class StreamDelegate(Protocol):
    """What the pool asks of the member it serves (the gossip adapter)."""

    def stream_frame(self, node_id: str, role: Role, body: bytes) -> None:
        """A message from authenticated ``node_id``; may raise ``HandlerRejected``."""

    def node_at(self, addr: str) -> str | None:
        """The one member whose signed Alive says it listens at ``addr`` (None: none known,
        or more than one claims it)."""

    def post(self, addr: str, body: bytes) -> None:
        """Send ``body`` to ``addr`` as a POST (a peer without streams, or one that refused
        this member's stream and may say why)."""

    def undelivered(self, addr: str, bodies: Sequence[bytes]) -> None:
        """No stream could be opened to ``addr``: these messages were not sent."""

    def connection_lost(self, node_id: str | None, addr: str) -> None:
        """A stream ended without this member closing it, or one to ``addr`` could not be
        opened: the member at the other end (``node_id``, or the one listening at ``addr``)
        may be gone. A hint only: a peer restarting or trimming its own streams looks the same."""

    async def stream_call(
        self, peer: PeerIdentity, path: str, content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        """Answer a call from authenticated ``peer``: (status, answer body)."""


class Stream:
    """One WebSocket to or from a peer, with its queue of messages to write."""

    __slots__ = (
        "addr",
        "calls",
        "closing",
        "outbound",
        "peer",
        "queue",
        "queued_bytes",
        "serving",
        "session_saved",
        "task",
        "writer",
        "ws",
    )

    def __init__(self, addr: str, outbound: bool, peer: PeerIdentity | None = None) -> None:
        self.addr = addr
        """Dialed: the address it serves; accepted: "" until the peer is known by address."""
        self.outbound = outbound
        self.peer = peer
        self.ws: WebSocket | None = None
        self.queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.writer: asyncio.Task[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.closing = False
        self.session_saved = False
        self.calls: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        """This member's calls waiting for their answer on this stream."""
        self.serving = 0
        """The peer's calls this member is answering on this stream."""

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.writer is not None or bool(self.calls) or self.serving > 0


def transport_of(ws: WebSocket) -> asyncio.Transport | None:
    """The connection under ``ws``, to abort it (aiohttp offers a graceful close only, which
    would wait on the very peer that stalled)."""
    if isinstance(ws, aiohttp.ClientWebSocketResponse):
        conn = ws._response.connection
        return conn.transport if conn is not None else None
    writer = ws._writer
    return writer.transport if writer is not None else None


def answering_member(
    ws: aiohttp.ClientWebSocketResponse, trust: CertTrust | None, now: float
) -> PeerIdentity | None:
    """Who answered a stream this member dialed, if it is a member this one admits (its
    certificate checked again: the TLS layer only proved the CA signed it)."""
    ssl_object: Any = ws.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return None
    try:
        peer = peer_identity(der)
    except IdentityError:
        return None
    if dropped(peer.node_id):
        return None
    if trust is not None:
        admission = trust.check(peer.node_id, der, now)
        if admission is not Admission.ADMITTED:
            log.debug("stream server %s refused: %s", peer.node_id, admission.value)
            return None
    return peer
