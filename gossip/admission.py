"""Who may connect to the gossip server, and what each peer may spend once it has.

The bounds on connections before and after they prove who they are (:class:`ConnectionLimits`),
the wait for a whole ClientHello before TLS starts (:func:`client_hello`), and the checks every
stream message passes with its peer's budgets (:class:`FrameGate`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import aiohttp

from gossip.budgets import Charged, CpuBuckets, TokenBuckets
from gossip.certtrust import Admission, CertTrust
from gossip.identity import Role
from gossip.revocation import RevocationList
from gossip.tls import PeerIdentity
from gossip.transport import CloseStream, HandlerRejected, TransportStats

T = TypeVar("T")

log = logging.getLogger(__name__)


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
class Unfinished:
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


_TLS_HANDSHAKE_RECORD = 0x16
_TLS_RECORD_HEADER_BYTES = 5
FIRST_RECORD_POLL_S = (0.005, 0.5)
"""While a connection's first TLS record is incomplete it is peeked at again after a delay that
doubles from the first figure to the second: a real ClientHello comes whole or within a round
trip, and a peer that sent a byte and stopped costs two wakeups a second."""


async def client_hello(sock: socket.socket) -> None:
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
    while (first := first_record(sock)) == "partial":
        await asyncio.sleep(delay_s)  # readable all along: only time tells that more came
        delay_s = min(2 * delay_s, longest_s)
    if first == "gone":
        raise ConnectionAbortedError("closed, or not TLS, before its ClientHello")


def first_record(sock: socket.socket) -> Literal["hello", "partial", "gone"]:
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


async def accept(listener: socket.socket) -> tuple[socket.socket, Any]:
    """The next connection on the non-blocking ``listener`` (raises ``OSError`` as
    ``accept(2)`` does).

    ``loop.sock_accept`` on CPython 3.11 logs an ERROR with a traceback, and leaks the
    connection, when it is cancelled in the loop iteration that found the listener readable:
    its callback accepts, then sets the result of the cancelled future. An agent stopping while
    its peers still dial it did that. Here the connection is accepted only by the task itself,
    once the listener is readable and the wait was not cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            sock, address = listener.accept()
        except (BlockingIOError, InterruptedError):
            readable = loop.create_future()
            loop.add_reader(listener.fileno(), _settle, readable)
            try:
                await readable
            finally:
                loop.remove_reader(listener.fileno())
            continue
        sock.setblocking(False)
        return sock, address


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
