"""The asyncio adapter: one sans-I/O :class:`~gossip.peer.Peer` over the mutual-TLS transport.

The core decides everything; this module only moves bytes and time:

- one timer handle (no task, no polling) calls ``handle_timer`` when the core's timer is due,
  flushes what it wants sent, and is moved whenever an input changes when the core is next due;
- every message goes on its peer's long-lived stream (:mod:`gossip.streams`: one WebSocket per
  pair of members, bounded in number, queue and time), so a dead or slow peer costs its own
  messages, never a stall (the protocol already treats a lost message as a lost datagram);
- each message that comes in, on a stream or as a ``POST /v1/gossip`` (from a member that
  predates streams, or a tool), is decoded, handed to ``receive``, and what the core answers is
  flushed; a POST gets the first answer for its sender in its response;
- how late each timer fires (the event loop's lag) feeds Lifeguard's local health: an
  overloaded host slows its own probing instead of accusing healthy peers.

Each body is a small frame ``[sender address, encoded message]``: the core answers to the address
peers listen on. The sender's identity is the node id from its TLS certificate; where the core
already knows that node, its signed address wins over the one in the frame.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gossip import revocation
from gossip.addrbook import AddressBook
from gossip.certtrust import CertSigner, CertTrust
from gossip.client import GossipClient
from gossip.codec import DecodeError, frame, unframe
from gossip.config import GossipConfig
from gossip.events import (
    Event,
    MemberDead,
    MemberJoined,
    MemberLeft,
    MemberUpdated,
    RecordChanged,
)
from gossip.identity import NodeIdentity, Role
from gossip.incarnation import IncarnationFile
from gossip.membership import MemberInfo
from gossip.messages import MemberState, Message
from gossip.peer import Peer
from gossip.records import StoredRecord
from gossip.revocation import RevocationError, RevocationList
from gossip.server import GossipServer
from gossip.stats import MessageCosts, kind_of
from gossip.streamparts import StreamLimits
from gossip.streams import StreamPool
from gossip.tls import PeerIdentity
from gossip.transport import AppSetup, HandlerRejected, RevokedByPeer, TransportError

log = logging.getLogger(__name__)

CallHandler = Callable[[PeerIdentity, str, str, bytes], Awaitable[tuple[int, bytes]]]
"""Answers a call a peer made over a stream: (caller, path, content type, body) -> (status,
answer body)."""

MAX_IN_FLIGHT = 256
SEND_TIMEOUT_S = 3.0
SEED_RETRY_S = (0.1, 0.2, 0.4, 0.8)
"""A send to a seed that fails while this node knows nobody (a mesh starting at once: the seed
is not listening yet) goes again after these delays; later the core's own retries take over
(every 1.5-3 s). Without it a node that started a moment before its seeds stayed alone for
seconds after they were up."""
"""How long one send may take, waiting for the peer's connection included. The core keeps its
own clocks (ack timeouts, suspicion), so this only bounds what a send holds. One second cut off
requests on a busy machine that would have been answered, and each cut connection cost a new
TLS handshake: a 32-agent mesh starting on two cores spent its first seconds reconnecting."""
REVOCATIONS_KIND = "shoal/revocations"
"""The record kind carrying an operator-signed revocation list (see :mod:`gossip.revocation`)."""


class _WallClockTrust:
    """Certificates are judged against the wall clock; the core's ``now`` is monotonic."""

    def __init__(self, inner: CertTrust, wall_clock: Callable[[], float]) -> None:
        self._inner = inner
        self._wall_clock = wall_clock

    def admit(self, node_id: str, credential: bytes, now: float) -> bool:
        return self._inner.admit(node_id, credential, self._wall_clock())

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool:
        return self._inner.verify(node_id, data, signature)

    def is_revoked(self, node_id: str) -> bool:
        return self._inner.is_revoked(node_id)


START_HEALTH_SCORE = 3
"""A real member starts doubting itself (see ``GossipConfig.start_health_score``): probing every
2 s with 1 s to answer, back to every 0.5 s after three probes answered (~4.5 s). 32 members
started at once on two cores otherwise raised suspicions against each other while every
process was still importing, handshaking and exchanging its first views; a loop that still lags
after that raises the score again (``report_loop_lag``). Higher starts held detection back for
~17 s after a start."""

TCP_MEMBERSHIP_BUDGET_BYTES = 8192
TCP_RECORDS_BUDGET_BYTES = 32768
"""Piggyback budgets over HTTPS. The core's defaults fit a datagram; here a message is a request
over a kept-alive TLS connection, whose cost is per request far more than per byte, so one
request carries what a dozen datagrams would (a burst of records drains in seconds, not minutes)."""


