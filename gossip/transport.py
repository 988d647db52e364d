"""The thin aiohttp adapter: gossip bodies over HTTPS with mutual TLS between cluster nodes.

Server: ``POST /v1/gossip`` with an opaque ``application/msgpack`` body and a ``Shoal-Protocol``
header. The server accepts TCP connections itself and runs the TLS handshake under its control,
so that refused handshakes are counted (no client certificate, a certificate the CA did not sign
or that has expired) instead of vanishing into asyncio's log. TLS starts on a connection only
once its whole ClientHello has come; connections that have not finished their handshake are
bounded in number, per source address and in time (the oldest is closed for a newcomer), and
established ones per peer (see :class:`ConnectionLimits`); every such closing is counted. After
the handshake the peer is known by the node id in its certificate; each request then passes, in this
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
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import ssl
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import aiohttp
from aiohttp import web
from aiohttp.connector import Connection
from aiohttp.web_protocol import RequestHandler
from cryptography import x509

from gossip import droplist, revocation
from gossip.budgets import (
    DEFAULT_CPU_BUDGET,
    DEFAULT_RATE_LIMIT,
    Charged,
    CpuBuckets,
    CpuBudget,
    RateLimit,
    TokenBuckets,
)
from gossip.certtrust import Admission, CertTrust
from gossip.identity import IdentityError, NodeIdentity, Role
from gossip.revocation import RevocationList
from gossip.tls import PeerIdentity, client_context, peer_identity, server_context

T = TypeVar("T")

log = logging.getLogger(__name__)

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
    frames_malformed: int = 0
    """Stream messages that were not one binary body (text, a protocol error): the stream is
    closed."""
    cpu_limited: int = 0
    """Stream messages dropped, and gossip POSTs answered 429, because their peer had spent its
    CPU budget (:mod:`gossip.budgets`)."""

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What the listener holds for connections, before and after they prove who they are.

    A connection is *unfinished* from accept until its TLS handshake ends. Until it has sent a
    whole first TLS record (the ClientHello) it is a bare socket, about a kilobyte, and the TLS
    layer is only started then; from there on it holds asyncio's 256 KiB read buffer and
    OpenSSL's state, hence the tighter ``max_handshaking``. When a bound is reached the oldest
    unfinished connection is closed for the newcomer (one from the newcomer's own source when
    that source is over its share, and one that has not sent its ClientHello before one in the
    handshake), so a flood of connections that never speak, or that send a byte and stop,
    cannot lock peers out: a real handshake ends in milliseconds, long before the flood
    reaches it.
    """

    handshake_timeout_s: float = 5.0
    """From accept to the end of the handshake. Measured here on loopback: 3 ms on a quiet
    machine; while 32 agents start at once on two shared cores, most take 0.1-1 s and the
    slowest 1.2-1.3 s (0.6 s of it before the client's first byte)."""
    max_unfinished: int = 512
    """Unfinished connections, all sources together (a file descriptor and ~3 KB each while
    they are silent)."""
    max_unfinished_per_source: int = 256
    """Unfinished connections from one address. On loopback every peer shares one: 32 agents
    starting at once held at most 19 unfinished connections at one agent."""
    max_handshaking: int = 64
    """Unfinished connections already in the TLS handshake (~0.3 MB each); at most 15 at once
    while 32 agents start."""
    max_connections: int = 1024
    """Established connections; a newcomer beyond is refused."""
    max_connections_per_peer: int = 32
    """Established connections of one peer (one certificate); beyond, its oldest is closed
    once idle."""
    idle_timeout_s: float = 120.0
    """An established connection without a request this long is closed (clients close theirs
    after 15-30 s, so they never race the server's close)."""
    listen_backlog: int = 512
    """Connections the kernel queues until they are accepted. A flood outruns any accept loop
    in Python; past the queue the kernel drops SYNs and every client, a real one too, waits a
    second to retry. 128 lost ~1% of a flood's connections to that here, 512 ~0.1%."""


@dataclass(slots=True, eq=False)
class _Unfinished:
    """An accepted connection whose handshake has not ended."""

    sock: socket.socket
    source: str
    accepted_at: float
    task: asyncio.Task[None] | None = None
    handshaking: bool = False
    """The ClientHello came and the TLS handshake runs."""


ADMISSION_FRESH_S = 1.0
"""How long a stream peer's admission (validity, revocation) is taken as checked."""
MAX_FRESH_ADMISSIONS = 4096


