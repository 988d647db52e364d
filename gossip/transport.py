"""The thin aiohttp adapter: gossip bodies over HTTPS with mutual TLS between cluster nodes.

Server: ``POST /v1/gossip`` with an opaque ``application/msgpack`` body and a ``Shoal-Protocol``
header. The TLS handshake runs under our control (a plain TCP listener upgraded with
``loop.start_tls``) so that refused handshakes are counted (no client certificate, a certificate
the CA did not sign or that has expired) instead of vanishing into asyncio's log. After the
handshake the peer is known by the node id in its certificate; each request then passes, in this
order: identity (and revocation, when a ``CertTrust`` is given), the peer's token bucket (429),
the protocol header, the content type, the declared length (413, before any byte is read), the
body read itself (capped at ``max_body_bytes``), and the handler. Refusals that say the peer is
not who it should be, or whose body was not read, also close the connection.

Client: one ``aiohttp.ClientSession`` with a keep-alive pool; ``send`` posts a body and returns
the response body (None for 204), raising a :class:`TransportError` subclass otherwise. When the
caller names the node it expects, the server certificate's node id is checked after the
handshake and the response discarded (and its connection closed) on mismatch.

There is no plaintext mode: every peer, the local demo's included, is known by its certificate.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web
from aiohttp.connector import Connection
from cryptography import x509

from gossip import revocation
from gossip.certtrust import Admission, CertTrust
from gossip.identity import IdentityError, NodeIdentity, Role
from gossip.tls import PeerIdentity, client_context, peer_identity, server_context

log = logging.getLogger(__name__)

PATH = "/v1/gossip"
CONTENT_TYPE = "application/msgpack"
PROTOCOL_HEADER = "Shoal-Protocol"
PROTOCOL_VERSION = "1"
REVOCATIONS_CONTENT_TYPE = "application/x-shoal-revocations"
"""A 403 "revoked" answer's body: the revocation list that revokes the caller."""
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

Handler = Callable[[str, Role, bytes], Awaitable[bytes | None]]
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

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket per peer: ``burst`` requests at once, refilled at ``rate_per_s``.

    At most ``max_peers`` buckets are kept (least recently used dropped first), so memory is bounded
    whatever the number of peers; the ids are authenticated, so only members can create buckets.
    """

    rate_per_s: float = 200.0
    burst: float = 400.0
    max_peers: int = 10_000


class TokenBuckets:
    """Per-peer token buckets with bounded memory. Time is passed in (monotonic seconds)."""

    def __init__(self, limit: RateLimit) -> None:
        self._limit = limit
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, peer: str, now: float) -> bool:
        tokens, last = self._buckets.pop(peer, (self._limit.burst, now))
        tokens = min(self._limit.burst, tokens + max(0.0, now - last) * self._limit.rate_per_s)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[peer] = (tokens, now)
        while len(self._buckets) > self._limit.max_peers:
            self._buckets.popitem(last=False)
        return allowed


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_address(address: str, *, allow_any_port: bool = False) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port); port 0 ("any") only for listening."""
    host, sep, port = address.rpartition(":")
    lowest = 0 if allow_any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")
    return host.strip("[]"), int(port)