class GossipNode:
    """A running gossip member: HTTPS server, client pool, timers and event fan-out."""

    def __init__(
        self,
        identity: NodeIdentity,
        trust: CertTrust,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        seeds: Sequence[str] = (),
        config: GossipConfig | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        app_setup: AppSetup | None = None,
        on_revocations: Callable[[RevocationList], None] | None = None,
        stream_limits: StreamLimits | None = None,
        may_revoke: Callable[[str], bool] = lambda signer: True,
        probe_rings: int | None = None,
        incarnation_path: Path | None = None,
    ) -> None:
        """``on_revocations``: called with the revocation list whenever a newer one is applied
        (from an operator's command, from gossip, or shown by a peer that refused us), for the
        caller to keep it and to see whether it names this node. ``may_revoke``: whether the
        operator who signed a list may revoke at all (the application's word: an admin of its
        team policy); a list it refuses is refused as a forged one is. ``incarnation_path``:
        where this node keeps the highest incarnation it used (:mod:`gossip.incarnation`), so
        each start begins above its earlier lives whatever the clock does (None: the clock)."""
        self.identity = identity
        self._on_revocations_changed = on_revocations
        self._may_revoke = may_revoke
        self._call_handler: CallHandler | None = None
        self._trust = trust
        self._signer = CertSigner(identity)
        self._host = host
        self._port = port
        self._advertise_host = advertise_host or host
        self._seeds = list(seeds)
        self._config = config
        self._probe_rings = probe_rings
        """Overrides the config's ``probe_rings`` (None: keep it)."""
        self._incarnations = None if incarnation_path is None else IncarnationFile(incarnation_path)
        self._rng = rng or random.Random()
        self._clock = clock
        self._wall_clock = wall_clock
        self._server = GossipServer(
            identity,
            identity.ca_certificate,
            self._on_body,
            host,
            port,
            trust=trust,
            app_setup=app_setup,
            stream_acceptor=self._accept_stream,
        )
        self._client = GossipClient(identity, identity.ca_certificate, trust=trust)
        """POSTs: to members that predate streams, and to hear a refusal's revocation list."""
        self._streams = StreamPool(
            identity,
            identity.ca_certificate,
            self._server.gate,
            self,
            trust=trust,
            limits=stream_limits or StreamLimits(),
            clock=clock,
            wall_clock=wall_clock,
        )
        self._book = AddressBook()
        self._seed_retries: dict[str, int] = {}
        self._peer: Peer | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._sends: set[asyncio.Task[None]] = set()
        self._subscribers: list[Callable[[Event], None]] = []
        self._stopped = False
        self._costs = MessageCosts()
        self.send_failures = 0
        self.sends_dropped = 0
        self.revocations_rejected = 0

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def address(self) -> str:
        host = self._advertise_host
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{self._server.port}"

    @property
    def started(self) -> bool:
        """The member runs (``peer`` and what reads it may be used)."""
        return self._peer is not None and not self._stopped

    @property
    def peer(self) -> Peer:
        if self._peer is None:
            raise RuntimeError("gossip node not started")
        return self._peer

    async def start(self) -> None:
        """Raises :class:`gossip.incarnation.IncarnationError` when the incarnation file cannot
        be read or written: no life starts at an incarnation it cannot keep."""
        keeper = self._incarnations
        boot = self._config.boot_incarnation if self._config else int(self._wall_clock())
        boot = boot if keeper is None else keeper.boot(boot)
        await self._server.start()
        base = self._config or GossipConfig(
            node_id=self.node_id,
            addr="",
            boot_incarnation=boot,
            membership_budget_bytes=TCP_MEMBERSHIP_BUDGET_BYTES,
            records_budget_bytes=TCP_RECORDS_BUDGET_BYTES,
            records_retransmit_min=0,
            records_spaced=True,
            start_health_score=START_HEALTH_SCORE,
        )
        config = replace(base, node_id=self.node_id, addr=self.address, boot_incarnation=boot)
        if self._probe_rings is not None:
            config = replace(config, probe_rings=self._probe_rings)
        trust = _WallClockTrust(self._trust, self._wall_clock)
        keep = None if keeper is None else keeper.keep
        self._peer = Peer(config, self._signer, trust, self._seeds, self._clock(), self._rng, keep)
        self._flush()
        self._arm()

    async def stop(self, *, leave: bool = True, leave_timeout_s: float = 1.0) -> None:
        """Leave gracefully (tell peers, briefly wait for the sends), then close everything."""
        if self._peer is not None and leave:
            self._peer.leave(self._clock())
            self._flush()
            if self._sends:
                await asyncio.wait(set(self._sends), timeout=leave_timeout_s)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        self._stopped = True
        await self._streams.close()  # writes what is queued (the leave), then closes
        await self._server.stop()
        await self._client.close()

    # -- what the agent uses ---------------------------------------------------------------------

    def client_session(self) -> aiohttp.ClientSession | None:
        """The gossip client's pooled session, for other short calls to peers (see
        :meth:`GossipClient.session`); None once stopped."""
        return None if self._stopped else self._client.session()

    async def call(
        self, addr: str, path: str, content_type: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        """Call ``path`` on the member at ``addr`` over the gossip stream between the two
        (:meth:`gossip.streams.StreamPool.call`): (status, answer body). Raises
        :class:`gossip.streamparts.CallFailed` (``legacy``: the peer has no streams, use HTTP)."""
        return await self._streams.call(addr, path, content_type, body, timeout_s)

    def serve_calls(self, handler: CallHandler) -> None:
        """Answer the calls peers make over streams with ``handler`` (else they get 404)."""
        self._call_handler = handler

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` with every membership and record event, in order."""
        self._subscribers.append(callback)

    def members(self) -> list[MemberInfo]:
        return self.peer.members()

    def records(self) -> list[StoredRecord]:
        return self.peer.records()

    def record(self, origin: str, kind: str) -> StoredRecord | None:
        return self.peer.record(origin, kind)

    def publish(self, kind: str, payload: bytes) -> None:
        self.peer.publish(kind, payload, self._clock())
        self._dispatch()
        self._arm()

    def retire(self, kinds: set[str]) -> int:
        """Retire every origin's record of ``kinds`` (:meth:`gossip.peer.Peer.retire`)."""
        return self.peer.retire(kinds)

    def revoke(self, revocations: RevocationList) -> bool:
        """Apply an operator-signed revocation list and gossip it; True if it was newer.

        Every member that receives it verifies the operator's signature itself and shuns the
        revoked nodes: their connections are refused, their signatures no longer verify, and
        probes to them fail until they are declared dead. Raises :class:`RevocationError`.
        """
        return self._apply_revocations(revocations)

    def _apply_revocations(self, revocations: RevocationList) -> bool:
        """Verify, merge, and when newer: gossip it as ours too (every member that holds the
        list spreads it, so it outlives any one publisher), and tell the caller. A list that
        would replace the one held is taken only from a signer the application lets revoke."""
        held = self._trust.revocations
        could_win = revocations.version >= held.version and revocations.digest() != held.digest()
        if could_win and not self._may_revoke(revocations.signer_id):
            raise RevocationError(f"revocation list signer {revocations.signer_id} may not revoke")
        changed = self._trust.apply_revocations(revocations, self._wall_clock())
        if changed:
            self._streams.close_revoked()
            if self._peer is not None:
                self.publish(REVOCATIONS_KIND, revocation.encode(self._trust.revocations))
            if self._on_revocations_changed is not None:
                self._on_revocations_changed(self._trust.revocations)
        return changed

    def publish_revocations(self) -> None:
        """Gossip the list this member holds (one loaded from disk at start)."""
        if self._trust.revocations.version > 0:
            self.publish(REVOCATIONS_KIND, revocation.encode(self._trust.revocations))

    @property
    def revocations(self) -> RevocationList:
        return self._trust.revocations

    def rtt_estimate_s(self, a: str, b: str) -> float | None:
        return self.peer.rtt_estimate(a, b)

    @property
    def open_streams(self) -> int:
        """Streams held now, both directions together (a gauge; ``stats`` holds counters)."""
        return self._streams.open_streams

    def stats(self) -> dict[str, Any]:
        """The core's counters, the listener's (``transport_``) and the streams' (``stream_``),
        and what they add up to: ``handshakes`` (TLS handshakes this member took part in, as
        dialer or listener), ``streams_opened``, ``streams_evicted`` (closed for the bound's
        sake), ``streams_open`` (a level), and per message kind received
        (ping, ack, indirect, nack, push_pull, gossip) ``messages_in_<kind>`` and ``cpu_us_<kind>``
        (handling it and sending what it caused)."""
        transport, streams = self._server.stats, self._streams.stats
        dialed_ok = streams.dialed - streams.dial_failed
        snapshot: dict[str, Any] = dict(self.peer.stats.as_dict())
        snapshot.update(
            handshakes=dialed_ok + transport.handshakes,
            streams_opened=dialed_ok + transport.streams_accepted,
            streams_evicted=streams.closed_lru,
            streams_open=self._streams.open_streams,
            **self._costs.snapshot(),
        )
        snapshot.update(
            {f"transport_{k}": v for k, v in self._server.stats.snapshot().items()},
            **{f"stream_{k}": v for k, v in self._streams.stats.snapshot().items()},
            send_failures=self.send_failures,
            sends_dropped=self.sends_dropped,
            revocations_rejected=self.revocations_rejected,
            records_held=self.peer.records_held,
            records_tombstones=self.peer.records_tombstones,
        )
        return snapshot

    # -- the adapter -----------------------------------------------------------------------------

    async def _on_body(self, node_id: str, role: Role, body: bytes) -> bytes | None:
        """A POST: the first answer for its sender goes back in the response."""
        src, message = self._unframe(node_id, body)
        return self._deliver(src, message, len(body), answering=True)

    def _unframe(self, node_id: str, body: bytes) -> tuple[str, Message]:
        peer = self.peer
        try:
            claimed_addr, message = unframe(body, peer.config.max_message_bytes)
        except DecodeError as exc:
            peer.stats.rejected_malformed += 1
            raise HandlerRejected(str(exc)) from None
        known = peer.member(node_id)
        if known is not None and known.addr:
            return known.addr, message
        if claimed_addr not in self._seeds:
            self._book.hint(node_id, claimed_addr)  # answer it where it says, on its stream
        return claimed_addr, message

    # -- the stream pool's delegate (gossip.streamparts.StreamDelegate) ----------------------------

    async def _accept_stream(self, peer: PeerIdentity, ws: web.WebSocketResponse) -> None:
        await self._streams.serve(peer, ws)

    async def stream_call(
        self, peer: PeerIdentity, path: str, content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        if self._call_handler is None or self._stopped:
            return 404, b'{"error": "no calls served here"}'
        return await self._call_handler(peer, path, content_type, body)

    def stream_frame(self, node_id: str, role: Role, body: bytes) -> None:
        """A message on a stream (either direction); answers go on streams too."""
        if self._peer is None or self._stopped:
            return
        src, message = self._unframe(node_id, body)
        self._deliver(src, message, len(body), answering=False)

    def node_at(self, addr: str) -> str | None:
        node = self._book.node_at(addr)
        if node is None or self._peer is None or not self._book.is_member(node):
            return node  # none, or a hint (see gossip.addrbook)
        info = self._peer.member(node)
        if info is None or info.addr != addr:  # reaped, or moved: the book lags behind
            self._book.forget(node)
            return None
        return node

    def post(self, addr: str, body: bytes) -> None:
        self._spawn_send(addr, body)

    def undelivered(self, addr: str, bodies: Sequence[bytes]) -> None:
        self.send_failures += len(bodies)
        retry = self._seed_retries.get(addr, 0)
        if addr in self._seeds and retry < len(SEED_RETRY_S) and self._alone():
            self._seed_retries[addr] = retry + 1
            delay_s = SEED_RETRY_S[retry] * (0.5 + self._rng.random())  # jittered: no herd
            loop = asyncio.get_running_loop()
            for body in bodies:
                loop.call_later(delay_s, self._resend, addr, body)

    def connection_lost(self, node_id: str | None, addr: str) -> None:
        """Probe the member at the other end next: a kill -9 closes its connections at once, so
        every member that held one looks at it within a probe interval instead of its turn."""
        if self._peer is None or self._stopped:
            return
        node = node_id or self.node_at(addr)
        if node is not None:
            self._peer.probe_soon(node, self._clock())

    def _learn_address(self, node: str, addr: str) -> None:
        self._seed_retries.clear()
        book = self._book
        book.learn(node, addr)
        if len(book) > 2 * self.peer.live_count() + 64:  # reaped members linger: start over
            self._book = book = AddressBook()
            for m in self.peer.members():
                book.learn(m.node, m.addr)

    def _resend(self, addr: str, body: bytes) -> None:
        if not self._stopped:
            self._streams.send(addr, body)

    def _deliver(self, src: str, message: Message, size: int, *, answering: bool) -> bytes | None:
        """Hand a message from ``src`` to the core and send what it has to send. ``answering``
        (a request): the first message back to ``src`` is returned, to go in the response.
        The CPU it took is counted by the message's kind."""
        cpu0 = time.process_time_ns()
        self.peer.count_bytes(inbound=size)
        self.peer.receive(src, message, self._clock())
        reply = self._flush(reply_to=src if answering else None)
        self._arm()
        self._costs.add(kind_of(message), time.process_time_ns() - cpu0)
        return reply

    def _flush(self, reply_to: str | None = None) -> bytes | None:
        """Send what the core has to send, each on its peer's stream. With ``reply_to`` (the
        sender of a POST being answered), the first message for it is returned to go back in
        the HTTP response (an ack to a ping, a push-pull answer). Events are dispatched first:
        the address book must know a member that just joined before it is answered."""
        self._dispatch()
        reply: bytes | None = None
        for addr, message in self.peer.messages_to_send():
            if reply is None and addr == reply_to:
                reply = self._encode(addr, message)
                continue
            body = self._encode(addr, message)
            if body is not None:
                self._streams.send(addr, body)
        return reply

    def _encode(self, addr: str, message: Message) -> bytes | None:
        """The framed body of ``message`` for ``addr``, counted as sent; None if it cannot be."""
        peer = self.peer
        try:
            body = frame(self.address, message, peer.config.max_message_bytes)
        except ValueError:
            log.exception("could not encode a gossip message for %s", addr)
            return None
        peer.count_bytes(outbound=len(body))
        return body

    def _on_revocations(self, event: RecordChanged) -> None:
        if event.origin == self.node_id:
            return
        self._learn_revocations(event.payload, f"gossiped by {event.origin}")

    def _learn_revocations(self, payload: bytes, source: str) -> None:
        try:
            self._apply_revocations(revocation.decode(payload))
        except RevocationError as exc:
            self.revocations_rejected += 1
            log.warning("refused a revocation list %s: %s", source, exc)

    def _spawn_send(self, addr: str, body: bytes, retry: int = 0) -> None:
        if self._stopped or len(self._sends) >= MAX_IN_FLIGHT:
            self.sends_dropped += 1
            return
        task = asyncio.create_task(self._send(addr, body, retry))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    def _alone(self) -> bool:
        me = self.node_id
        live = (MemberState.ALIVE, MemberState.SUSPECT)
        return not any(m.node != me and m.state in live for m in self.peer.members())

    async def _send(self, addr: str, body: bytes, retry: int = 0) -> None:
        try:
            answer = await self._client.send(addr, body, SEND_TIMEOUT_S)
        except RevokedByPeer as exc:
            self.send_failures += 1
            self._learn_revocations(exc.revocations, f"shown by {addr}")
            return
        except TransportError:
            self.send_failures += 1
            if addr in self._seeds and retry < len(SEED_RETRY_S) and self._alone():
                delay_s = SEED_RETRY_S[retry]
                asyncio.get_running_loop().call_later(
                    delay_s, self._spawn_send, addr, body, retry + 1
                )
            return
        if answer is None or self._stopped or self._peer is None:
            return
        peer = self._peer
        try:
            _, message = unframe(answer, peer.config.max_message_bytes)
        except DecodeError:
            peer.stats.rejected_malformed += 1
            return
        self._deliver(addr, message, len(answer), answering=False)  # from the member we posted to

    def _dispatch(self) -> None:
        for event in self.peer.events():
            if isinstance(event, MemberJoined | MemberUpdated):
                self._learn_address(event.node, event.addr)
            elif isinstance(event, MemberDead | MemberLeft):
                self._streams.forget_node(event.node)
            elif isinstance(event, RecordChanged) and event.kind == REVOCATIONS_KIND:
                self._on_revocations(event)
            for callback in self._subscribers:
                try:
                    callback(event)
                except Exception:
                    log.exception("gossip event subscriber failed")

    def _arm(self) -> None:
        """Schedule the core's next timer (moving the one scheduled, if the core moved it)."""
        if self._stopped or self._peer is None:
            return
        due = self._peer.get_timer()
        if due is None:
            due = self._clock() + 1.0
        if self._timer is not None:
            if due == self._timer_due:
                return
            self._timer.cancel()
        self._timer_due = due
        delay_s = max(0.0, due - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        peer = self.peer
        now = self._clock()
        peer.report_loop_lag(max(0.0, now - self._timer_due))  # how late the loop ran it
        due = peer.get_timer()
        if due is not None and now >= due:
            peer.handle_timer(now)
        self._flush()
        self._arm()