class FrameGate:
    """The checks every stream message passes, in either direction, with the server's counters:
    the peer's certificate still admitted (revocation, expiry: ``revoked``, ``bad_cert``; the
    stream is closed), its token bucket (``rate_limited``: the message is dropped), its CPU
    budget (``cpu_limited``: dropped; what handling its messages cost is charged to it), one
    binary message within the size limit (``oversized``, ``frames_malformed``: the stream is
    closed), then the handler (``accepted``, ``handler_rejected``, ``handler_failed``)."""

    def __init__(
        self,
        stats: TransportStats,
        buckets: TokenBuckets,
        trust: CertTrust | None,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        cpu: CpuBuckets | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        """``cpu``: the peers' CPU budgets (none: not limited); ``cpu_clock``: this thread's
        CPU time, which a handler's cost is read from."""
        self.stats = stats
        self._buckets = buckets
        self._trust = trust
        self._clock = clock
        self._wall_clock = wall_clock
        self._cpu = cpu
        self._cpu_clock = cpu_clock
        self._fresh: dict[str, tuple[float, RevocationList, bytes]] = {}
        """Peers admitted lately: (until, under which revocation list, their certificate)."""

    def admitted(self, peer: PeerIdentity) -> bool:
        """Is the peer's certificate good now? Counts the refusal when not. An admission holds
        for ``ADMISSION_FRESH_S`` while the revocation list stays the same one (a newer list
        checks every peer again at its next message), so a busy stream does not check its
        certificate per message."""
        trust = self._trust
        if trust is None:
            return True
        now = self._wall_clock()
        revocations = trust.revocations
        fresh = self._fresh.get(peer.node_id)
        if (
            fresh is not None
            and now < fresh[0]
            and fresh[1] is revocations
            and fresh[2] == peer.certificate_der
        ):
            return True
        admission = trust.check(peer.node_id, peer.certificate_der, now)
        if admission is Admission.ADMITTED:
            self._fresh[peer.node_id] = (now + ADMISSION_FRESH_S, revocations, peer.certificate_der)
            if len(self._fresh) > MAX_FRESH_ADMISSIONS:
                self._fresh.pop(next(iter(self._fresh)))
            return True
        self._fresh.pop(peer.node_id, None)
        if admission is Admission.REVOKED:
            self.stats.revoked += 1
        else:
            self.stats.bad_cert += 1
        return False

    def frame(self, peer: PeerIdentity, message: aiohttp.WSMessage) -> bytes | None:
        """The body of one stream message, or None to drop it; raises :class:`CloseStream`
        when the stream must end (closed by the peer, refused, or the peer no longer admitted)."""
        if message.type is not aiohttp.WSMsgType.BINARY:
            if message.type is aiohttp.WSMsgType.ERROR:
                error = message.data
                too_big = aiohttp.WSCloseCode.MESSAGE_TOO_BIG
                if isinstance(error, aiohttp.WebSocketError) and error.code == too_big:
                    self.stats.oversized += 1
                else:
                    self.stats.frames_malformed += 1
            elif message.type is aiohttp.WSMsgType.TEXT:
                self.stats.frames_malformed += 1
            raise CloseStream(message.type.name)  # closing, closed, or refused
        if not self.admitted(peer):
            raise CloseStream("certificate no longer admitted")
        now = self._clock()
        if not self._buckets.take(peer.node_id, now):
            self.stats.rate_limited += 1
            return None
        if not self.within_cpu_budget(peer, now):
            return None
        data: bytes = message.data
        return data

    def within_cpu_budget(self, peer: PeerIdentity, now: float) -> bool:
        """May a message of ``peer`` be handled now? Counts ``cpu_limited`` when not."""
        if self._cpu is None or self._cpu.allows(peer.node_id, now):
            return True
        self.stats.cpu_limited += 1
        return False

    def cpu_now(self) -> float:
        """This thread's CPU time: read before handling a message, then :meth:`charge` it."""
        return self._cpu_clock()

    def charge(self, peer: PeerIdentity, started_s: float) -> None:
        """Charge ``peer`` with the CPU spent since ``started_s`` (:meth:`cpu_now`)."""
        self._charge_s(peer, self._cpu_clock() - started_s)

    def _charge_s(self, peer: PeerIdentity, spent_s: float) -> None:
        if self._cpu is not None:
            self._cpu.charge(peer.node_id, spent_s, self._clock())

    def charged(self, peer: PeerIdentity, coro: Coroutine[Any, Any, T]) -> Charged[T]:
        """``coro`` (the handling of a call of ``peer``'s) with the CPU of each of its steps
        charged to ``peer``, its waits not (:class:`gossip.budgets.Charged`)."""
        return Charged(coro, lambda spent_s: self._charge_s(peer, spent_s), self._cpu_clock)

    def handled(
        self, peer: PeerIdentity, deliver: Callable[[str, Role, bytes], None], body: bytes
    ) -> None:
        started_s = self.cpu_now()
        try:
            deliver(peer.node_id, peer.role, body)
        except HandlerRejected:
            self.stats.handler_rejected += 1
            return
        except Exception:
            self.stats.handler_failed += 1
            log.exception("gossip handler failed for a stream message from %s", peer.node_id)
            return
        finally:
            self.charge(peer, started_s)
        self.stats.accepted += 1


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


_TLS_HANDSHAKE_RECORD = 0x16
_TLS_RECORD_HEADER_BYTES = 5
FIRST_RECORD_POLL_S = (0.005, 0.5)
"""While a connection's first TLS record is incomplete it is peeked at again after a delay that
doubles from the first figure to the second: a real ClientHello comes whole or within a round
trip, and a peer that sent a byte and stopped costs two wakeups a second."""


async def _client_hello(sock: socket.socket) -> None:
    """Return once the peer has sent a whole first TLS record (its ClientHello); raise
    ``ConnectionAbortedError`` if it closed first or sent something that is not TLS. The bytes
    are only peeked at, so a connection costs a bare socket until then. Returns at once on a
    loop that cannot watch a socket without reading it (Windows' proactor)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    fd = sock.fileno()
    try:
        loop.add_reader(fd, wake)
    except NotImplementedError:
        return
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    delay_s, longest_s = FIRST_RECORD_POLL_S
    while (first := _first_record(sock)) == "partial":
        await asyncio.sleep(delay_s)  # readable all along: only time tells that more came
        delay_s = min(2 * delay_s, longest_s)
    if first == "gone":
        raise ConnectionAbortedError("closed, or not TLS, before its ClientHello")


def _first_record(sock: socket.socket) -> Literal["hello", "partial", "gone"]:
    """What the peer has sent so far, peeked at: a whole first TLS handshake record, part of
    one (or nothing), or an end (closed, reset, not TLS)."""
    try:
        head = sock.recv(_TLS_RECORD_HEADER_BYTES, socket.MSG_PEEK)
        if not head or head[0] != _TLS_HANDSHAKE_RECORD:
            return "gone"
        if len(head) < _TLS_RECORD_HEADER_BYTES:
            return "partial"
        whole = _TLS_RECORD_HEADER_BYTES + int.from_bytes(head[3:], "big")
        record = sock.recv(whole, socket.MSG_PEEK)
    except BlockingIOError:
        return "partial"
    except OSError:
        return "gone"
    return "hello" if len(record) >= whole else "partial"


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
        limits: ConnectionLimits = ConnectionLimits(),
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
        self._unfinished: OrderedDict[_Unfinished, None] = OrderedDict()
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
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
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
        entry = _Unfinished(sock, source, loop.time())
        self._unfinished[entry] = None
        self._unfinished_by_source[source] += 1
        entry.task = loop.create_task(self._handshake(sock, entry))

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

    def _oldest(self, source: str | None, *, in_tls: bool = False) -> _Unfinished | None:
        """Whom to close for a newcomer: the oldest unfinished connection (of ``source``) that
        has not sent its ClientHello, else the oldest in its handshake, else the oldest. With
        ``in_tls``, the oldest in its handshake."""
        in_handshake: _Unfinished | None = None
        oldest: _Unfinished | None = None
        for entry in self._unfinished:
            if source is not None and entry.source != source:
                continue
            if entry.handshaking:
                if in_tls:
                    return entry
                in_handshake = in_handshake or entry
            # A ClientHello may have come while the loop was busy accepting: peek before closing.
            elif not in_tls and _first_record(entry.sock) != "hello":
                return entry
            oldest = oldest or entry
        return None if in_tls else in_handshake or oldest

    def _evict(self, entry: _Unfinished | None) -> None:
        if entry is None or entry not in self._unfinished:
            return
        self.stats.handshakes_evicted += 1
        self._forget(entry)
        if entry.task is not None:
            entry.task.cancel()

    def _forget(self, entry: _Unfinished) -> None:
        if entry not in self._unfinished:
            return
        del self._unfinished[entry]
        self._unfinished_by_source[entry.source] -= 1
        if self._unfinished_by_source[entry.source] <= 0:
            del self._unfinished_by_source[entry.source]
        if entry.handshaking:
            self._handshaking -= 1

    def _begin_tls(self, entry: _Unfinished) -> None:
        entry.handshaking = True
        self._handshaking += 1
        while self._handshaking > self._limits.max_handshaking:
            victim = self._oldest(None, in_tls=True)
            if victim is None or victim is entry:
                return
            self._evict(victim)

    async def _handshake(self, sock: socket.socket, entry: _Unfinished) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(entry.accepted_at + self._limits.handshake_timeout_s):
                await _client_hello(sock)
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
        await ws.prepare(request)
        self.stats.streams_accepted += 1
        await self._stream_acceptor(peer, ws)
        return ws


_PeerCheck = Callable[[asyncio.Transport | None], None]
_PEER_CHECK: ContextVar[_PeerCheck | None] = ContextVar("shoal_peer_check", default=None)


class PeerCheckingRequest(aiohttp.ClientRequest):
    """Checks the server's certificate (node id, revocation) before the request is written;
    refuses to write to a peer on the test drop list (:mod:`gossip.droplist`)."""

    async def send(self, conn: Connection) -> aiohttp.ClientResponse:
        if droplist.active() and _dropped_server(conn.transport):
            conn.close()
            raise aiohttp.ClientConnectionError("dropped (test partition)")
        check = _PEER_CHECK.get()
        if check is not None:
            check(conn.transport)
        return await super().send(conn)


def _dropped_server(transport: asyncio.Transport | None) -> bool:
    ssl_object: Any = transport.get_extra_info("ssl_object") if transport else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    try:
        return bool(der) and droplist.dropped(peer_identity(der).node_id)
    except IdentityError:
        return False


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
            request_class=PeerCheckingRequest,
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
