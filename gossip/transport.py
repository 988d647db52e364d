"""The gossip transport: gossip bodies over HTTPS with mutual TLS between cluster nodes.

This module holds what both sides share: the paths, headers and content types, the errors a send
raises, and the server's counters. The server is :mod:`gossip.server`, who may connect and what
each peer may spend :mod:`gossip.admission`, the client :mod:`gossip.client`, and addresses
:mod:`gossip.addresses`.

There is no plaintext mode: every peer, the local demo's included, is known by its certificate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from aiohttp import web

from gossip.identity import Role
from gossip.tls import PeerIdentity

PATH = "/v1/gossip"
STREAM_PATH = "/v1/gossip/stream"
"""A WebSocket upgrade (``GET``): one long-lived stream per pair of members, each binary message
one body as ``PATH`` takes it, in either direction (see :mod:`gossip.streams`)."""
CONTENT_TYPE = "application/msgpack"
PROTOCOL_HEADER = "Shoal-Protocol"
PROTOCOL_VERSION = "1"
REVOCATIONS_CONTENT_TYPE = "application/x-shoal-revocations"
"""A 403 "revoked" answer's body: the revocation list that revokes the caller."""
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
STREAM_CLOSE_TIMEOUT_S = 2.0
"""How long a stream's closing waits for the other side's close frame."""

Handler = Callable[[str, Role, bytes], Awaitable[bytes | None]]
StreamAcceptor = Callable[[PeerIdentity, web.WebSocketResponse], Awaitable[None]]
"""Runs an accepted stream (its peer already checked) until it closes."""
AppSetup = Callable[[web.Application], None]
"""Adds the application's own routes (the agent's API) to the same mutual-TLS listener."""
PEER_KEY = web.RequestKey("shoal.peer", PeerIdentity)


def request_peer(request: web.Request) -> PeerIdentity:
    """Who sent an application request: the identity from its client certificate."""
    return request[PEER_KEY]


class TransportError(Exception):
    """A gossip exchange failed; the caller treats the peer as not answering."""


class Unreachable(TransportError):
    """No answer: connection refused or reset, TLS refused, timeout."""


class PeerMismatch(TransportError):
    """The server's certificate names another node than the one the caller expected."""


class RevokedByPeer(TransportError):
    """The peer refused us as revoked, and showed the revocation list (not yet verified)."""

    def __init__(self, address: str, revocations: bytes) -> None:
        super().__init__(f"{address} refuses this node as revoked")
        self.revocations = revocations


class RemoteRejected(TransportError):
    """The server answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"peer answered {status} {reason}")
        self.status = status


class HandlerRejected(Exception):
    """Raised by a server handler to refuse a body (answered 400, counted)."""


class CloseStream(Exception):
    """A stream message says the stream ends (closed, refused, or its peer not admitted)."""


@dataclass(slots=True)
class TransportStats:
    """Counters of what the server accepted and refused (mutable; read with ``snapshot``)."""

    accepted: int = 0
    handshake_failed: int = 0
    connections_refused: int = 0
    no_client_cert: int = 0
    bad_cert: int = 0
    revoked: int = 0
    rate_limited: int = 0
    unknown_protocol_version: int = 0
    wrong_content_type: int = 0
    oversized: int = 0
    handler_rejected: int = 0
    handler_failed: int = 0
    handshake_timeouts: int = 0
    """Connections closed at the handshake deadline: idle, or stalled in the handshake."""
    handshakes_evicted: int = 0
    """Unfinished connections closed to make room for a newer one (idle ones first)."""
    accept_failed: int = 0
    """``accept()`` errors: out of file descriptors, or aborted by the peer."""
    peer_connections_closed: int = 0
    """Established connections closed because their peer held more than its share."""
    handshake_slowest_ms: int = 0
    """The longest a successful handshake took, from accept to its end (a gauge)."""
    streams_accepted: int = 0
    """Stream upgrades accepted (each then counts its frames as ``accepted`` or refused)."""
    streams_peer_gone: int = 0
    """Stream upgrades whose peer went away before the answer (counted, logged at DEBUG)."""
    requests_peer_gone: int = 0
    """Requests (a stream upgrade, a POST, an API call) whose peer's connection was closed before
    they were read (counted, logged at DEBUG): a peer that gave up on a busy listener."""
    handshakes: int = 0
    """TLS handshakes this listener completed (each a peer's new connection)."""
    handshakes_resumed: int = 0
    """Of those, on a resumed TLS session (no certificate signatures made or checked)."""
    frames_malformed: int = 0
    """Stream messages that were not one binary body (text, a protocol error): the stream is
    closed."""
    cpu_limited: int = 0
    """Stream messages dropped, and gossip POSTs answered 429, because their peer had spent its
    CPU budget (:mod:`gossip.budgets`)."""

    def snapshot(self) -> dict[str, int]:
        return asdict(self)