class _AfterHandshake(asyncio.Protocol):
    """Holds bytes that arrive with the TLS Finished until aiohttp's handler is attached."""

    def __init__(self, inner: asyncio.Protocol) -> None:
        self._inner = inner
        self._ready = False
        self._pending: list[bytes] = []

    def attach(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)
        self._ready = True
        for chunk in self._pending:
            self._inner.data_received(chunk)
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        if self._ready:
            self._inner.data_received(data)
        else:
            self._pending.append(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._ready else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ready:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._ready:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._ready:
            self._inner.resume_writing()


class _TlsGate(asyncio.Protocol):
    """Accepts a TCP connection, runs the TLS handshake itself, then hands over to aiohttp."""

    def __init__(self, owner: GossipServer) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._owner._spawn_handshake(transport)


class GossipServer:
    """``POST /v1/gossip`` over mutual TLS."""

    def __init__(
        self,
        identity: NodeIdentity,
        ca: x509.Certificate,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        *,
        trust: CertTrust | None = None,
        rate_limit: RateLimit = RateLimit(),
        handshake_timeout_s: float = 10.0,
        max_connections: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        app_setup: AppSetup | None = None,
    ) -> None:
        self._ssl = server_context(identity, ca)
        self._handler = handler
        self._host = host
        self._port = port
        self._max_body_bytes = max_body_bytes
        self._trust = trust
        self._buckets = TokenBuckets(rate_limit)
        self._handshake_timeout_s = handshake_timeout_s
        self._max_connections = max_connections
        self._clock = clock
        self._wall_clock = wall_clock
        self.stats = TransportStats()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._app_setup = app_setup

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        if self._server is None:
            raise RuntimeError("server not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def address(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(
            client_max_size=self._max_body_bytes, middlewares=[self._authenticate]
        )
        app.router.add_post(PATH, self._handle)
        if self._app_setup is not None:
            self._app_setup(app)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        factory = self._runner.server
        assert factory is not None
        self._server = await loop.create_server(lambda: _TlsGate(self), self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handshakes):
            task.cancel()
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()
        self._server = None
        self._runner = None

    async def __aenter__(self) -> GossipServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- TLS handshake -------------------------------------------------------------------------

    def _open_connections(self) -> int:
        server = self._runner.server if self._runner is not None else None
        return len(self._handshakes) + (len(server.connections) if server is not None else 0)

    def _spawn_handshake(self, transport: asyncio.Transport) -> None:
        if self._open_connections() >= self._max_connections:
            self.stats.connections_refused += 1
            transport.abort()
            return
        transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self._handshake(transport))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport) -> None:
        assert self._runner is not None
        factory = self._runner.server
        assert factory is not None
        shim = _AfterHandshake(factory())
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport,
                shim,
                self._ssl,
                server_side=True,
                ssl_handshake_timeout=self._handshake_timeout_s,
            )
        except ssl.SSLCertVerificationError as e:
            self.stats.bad_cert += 1
            log.debug("refused a peer certificate: %s", e.verify_message)
            transport.abort()
            return
        except ssl.SSLError as e:
            if e.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
                self.stats.no_client_cert += 1
            else:
                self.stats.handshake_failed += 1
            log.debug("TLS handshake failed: %s", e)
            transport.abort()
            return
        except (OSError, TimeoutError, ConnectionError, RuntimeError) as e:
            self.stats.handshake_failed += 1
            log.debug("TLS handshake failed: %r", e)
            transport.abort()
            return
        if tls is None:
            self.stats.handshake_failed += 1
            transport.abort()
            return
        shim.attach(tls)

    # -- requests ------------------------------------------------------------------------------

    def _refuse(self, status: int, reason: str, *, close: bool) -> web.Response:
        response = web.Response(status=status, text=reason + "\n")
        if close:
            response.force_close()
        return response

    def _peer(self, request: web.Request) -> PeerIdentity | web.Response:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            self.stats.no_client_cert += 1
            return self._refuse(401, "client certificate required", close=True)
        try:
            peer = peer_identity(der)
        except IdentityError as e:
            self.stats.bad_cert += 1
            return self._refuse(403, f"bad certificate: {e}", close=True)
        if self._trust is not None:
            admission = self._trust.check(peer.node_id, der, self._wall_clock())
            if admission is Admission.REVOKED:
                # The answer carries the operator-signed list, so that a revoked node that still
                # runs learns it is revoked (it verifies the list itself) and stops.
                self.stats.revoked += 1
                response = web.Response(
                    status=403,
                    body=revocation.encode(self._trust.revocations),
                    content_type=REVOCATIONS_CONTENT_TYPE,
                )
                response.force_close()
                return response
            if admission is not Admission.ADMITTED:
                self.stats.bad_cert += 1
                return self._refuse(403, f"certificate {admission.value}", close=True)
        return peer

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Application routes get the same identity check as gossip, and the peer to act on."""
        if request.path == PATH:
            return await handler(request)
        peer = self._peer(request)
        if isinstance(peer, web.Response):
            return peer
        if not self._buckets.take(peer.node_id, self._clock()):
            self.stats.rate_limited += 1
            response = self._refuse(429, "slow down", close=False)
            response.headers["Retry-After"] = "1"
            return response
        request[PEER_KEY] = peer
        return await handler(request)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = self._peer(request)
        if isinstance(peer, web.Response):
            return peer
        if not self._buckets.take(peer.node_id, self._clock()):
            self.stats.rate_limited += 1
            response = self._refuse(429, "slow down", close=False)
            response.headers["Retry-After"] = "1"
            return response
        if request.headers.get(PROTOCOL_HEADER) != PROTOCOL_VERSION:
            self.stats.unknown_protocol_version += 1
            return self._refuse(400, f"{PROTOCOL_HEADER} must be {PROTOCOL_VERSION}", close=True)
        if request.content_type != CONTENT_TYPE:
            self.stats.wrong_content_type += 1
            return self._refuse(415, f"content type must be {CONTENT_TYPE}", close=True)
        length = request.content_length
        if length is not None and length > self._max_body_bytes:
            self.stats.oversized += 1
            return self._refuse(413, f"body over {self._max_body_bytes} bytes", close=True)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.stats.oversized += 1
            return self._refuse(413, f"body over {self._max_body_bytes} bytes", close=True)
        try:
            answer = await self._handler(peer.node_id, peer.role, body)
        except HandlerRejected as e:
            self.stats.handler_rejected += 1
            return self._refuse(400, f"rejected: {e}", close=False)
        except Exception:
            self.stats.handler_failed += 1
            log.exception("gossip handler failed for a body from %s", peer.node_id)
            return self._refuse(500, "handler failed", close=False)
        self.stats.accepted += 1
        headers = {PROTOCOL_HEADER: PROTOCOL_VERSION}
        if answer is None:
            return web.Response(status=204, headers=headers)
        return web.Response(body=answer, content_type=CONTENT_TYPE, headers=headers)


_PeerCheck = Callable[[asyncio.Transport | None], None]
_PEER_CHECK: ContextVar[_PeerCheck | None] = ContextVar("shoal_peer_check", default=None)


class _PeerCheckingRequest(aiohttp.ClientRequest):
    """Checks the server's certificate (node id, revocation) before the request is written."""

    async def send(self, conn: Connection) -> aiohttp.ClientResponse:
        check = _PEER_CHECK.get()
        if check is not None:
            check(conn.transport)
        return await super().send(conn)


