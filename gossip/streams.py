"""Gossip streams: one long-lived, mutually authenticated WebSocket per pair of members.

**Framing.** A stream is a WebSocket (``GET /v1/gossip/stream``) on the same mutual-TLS listener
as the HTTP API; each binary message is one body exactly as ``POST /v1/gossip`` takes it
(``[sender address, encoded message]``), and either side sends on it. Nothing is sent when there
is nothing to say: no WebSocket heartbeat (the gossip probes and their acks are the heartbeat),
no compression (messages are small and mostly signatures and ids).

**Who talks on which stream.** The core addresses messages by the address a member listens on.
A stream this node dialed serves the address it dialed; a stream a peer dialed serves that
peer's address once the core holds that address in the peer's own signed Alive and no other
member claims it (:meth:`StreamDelegate.node_at`), so one stream carries both directions. When
both members dialed at once, the stream dialed by the smaller node id stays and the other side
retires its own. A message to an address without a usable stream dials one and waits in the
stream's queue until it is up.

**Bounds.** At most ``max_streams`` streams, both directions together, least recently used
closed first (never one with messages waiting); a peer has at most one stream into this node
(a second replaces the first). Each stream has its own bounded queue and one writer, and a write
that cannot drain within ``send_timeout_s`` closes that stream: a stalled peer costs its own
messages, never another's. A stream is never closed on a timer: it ends when its peer goes
away (closed, reset, declared dead or left, revoked), when the bound needs its place, or when a
write stalls; so nothing churns against the probe cycle.

**Cheap reconnects.** The TLS session of each dialed stream is kept (bounded) and offered when
that address is dialed again: a resumed TLS 1.3 handshake skips the certificate signatures and
their verification (see :class:`gossip.tls.ResumingContext`); both ends still check the peer's
certificate (node id, validity, revocation) as after a full handshake.

**Calls.** A stream also carries calls between the two members (the agents' forwarded commands
and job-protocol calls): :meth:`StreamPool.call` queues a request ``[0, id, path, content type,
body]`` (a five-element msgpack array, never mistaken for a gossip body, which has two) on the
stream that serves the address, and the answer ``[1, id, status, "", body]`` comes back on the
same stream; the serving side hands each request to :meth:`StreamDelegate.stream_call` with the
caller's authenticated identity. Requests and answers pass the same gate as gossip (revocation,
token bucket, size). A stream with a call in flight, either way, is neither the LRU's victim
nor closed as a duplicate until the call ends; a stream that ends fails its callers' calls
(:class:`CallFailed`: the outcome is unknown, as for an HTTP request that got no answer). So a
call costs two messages on a warm, already authenticated stream instead of a request on a
connection that may need its own TLS handshake.

**Old peers.** A peer that answers the upgrade 404 predates streams: it is sent POSTs (through
the delegate) for ``legacy_s``, so a mesh upgrades one member at a time. A peer that refuses the
upgrade as revoked shows its list on a POST, as before (:class:`gossip.transport.RevokedByPeer`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from cryptography import x509

from gossip.addresses import split_address
from gossip.admission import FrameGate
from gossip.certtrust import CertTrust
from gossip.droplist import dropped
from gossip.identity import NodeIdentity
from gossip.streamparts import (
    CALL_ANSWER,
    CALL_REQUEST,
    CallFailed,
    Stream,
    StreamDelegate,
    StreamLimits,
    StreamStats,
    WebSocket,
    answering_member,
    call_frame,
    is_call,
    transport_of,
)
from gossip.tls import PeerIdentity, client_context, resuming
from gossip.transport import (
    DEFAULT_MAX_BODY_BYTES,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    REVOCATIONS_CONTENT_TYPE,
    STREAM_CLOSE_TIMEOUT_S,
    STREAM_PATH,
    CloseStream,
)

log = logging.getLogger(__name__)


_DEFAULT_LIMITS = StreamLimits()


class StreamPool:
    """The streams of one member: routes each message to its peer's stream, opening, bounding,
    deduplicating and closing them (see the module docstring)."""

    def __init__(
        self,
        identity: NodeIdentity,
        ca: x509.Certificate,
        gate: FrameGate,
        delegate: StreamDelegate,
        *,
        trust: CertTrust | None = None,
        limits: StreamLimits = _DEFAULT_LIMITS,
        max_message_bytes: int = DEFAULT_MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._ssl = client_context(identity, ca)
        self._node_id = identity.node_id
        self._gate = gate
        self._delegate = delegate
        self._trust = trust
        self._limits = limits
        self._max_message_bytes = max_message_bytes
        self._clock = clock
        self._wall_clock = wall_clock
        self._out: dict[str, Stream] = {}
        """Streams this member dialed (or is dialing), by the address dialed."""
        self._out_by_node: dict[str, Stream] = {}
        self._in: dict[str, Stream] = {}
        """Streams peers dialed, by the peer's node id."""
        self._lru: OrderedDict[Stream, None] = OrderedDict()
        self._sessions: OrderedDict[str, ssl.SSLSession] = OrderedDict()
        self._legacy: dict[str, float] = {}
        self._http: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._next_call = 0
        self.stats = StreamStats()

    @property
    def open_streams(self) -> int:
        return len(self._lru)

    def forget_sessions(self) -> None:
        """Drop the TLS sessions kept for resumption (the next dials make full handshakes)."""
        self._sessions.clear()

    # -- sending ---------------------------------------------------------------------------------

    def send(self, addr: str, body: bytes) -> None:
        """Queue ``body`` for the member at ``addr`` (never waits; see :class:`StreamLimits`)."""
        if self._closed:
            self.stats.frames_dropped += 1
            return
        stream = self._route(addr)
        if stream is None:
            until = self._legacy.get(addr)
            if until is not None:
                if until > self._clock():
                    self.stats.posted += 1
                    self._delegate.post(addr, body)
                    return
                del self._legacy[addr]
            stream = self._dial(addr)
        self._push(stream, body)

    def _route(self, addr: str) -> Stream | None:
        stream = self._out.get(addr)
        if stream is None:
            node = self._delegate.node_at(addr)
            stream = self._in.get(node) if node is not None else None
        if stream is not None and stream.peer is not None and dropped(stream.peer.node_id):
            self._abort(stream)  # a test partition began (gossip.droplist)
            return None
        return stream

    def _push(self, stream: Stream, body: bytes) -> bool:
        limits = self._limits
        if (
            len(stream.queue) >= limits.max_queued_frames
            or stream.queued_bytes + len(body) > limits.max_queued_bytes
        ):
            self.stats.frames_dropped += 1
            return False
        stream.queue.append(body)
        stream.queued_bytes += len(body)
        self._touch(stream)
        if stream.ws is not None and stream.writer is None:
            stream.writer = self._spawn(self._write(stream, stream.ws))
        return True

    # -- calls -----------------------------------------------------------------------------------

    async def call(
        self, addr: str, path: str, content_type: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        """Call ``path`` on the member at ``addr`` over its stream: (status, answer body).
        Raises :class:`CallFailed` when no answer came within ``timeout_s``."""
        if self._closed:
            raise CallFailed("closed")
        stream = self._route(addr)
        if stream is None:
            until = self._legacy.get(addr)
            if until is not None and until > self._clock():
                raise CallFailed("the peer predates streams", legacy=True)
            stream = self._dial(addr)
        self._next_call += 1
        call_id = self._next_call
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        stream.calls[call_id] = future
        self.stats.calls_sent += 1
        try:
            if not self._push(stream, call_frame(CALL_REQUEST, call_id, path, content_type, body)):
                raise CallFailed(f"the stream to {addr} is full")
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            self.stats.calls_failed += 1
            raise CallFailed(f"no answer from {addr} within {timeout_s:.1f} s") from None
        except CallFailed:
            self.stats.calls_failed += 1
            raise
        finally:
            stream.calls.pop(call_id, None)
            self._idle(stream)

    def _fail_calls(self, stream: Stream, reason: str, *, legacy: bool = False) -> None:
        for future in stream.calls.values():
            if not future.done():
                future.set_exception(CallFailed(reason, legacy=legacy))

    def _on_call(self, stream: Stream, peer: PeerIdentity, body: bytes) -> None:
        """A call frame came: an answer to one of ours, or a request to serve."""
        try:
            kind, call_id, head, content_type, data = msgpack.unpackb(
                body, raw=False, max_bin_len=self._max_message_bytes, max_str_len=512
            )
            if not isinstance(call_id, int) or not isinstance(data, bytes):
                raise ValueError("bad call frame")
        except Exception:
            self.stats.calls_malformed += 1
            return
        if kind == CALL_ANSWER and isinstance(head, int):
            future = stream.calls.get(call_id)
            if future is not None and not future.done():
                future.set_result((head, data))
        elif kind == CALL_REQUEST and isinstance(head, str) and isinstance(content_type, str):
            stream.serving += 1
            self._spawn(self._serve_call(stream, peer, call_id, head, content_type, data))
        else:
            self.stats.calls_malformed += 1

    async def _serve_call(
        self,
        stream: Stream,
        peer: PeerIdentity,
        call_id: int,
        path: str,
        content_type: str,
        body: bytes,
    ) -> None:
        try:
            try:
                call = self._delegate.stream_call(peer, path, content_type, body)
                status, answer = await self._gate.charged(peer, call)
            except Exception:
                log.exception("stream call %s from %s failed", path, peer.node_id)
                status, answer = 500, b'{"error": "internal error"}'
            self.stats.calls_served += 1
            if stream.ws is not None and not stream.ws.closed:
                self._push(stream, call_frame(CALL_ANSWER, call_id, status, "", answer))
        finally:
            stream.serving -= 1
            self._idle(stream)

    def _idle(self, stream: Stream) -> None:
        """A retired stream whose last call ended closes now."""
        if stream.closing and not stream.busy and stream.ws is not None and not stream.ws.closed:
            self._spawn(self._close_ws(stream))

    async def _write(self, stream: Stream, ws: WebSocket) -> None:
        """Write the stream's queue; a write that cannot drain in time closes the stream."""
        loop = asyncio.get_running_loop()
        timeout_s = self._limits.send_timeout_s
        try:
            async with asyncio.timeout(None) as deadline:
                while stream.queue:
                    body = stream.queue.popleft()
                    stream.queued_bytes -= len(body)
                    deadline.reschedule(loop.time() + timeout_s)
                    await ws.send_bytes(body)
                    self.stats.frames_sent += 1
        except TimeoutError:
            self.stats.send_timeouts += 1
            self._abort(stream)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            self._abort(stream)  # the connection went away under the write
        finally:
            stream.writer = None
        if stream.closing and not stream.busy:
            await self._close_ws(stream)

    # -- dialing ---------------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=0)
            self._http = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._http

    def _dial(self, addr: str) -> Stream:
        stream = Stream(addr, outbound=True)
        self._out[addr] = stream
        self._add(stream)
        stream.task = self._spawn(self._connect(stream))
        return stream

    async def _connect(self, stream: Stream) -> None:
        addr = stream.addr
        host, port = split_address(addr)
        url_host = f"[{host}]" if ":" in host else host
        self.stats.dialed += 1
        try:
            with resuming(self._sessions.get(addr)):
                async with asyncio.timeout(self._limits.connect_timeout_s):
                    ws = await self._session().ws_connect(
                        f"https://{url_host}:{port}{STREAM_PATH}",
                        headers={PROTOCOL_HEADER: PROTOCOL_VERSION},
                        compress=0,
                        autoping=True,
                        heartbeat=None,
                        max_msg_size=self._max_message_bytes,
                        timeout=aiohttp.ClientWSTimeout(ws_close=STREAM_CLOSE_TIMEOUT_S),
                    )
        except aiohttp.WSServerHandshakeError as exc:
            self.stats.dial_failed += 1
            self._refused(stream, exc)
            return
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.stats.dial_failed += 1
            log.debug("no stream to %s: %r", addr, exc)
            lost = not stream.closing and not self._closed
            self._undelivered(stream)
            if lost:
                self._delegate.connection_lost(None, addr)
            return
        try:
            peer = answering_member(ws, self._trust, self._wall_clock())
            if peer is None or stream.closing:
                await ws.close()
                self._undelivered(stream)
                return
            ssl_object = ws.get_extra_info("ssl_object")
            if ssl_object is not None and ssl_object.session_reused:
                self.stats.dialed_resumed += 1
            stream.ws, stream.peer = ws, peer
            self._save_session(stream, ws)  # its ticket came before the upgrade's answer
            older = self._out_by_node.get(peer.node_id)
            self._out_by_node[peer.node_id] = stream
            if older is not None and older is not stream:
                self._retire(older, duplicate=True)
            self._dedupe(peer.node_id)
            if stream.queue and stream.writer is None:
                stream.writer = self._spawn(self._write(stream, ws))
            await self._read(stream, ws, peer)
        finally:
            self._gone(stream)
            await self._close_ws(stream)

    def _refused(self, stream: Stream, exc: aiohttp.WSServerHandshakeError) -> None:
        """The peer answered the upgrade with an error: it predates streams (404, 405), or it
        refuses this member (403: a revoked one is shown its list on a POST)."""
        self._forget(stream)
        legacy = exc.status in (404, 405)
        if legacy:
            self._fail_calls(stream, "the peer predates streams", legacy=True)
        bodies = self._take_queue(stream)
        headers: Any = exc.headers or {}
        content_type = str(headers.get("Content-Type", ""))
        if legacy:
            self._legacy[stream.addr] = self._clock() + self._limits.legacy_s
            for body in bodies:
                self.stats.posted += 1
                self._delegate.post(stream.addr, body)
        elif exc.status == 403 and content_type.startswith(REVOCATIONS_CONTENT_TYPE):
            if bodies:
                self._delegate.post(stream.addr, bodies[0])  # answered with the list
        else:
            log.debug("stream to %s refused: %s", stream.addr, exc.status)
            self._delegate.undelivered(stream.addr, bodies)

    def _undelivered(self, stream: Stream) -> None:
        self._forget(stream)
        bodies = self._take_queue(stream)
        if bodies:
            self._delegate.undelivered(stream.addr, bodies)

    # -- accepting -------------------------------------------------------------------------------

    async def serve(self, peer: PeerIdentity, ws: web.WebSocketResponse) -> None:
        """Run a stream ``peer`` opened (its certificate checked by the server) until it ends."""
        if self._closed:
            await ws.close()
            return
        stream = Stream("", outbound=False, peer=peer)
        stream.ws = ws
        ssl_object = ws.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.session_reused:
            self.stats.accepted_resumed += 1
        older = self._in.get(peer.node_id)
        self._in[peer.node_id] = stream
        if older is not None:
            self._retire(older, duplicate=True)
        self._add(stream)
        self._dedupe(peer.node_id)
        try:
            await self._read(stream, ws, peer)
        finally:
            self._gone(stream)
            await self._close_ws(stream)

    # -- reading ---------------------------------------------------------------------------------

    async def _read(self, stream: Stream, ws: WebSocket, peer: PeerIdentity) -> None:
        gate, deliver = self._gate, self._delegate.stream_frame
        while True:
            message = await ws.receive()
            if dropped(peer.node_id):
                self._abort(stream)  # a test partition began (gossip.droplist)
                return
            try:
                body = gate.frame(peer, message)
            except CloseStream:
                if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                    self.stats.closed_by_peer += 1
                return
            if body is None:
                continue
            self._touch(stream)
            if stream.outbound and not stream.session_saved:
                self._save_session(stream, ws)
            if is_call(body):
                self._on_call(stream, peer, body)
            else:
                gate.handled(peer, deliver, body)

    def _save_session(self, stream: Stream, ws: WebSocket) -> None:
        """Keep the dialed stream's TLS session for the next dial to that address (its ticket
        comes after the handshake, so it is looked for once the first message came)."""
        ssl_object: Any = ws.get_extra_info("ssl_object")
        session = ssl_object.session if ssl_object is not None else None
        if session is None or not session.has_ticket:
            return
        stream.session_saved = True
        self._sessions[stream.addr] = session
        self._sessions.move_to_end(stream.addr)
        while len(self._sessions) > self._limits.max_sessions:
            self._sessions.popitem(last=False)

    # -- the bound, duplicates and endings -------------------------------------------------------

    def _add(self, stream: Stream) -> None:
        self._lru[stream] = None
        if len(self._lru) <= self._limits.max_streams:
            return
        for old in self._lru:  # the least recently used first
            if len(self._lru) <= self._limits.max_streams:
                break
            if old is not stream and old.ws is not None and not old.busy:
                self.stats.closed_lru += 1
                self._retire(old)
                break

    def _touch(self, stream: Stream) -> None:
        if stream in self._lru:
            self._lru.move_to_end(stream)

    def _dedupe(self, node: str) -> None:
        """Both members dialed each other: the stream dialed by the smaller id stays; the
        larger retires its own once it can reach the peer on the other (its address known)."""
        out, inbound = self._out_by_node.get(node), self._in.get(node)
        if out is None or inbound is None or self._node_id < node:
            return
        if self._delegate.node_at(out.addr) == node:
            self._retire(out, duplicate=True)

    def _forget(self, stream: Stream) -> None:
        """Route nothing more to ``stream``."""
        if stream.outbound:
            if self._out.get(stream.addr) is stream:
                del self._out[stream.addr]
            if stream.peer is not None and self._out_by_node.get(stream.peer.node_id) is stream:
                del self._out_by_node[stream.peer.node_id]
        elif stream.peer is not None and self._in.get(stream.peer.node_id) is stream:
            del self._in[stream.peer.node_id]
        self._lru.pop(stream, None)

    def _retire(self, stream: Stream, *, duplicate: bool = False) -> None:
        """Route nothing more to ``stream`` and close it once its queue is written."""
        if stream.closing:
            return
        if duplicate:
            self.stats.closed_duplicate += 1
        stream.closing = True
        self._forget(stream)
        if stream.ws is None:
            if stream.task is not None:
                stream.task.cancel()  # still dialing
            self.stats.frames_dropped += len(self._take_queue(stream))
            self._fail_calls(stream, "the stream was closed while opening")
        elif not stream.busy:  # else its last write or call closes it (``_idle``)
            self._spawn(self._close_ws(stream))

    def _abort(self, stream: Stream) -> None:
        """Close at once (a stalled or broken connection): its queue is lost."""
        stream.closing = True
        self._forget(stream)
        self.stats.frames_dropped += len(self._take_queue(stream))
        ws = stream.ws
        transport = transport_of(ws) if ws is not None else None
        if transport is not None:
            transport.abort()

    async def _close_ws(self, stream: Stream) -> None:
        ws = stream.ws
        if ws is None or ws.closed:
            return
        try:
            async with asyncio.timeout(STREAM_CLOSE_TIMEOUT_S):
                await ws.close()
        except Exception:
            transport = transport_of(ws)
            if transport is not None:
                transport.abort()

    def _gone(self, stream: Stream) -> None:
        """The stream's connection ended (or never was): forget it and what it still held. Ended
        by the peer (closed, reset: not retired or aborted here), it is told to the delegate."""
        lost = stream.peer if not stream.closing and not self._closed else None
        stream.closing = True
        self._forget(stream)
        if stream.writer is not None:
            stream.writer.cancel()
        self.stats.frames_dropped += len(self._take_queue(stream))
        self._fail_calls(stream, "the stream ended")
        if lost is not None:
            self._delegate.connection_lost(lost.node_id, stream.addr)

    def _take_queue(self, stream: Stream) -> list[bytes]:
        """Empty the stream's queue: the gossip bodies it held (its calls fail)."""
        bodies = [body for body in stream.queue if not is_call(body)]
        stream.queue.clear()
        stream.queued_bytes = 0
        self._fail_calls(stream, f"no stream to {stream.addr or 'the peer'}")
        return bodies

    def forget_node(self, node: str) -> None:
        """Close the streams to and from ``node`` (declared dead, left, or revoked)."""
        for stream in (self._in.get(node), self._out_by_node.get(node)):
            if stream is not None:
                self.stats.closed_gone += 1
                self._retire(stream)

    def close_revoked(self) -> None:
        """Close every stream whose peer the trust store now revokes."""
        if self._trust is None:
            return
        for stream in list(self._lru):
            if stream.peer is not None and self._trust.is_revoked(stream.peer.node_id):
                self.stats.closed_gone += 1
                self._retire(stream)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Close every stream (their queues are dropped) and the dialing session."""
        self._closed = True
        for stream in list(self._lru):
            self._retire(stream)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=STREAM_CLOSE_TIMEOUT_S)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None
