"""The gossip server: ``POST /v1/gossip`` and the stream upgrade over HTTPS with mutual TLS.

It accepts TCP connections itself and runs the TLS handshake under its control, so that refused
handshakes are counted (no client certificate, a certificate the CA did not sign or that has
expired) instead of vanishing into asyncio's log. TLS starts on a connection only once its whole
ClientHello has come; connections that have not finished their handshake are bounded in number,
per source address and in time (the oldest is closed for a newcomer), and established ones per
peer (see :class:`gossip.admission.ConnectionLimits`); every such closing is counted. After the
handshake the peer is known by the node id in its certificate; each request then passes, in this
order: identity (and revocation, when a ``CertTrust`` is given), the peer's token bucket (429),
the protocol header, the content type, the declared length (413, before any byte is read), the
body read itself (capped at ``max_body_bytes``), and the handler. Refusals that say the peer is
not who it should be, or whose body was not read, also close the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import ssl
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from types import TracebackType

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from cryptography import x509

from gossip import droplist, revocation
from gossip.admission import (
    ConnectionLimits,
    FrameGate,
    Unfinished,
    accept,
    client_hello,
    first_record,
)
from gossip.budgets import (
    DEFAULT_CPU_BUDGET,
    DEFAULT_RATE_LIMIT,
    CpuBuckets,
    CpuBudget,
    RateLimit,
    TokenBuckets,
)
from gossip.certtrust import Admission, CertTrust
from gossip.identity import IdentityError, NodeIdentity
from gossip.tls import PeerIdentity, peer_identity, server_context
from gossip.transport import (
    CONTENT_TYPE,
    DEFAULT_MAX_BODY_BYTES,
    PATH,
    PEER_KEY,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    REVOCATIONS_CONTENT_TYPE,
    STREAM_CLOSE_TIMEOUT_S,
    STREAM_PATH,
    AppSetup,
    Handler,
    HandlerRejected,
    StreamAcceptor,
    TransportStats,
)

log = logging.getLogger(__name__)


_DEFAULT_LIMITS = ConnectionLimits()


class _Established(asyncio.Protocol):
    """aiohttp's request handler on a connection whose handshake succeeded, counted per peer."""

    def __init__(self, owner: GossipServer) -> None:
        self._owner = owner
        self._inner: RequestHandler | None = None
        self.peer_key = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner = self._owner._request_handler()
        self._owner._joined(self, transport)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            self._inner.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._left(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def close_when_idle(self) -> None:
        """Close after the request in progress, or now if there is none."""
        if self._inner is None:
            return
        if getattr(self._inner, "_request_in_progress", True):
            self._inner.keep_alive(False)
        else:
            self._inner.force_close()


_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE_S = 0.1
"""How long accepting pauses after an ``accept()`` error with nothing to evict."""


async def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Non-blocking listening sockets on every address ``host`` resolves to."""
    passive = socket.AI_PASSIVE
    try:  # an address needs no lookup, nor the thread a lookup runs in (~0.3 MB of memory)
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=passive | socket.AI_NUMERICHOST
        )
    except socket.gaierror:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=passive)
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:  # worded as asyncio words it: "... address already in use"
                why = f"error while attempting to bind on {address!r}: {e.strerror or e}"
                raise OSError(e.errno, why.lower()) from e
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _reset(sock: socket.socket) -> None:
    """Close with a reset: nothing lingers in the kernel for a peer that may never read."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


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
        rate_limit: RateLimit = DEFAULT_RATE_LIMIT,
        cpu_budget: CpuBudget | None = DEFAULT_CPU_BUDGET,
        limits: ConnectionLimits = _DEFAULT_LIMITS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        app_setup: AppSetup | None = None,
        stream_acceptor: StreamAcceptor | None = None,
    ) -> None:
        """``stream_acceptor``: serve ``STREAM_PATH`` upgrades with it (else that path is 404,
        as on a server that predates streams); ``cpu_budget``: what each peer's stream messages
        may cost this node (``None``: not limited)."""
        self._ssl = server_context(identity, ca)
        self._handler = handler
        self._host = host
        self._port = port
        self._max_body_bytes = max_body_bytes
        self._trust = trust
        self._buckets = TokenBuckets(rate_limit)
        self._limits = limits
        self._clock = clock
        self._wall_clock = wall_clock
        self.stats = TransportStats()
        self.gate = FrameGate(
            self.stats,
            self._buckets,
            trust,
            clock=clock,
            wall_clock=wall_clock,
            cpu=None if cpu_budget is None else CpuBuckets(cpu_budget),
        )
        self._stream_acceptor = stream_acceptor
        self._runner: web.AppRunner | None = None
        self._listeners: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        self._unfinished: OrderedDict[Unfinished, None] = OrderedDict()
        """Accepted connections whose handshake has not ended, oldest first."""
        self._unfinished_by_source: Counter[str] = Counter()
        self._handshaking = 0
        self._peers: dict[bytes, OrderedDict[_Established, None]] = {}
        """Established connections by the peer's certificate, oldest first."""
        self._app_setup = app_setup
        self._bound_port: int | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        if not self._listeners:
            raise RuntimeError("server not started")
        if self._bound_port is None:  # asked for every message sent: one system call, once
            self._bound_port = int(self._listeners[0].getsockname()[1])
        return self._bound_port

    @property
    def address(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(
            client_max_size=self._max_body_bytes, middlewares=[self._authenticate]
        )
        app.router.add_post(PATH, self._handle)
        if self._stream_acceptor is not None:
            app.router.add_get(STREAM_PATH, self._handle_stream)
        if self._app_setup is not None:
            self._app_setup(app)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=self._limits.idle_timeout_s,
        )
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        self._listeners = await _listen(self._host, self._port, self._limits.listen_backlog)
        self._acceptors = [loop.create_task(self._accept(sock)) for sock in self._listeners]

    async def stop(self) -> None:
        tasks = self._acceptors + [e.task for e in self._unfinished if e.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self._listeners:
            sock.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self._listeners = []
        self._bound_port = None
        self._acceptors = []

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

    # -- accepting and the TLS handshake -------------------------------------------------------

    def _request_handler(self) -> RequestHandler:
        assert self._runner is not None and self._runner.server is not None
        return self._runner.server()

    def _established(self) -> int:
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    async def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, address = await accept(listener)
            except OSError as e:
                self.stats.accept_failed += 1
                log.debug("accept failed: %r", e)
                if e.errno == errno.ECONNABORTED:
                    continue
                # Out of descriptors: the oldest unfinished connection gives its own up.
                oldest = self._oldest(None)
                if e.errno in _OUT_OF_DESCRIPTORS and oldest is not None:
                    self._evict(oldest)
                else:
                    await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            self._admit(sock, str(address[0]))
            # Let the loop see what came in the meantime (a ClientHello, say) before the next:
            # an accept that does not wait never yields on its own.
            await asyncio.sleep(0)

    def _admit(self, sock: socket.socket, source: str) -> None:
        if self._established() >= self._limits.max_connections:
            self.stats.connections_refused += 1
            _reset(sock)
            return
        self._make_room(source)
        loop = asyncio.get_running_loop()
        entry = Unfinished(sock, source, loop.time())
        self._unfinished[entry] = None
        self._unfinished_by_source[source] += 1
        entry.task = loop.create_task(self._handshake(sock, entry))
        # A task cancelled before its first step never runs its own ``except``: evicted, or the
        # server stopped, in the iteration that accepted it, its socket would be left to the GC.
        entry.task.add_done_callback(lambda task: _reset(sock) if task.cancelled() else None)

    def _make_room(self, source: str) -> None:
        """Evict until one more connection from ``source`` fits."""
        limits = self._limits
        while True:
            if self._unfinished_by_source[source] >= limits.max_unfinished_per_source:
                victim = self._oldest(source)
            elif len(self._unfinished) >= limits.max_unfinished:
                victim = self._oldest(None)
            else:
                return
            if victim is None:
                return
            self._evict(victim)

    def _oldest(self, source: str | None, *, in_tls: bool = False) -> Unfinished | None:
        """Whom to close for a newcomer: the oldest unfinished connection (of ``source``) that
        has not sent its ClientHello, else the oldest in its handshake, else the oldest. With
        ``in_tls``, the oldest in its handshake."""
        in_handshake: Unfinished | None = None
        oldest: Unfinished | None = None
        for entry in self._unfinished:
            if source is not None and entry.source != source:
                continue
            if entry.handshaking:
                if in_tls:
                    return entry
                in_handshake = in_handshake or entry
            # A ClientHello may have come while the loop was busy accepting: peek before closing.
            elif not in_tls and first_record(entry.sock) != "hello":
                return entry
            oldest = oldest or entry
        return None if in_tls else in_handshake or oldest

    def _evict(self, entry: Unfinished | None) -> None:
        if entry is None or entry not in self._unfinished:
            return
        self.stats.handshakes_evicted += 1
        self._forget(entry)
        if entry.task is not None:
            entry.task.cancel()

    def _forget(self, entry: Unfinished) -> None:
        if entry not in self._unfinished:
            return
        del self._unfinished[entry]
        self._unfinished_by_source[entry.source] -= 1
        if self._unfinished_by_source[entry.source] <= 0:
            del self._unfinished_by_source[entry.source]
        if entry.handshaking:
            self._handshaking -= 1

    def _begin_tls(self, entry: Unfinished) -> None:
        entry.handshaking = True
        self._handshaking += 1
        while self._handshaking > self._limits.max_handshaking:
            victim = self._oldest(None, in_tls=True)
            if victim is None or victim is entry:
                return
            self._evict(victim)

    async def _handshake(self, sock: socket.socket, entry: Unfinished) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(entry.accepted_at + self._limits.handshake_timeout_s):
                await client_hello(sock)
                self._begin_tls(entry)
                await loop.connect_accepted_socket(
                    lambda: _Established(self),
                    sock,
                    ssl=self._ssl,
                    ssl_handshake_timeout=self._limits.handshake_timeout_s,
                )
        except asyncio.CancelledError:
            _reset(sock)  # evicted, or the server stops
            raise
        except (OSError, RuntimeError) as e:  # TimeoutError and ssl.SSLError included
            self._count_failure(e)
            _reset(sock)
            return
        finally:
            self._forget(entry)
        took_ms = int((loop.time() - entry.accepted_at) * 1000)
        self.stats.handshake_slowest_ms = max(self.stats.handshake_slowest_ms, took_ms)

    def _count_failure(self, e: BaseException) -> None:
        if isinstance(e, ssl.SSLCertVerificationError):
            self.stats.bad_cert += 1
            log.debug("refused a peer certificate: %s", e.verify_message)
        elif isinstance(e, ssl.SSLError) and e.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            self.stats.no_client_cert += 1
        elif isinstance(e, TimeoutError):
            self.stats.handshake_timeouts += 1
        else:
            self.stats.handshake_failed += 1
            log.debug("TLS handshake failed: %r", e)

    def _joined(self, conn: _Established, transport: asyncio.BaseTransport) -> None:
        """A handshake succeeded: count the connection for its peer, closing the peer's oldest
        (once idle) past its share."""
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        self.stats.handshakes += 1
        if ssl_object is not None and ssl_object.session_reused:
            self.stats.handshakes_resumed += 1
        conn.peer_key = der or b""
        conns = self._peers.setdefault(conn.peer_key, OrderedDict())
        conns[conn] = None
        if len(conns) > self._limits.max_connections_per_peer:
            oldest, _ = conns.popitem(last=False)
            self.stats.peer_connections_closed += 1
            oldest.close_when_idle()

    def _left(self, conn: _Established) -> None:
        conns = self._peers.get(conn.peer_key)
        if conns is not None:
            conns.pop(conn, None)
            if not conns:
                del self._peers[conn.peer_key]

    # -- requests ------------------------------------------------------------------------------

    def _refuse(self, status: int, reason: str, *, close: bool) -> web.Response:
        response = web.Response(status=status, text=reason + "\n")
        if close:
            response.force_close()
        return response

    def _peer(self, request: web.Request) -> PeerIdentity | web.Response:
        transport = request.transport
        if transport is None or transport.is_closing():
            # The peer went away before its request was read (asyncio's TLS transport, closed,
            # has no certificate left to ask for): counted, not an error of ours.
            self.stats.requests_peer_gone += 1
            log.debug("a request's peer went away before it was read")
            return self._refuse(400, "connection gone", close=True)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            self.stats.no_client_cert += 1
            return self._refuse(401, "client certificate required", close=True)
        try:
            peer = peer_identity(der)
        except IdentityError as e:
            self.stats.bad_cert += 1
            return self._refuse(403, f"bad certificate: {e}", close=True)
        if droplist.dropped(peer.node_id):
            return self._refuse(503, "dropped (test partition)", close=True)
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
        if request.path in (PATH, STREAM_PATH):
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

    def _admit_gossip(self, request: web.Request) -> PeerIdentity | web.Response:
        """What a gossip POST and a stream upgrade both pass: identity and revocation (a revoked
        peer is shown the list), the peer's token bucket, the protocol header."""
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
        return peer

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = self._admit_gossip(request)
        if isinstance(peer, web.Response):
            return peer
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
        if not self.gate.within_cpu_budget(peer, self._clock()):
            response = self._refuse(429, "slow down", close=False)
            response.headers["Retry-After"] = "1"
            return response
        started_s = self.gate.cpu_now()
        try:
            # The handler answers without waiting on anything: the CPU it took is its own.
            answer = await self._handler(peer.node_id, peer.role, body)
        except HandlerRejected as e:
            self.stats.handler_rejected += 1
            return self._refuse(400, f"rejected: {e}", close=False)
        except Exception:
            self.stats.handler_failed += 1
            log.exception("gossip handler failed for a body from %s", peer.node_id)
            return self._refuse(500, "handler failed", close=False)
        finally:
            self.gate.charge(peer, started_s)
        self.stats.accepted += 1
        headers = {PROTOCOL_HEADER: PROTOCOL_VERSION}
        if answer is None:
            return web.Response(status=204, headers=headers)
        return web.Response(body=answer, content_type=CONTENT_TYPE, headers=headers)

    async def _handle_stream(self, request: web.Request) -> web.StreamResponse:
        """A stream upgrade passes the checks a POST does (identity and revocation, with the
        list shown to a revoked peer; the token bucket; the protocol header), then runs until
        either side closes it; each of its messages then passes :class:`FrameGate`."""
        peer = self._admit_gossip(request)
        if isinstance(peer, web.Response):
            return peer
        ws = web.WebSocketResponse(
            max_msg_size=self._max_body_bytes,
            compress=False,
            autoping=True,
            heartbeat=None,
            timeout=STREAM_CLOSE_TIMEOUT_S,
        )
        if not ws.can_prepare(request).ok:
            self.stats.frames_malformed += 1
            return self._refuse(400, "not a WebSocket upgrade", close=True)
        assert self._stream_acceptor is not None
        try:
            await ws.prepare(request)
        except ConnectionError as exc:  # aiohttp's ClientConnectionResetError included
            # The peer went away before the upgrade was answered (its dial timed out on a busy
            # machine, or it was killed): an everyday event in a large mesh, not an error.
            self.stats.streams_peer_gone += 1
            log.debug("stream upgrade from %s: the peer went away (%r)", peer.node_id, exc)
            return web.Response(status=499)  # aiohttp finds the connection gone and drops it
        self.stats.streams_accepted += 1
        await self._stream_acceptor(peer, ws)
        return ws