class PooledSession:
    """Owns one lazily made, kept-alive ``aiohttp.ClientSession`` (remade if it was closed);
    ``close()`` or leaving ``async with`` closes it. Subclasses say how to make it."""

    _session: aiohttp.ClientSession | None = None

    def _make_session(self) -> aiohttp.ClientSession:
        raise NotImplementedError

    def _pooled(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._make_session()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class GossipClient(PooledSession):
    """Posts gossip bodies to peers over one pooled, keep-alive ``aiohttp.ClientSession``.

    One connection per peer by default: a send to a peer whose connection is busy waits for it
    (a loopback round trip is about half a millisecond) instead of opening another. A fresh
    connection costs a TLS handshake, about ten times a request in CPU, and a mesh starting
    at once used to open two or three per pair of members.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        ca: x509.Certificate,
        *,
        trust: CertTrust | None = None,
        max_connections: int = 256,
        max_connections_per_peer: int = 1,
        keepalive_timeout_s: float = 30.0,
        max_response_bytes: int = DEFAULT_MAX_BODY_BYTES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._ssl = client_context(identity, ca)
        self._identity = identity
        self._trust = trust
        self._max_connections = max_connections
        self._max_per_peer = max_connections_per_peer
        self._keepalive_timeout_s = keepalive_timeout_s
        self._max_response_bytes = max_response_bytes
        self._wall_clock = wall_clock
        self._headers = {PROTOCOL_HEADER: PROTOCOL_VERSION, "Content-Type": CONTENT_TYPE}
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The pooled session (this node's certificate, kept-alive connections to its peers).
        The agent's short calls to other agents ride on it: their connections are warm from
        gossip, so a call rarely waits for a TLS handshake."""
        return self._pooled()

    def _make_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=self._ssl,
            limit=self._max_connections,
            limit_per_host=self._max_per_peer,
            keepalive_timeout=self._keepalive_timeout_s,
        )
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            auto_decompress=False,
            request_class=_PeerCheckingRequest,
        )

    def _check_server(self, transport: asyncio.Transport | None, expect: str | None) -> None:
        """Runs on the fresh or pooled connection before any request byte is written."""
        ssl_object: Any = transport.get_extra_info("ssl_object") if transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            raise PeerMismatch("server presented no certificate")
        try:
            peer = peer_identity(der)
        except IdentityError as e:
            raise PeerMismatch(f"server certificate: {e}") from e
        if expect is not None and peer.node_id != expect:
            raise PeerMismatch(f"expected node {expect}, server is {peer.node_id}")
        if self._trust is not None:
            admission = self._trust.check(peer.node_id, der, self._wall_clock())
            if admission is not Admission.ADMITTED:
                raise PeerMismatch(f"server {peer.node_id}: certificate {admission.value}")

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        length = response.content_length
        if length is not None and length > self._max_response_bytes:
            raise RemoteRejected(response.status, "response over the size limit")
        chunks: list[bytes] = []
        total = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            total += len(chunk)
            if total > self._max_response_bytes:
                raise RemoteRejected(response.status, "response over the size limit")
            chunks.append(chunk)
        return b"".join(chunks)

    async def send(
        self,
        address: str,
        body: bytes,
        timeout_s: float,
        expect_node_id: str | None = None,
    ) -> bytes | None:
        """POST ``body`` to the peer at ``"host:port"``; its answer, or None when it had none."""
        host, port = split_address(address)
        url_host = f"[{host}]" if ":" in host else host
        url = f"https://{url_host}:{port}{PATH}"
        session = self._pooled()
        token = _PEER_CHECK.set(lambda transport: self._check_server(transport, expect_node_id))
        try:
            async with session.post(
                url, data=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                if response.status == 204:
                    return None
                if response.status == 403 and response.content_type == REVOCATIONS_CONTENT_TYPE:
                    raise RevokedByPeer(address, await self._read_capped(response))
                if response.status != 200:
                    raise RemoteRejected(response.status, response.reason or "")
                return await self._read_capped(response)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"{address}: {e!r}") from e
        finally:
            _PEER_CHECK.reset(token)
