"""The sans-I/O gossip core: SWIM + Lifeguard membership and signed record dissemination.

Shaped like aioquic's ``QuicConnection``: the caller feeds it decoded messages and timer ticks with
the current time, and collects what to send and what happened::

    peer = Peer(config, signer, trust, seeds=["10.0.0.2:7946"], now=t, rng=random.Random())
    peer.receive(src_addr, message, now)       # a decoded message arrived
    peer.handle_timer(now)                     # when now >= peer.get_timer()
    for addr, message in peer.messages_to_send(): ...
    for event in peer.events(): ...

Nothing here reads a clock, sleeps, opens a socket or touches asyncio; randomness comes from the
injected ``random.Random``; cryptography goes through the :mod:`gossip.trust` seams.
"""

from __future__ import annotations

import contextlib
import random
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

from gossip.awareness import Awareness
from gossip.broadcast import BroadcastQueue
from gossip.codec import encoded_size, signing_bytes
from gossip.config import GossipConfig
from gossip.events import (
    Event,
    MemberDead,
    MemberJoined,
    MemberLeft,
    MemberSuspect,
    MemberUpdated,
    RecordChanged,
)
from gossip.membership import Member, MemberInfo, Outcome, decide
from gossip.messages import (
    Ack,
    Alive,
    Compound,
    Dead,
    IndirectPingReq,
    MemberDigest,
    MemberState,
    Message,
    Nack,
    Ping,
    PushPull,
    Record,
    RecordDigest,
    Suspect,
    Update,
)
from gossip.records import Offer, RecordStore, StoredRecord
from gossip.relay import RelayNews, relay_round
from gossip.stats import GossipStats
from gossip.suspicion import Suspicion
from gossip.trust import Signer, Trust
from gossip.vivaldi import Coordinate, VivaldiClient, VivaldiConfig

_ALIVE, _SUSPECT, _DEAD = 0, 1, 2  # broadcast priority classes
# Enum members read once: ``MemberState.ALIVE`` runs ``EnumType.__getattr__`` at every use.
_A, _S, _D, _L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
_IGNORE, _REFUTE, _CONFIRM = Outcome.IGNORE, Outcome.REFUTE, Outcome.CONFIRM
_DEAD_IF_CONFIRMED, _LEAVES = Outcome.DEAD_IF_CONFIRMED, Outcome.LEFT
_RANK = {_A: 0, _S: 1, _D: 2, _L: 2}
_LIVE = (_A, _S)
_REAP_EVERY_S = 5.0
_node_of = attrgetter("node")


def next_round_at(phase: float, interval_s: float, now: float) -> float:
    """The first gossip round after ``now`` on a node's grid ``phase + k * interval_s``."""
    return phase + (int((now - phase) // interval_s) + 1) * interval_s


def after_round(scheduled: float | None, phase: float, interval_s: float, now: float) -> float:
    """The round after the one ``scheduled`` at (or after ``now``, if that one is past)."""
    t = (scheduled or now) + interval_s
    return t if t > now else next_round_at(phase, interval_s, now)


def signed_alive(signer: Signer, incarnation: int, addr: str) -> Alive:
    """The signer's own Alive at ``incarnation``, reachable at ``addr``."""
    cred = signer.credential
    u = Alive(signer.node_id, incarnation, addr, cred, b"")
    return Alive(u.node, incarnation, addr, cred, signer.sign(signing_bytes(u)))


def signed_record(
    signer: Signer, kind: str, incarnation: int, counter: int, payload: bytes
) -> Record:
    """The signer's record of ``kind`` at version ``(incarnation, counter)``."""
    u = Record(signer.node_id, kind, incarnation, counter, payload, b"")
    return Record(u.origin, kind, incarnation, counter, payload, signer.sign(signing_bytes(u)))


_Accusation = TypeVar("_Accusation", Suspect, Dead)


def signed_accusation(
    signer: Signer, kind: type[_Accusation], node: str, incarnation: int
) -> _Accusation:
    """A Suspect or Dead about ``node`` at ``incarnation``, signed by ``signer`` as accuser."""
    u = kind(node, incarnation, signer.node_id, b"")
    return kind(node, incarnation, signer.node_id, signer.sign(signing_bytes(u)))


@dataclass(slots=True)
class _Probe:
    target: str
    seq: int
    sent_at: float
    timeout_at: float
    end_at: float
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0
    fallback_seq: int = 0
    """Seq of the reliable fallback ping (0: none sent)."""
    fallback_acked: bool = False
    fallback_end_at: float = 0.0
    datagrams_failed: bool = False
    """The interval ended with no ack by datagram; only the fallback can still answer."""


@dataclass(slots=True)
class _Relay:
    origin_addr: str
    origin_seq: int
    nack: bool
    deadline: float
    """Send the nack now if the target stayed silent (Lifeguard)."""
    expires: float
    """A late ack is still relayed until then: a stalled target answers late, not never."""
    nacked: bool = False


class Peer:
    """One node's gossip state machine. See the module docstring for the calling convention."""

    # Slots, not an instance dict (which past 30 attributes is a full dict, its entries spread
    # over some twenty cache lines): a simulator runs a thousand cores and touches a few fields of
    # a different one at every message. The fields read at every message and timer come first.
    __slots__ = (  # noqa: RUF023 (the order is the layout)
        "_out",
        "_out_reliable",
        "_events",
        "_probe",
        "_next_probe",
        "_left",
        "_next_gossip",
        "_relays",
        "_suspicions",
        "_next_reap",
        "_next_push_pull",
        "_next_reconnect",
        "stats",
        "config",
        "node_id",
        "_members",
        "_live",
        "_limit_for",
        "_rlimit",
        "_limit",
        "_pending",
        "_rpending",
        "_queue",
        "_rqueue",
        "_self",
        "_incarnation",
        "_awareness",
        "_vivaldi",
        "_seq",
        "_rng",
        "_others",
        "_records",
        "_trust",
        "_signer",
        "_seeds",
        "_record_counter",
        "_reconnects",
        "_other_pos",
        "_digest",
        "_by_node",
        "_rows",
        "_dirty",
        "_down",
        "_left_down",
        "_probe_order",
        "_probe_idx",
        "_bulk",
        "_gossip_phase",
        "_catch_up_until",
        "_quiet_exchanges",
        "_news",
        "_ring",
    )

    def __init__(
        self,
        config: GossipConfig,
        signer: Signer,
        trust: Trust,
        seeds: Sequence[str],
        now: float,
        rng: random.Random,
    ) -> None:
        if signer.node_id != config.node_id:
            raise ValueError("config.node_id differs from the signer's node id")
        self.config = config
        self.node_id = config.node_id
        self.stats = GossipStats()
        self._signer = signer
        self._trust = trust
        self._rng = rng
        self._seeds = list(seeds)
        self._incarnation = config.boot_incarnation
        self._left = False
        self._seq = 0
        self._record_counter = 0
        self._out: list[tuple[str, Message]] = []
        self._out_reliable: list[tuple[str, Message]] = []
        self._events: list[Event] = []
        self._members: dict[str, Member] = {}
        self._others: list[Member] = []  # every other member we hold, for random picks
        self._other_pos: dict[str, int] = {}
        self._digest: tuple[MemberDigest, ...] | None = None
        self._by_node: list[Member] | None = None  # members sorted by node, for the digest
        self._rows: list[MemberDigest] = []  # their digest lines, in the same order
        self._dirty: list[Member] = []  # members whose line may have changed since
        self._down: dict[str, None] = {}  # dead or left (tombstones); a dict for stable order
        self._left_down = 0  # how many of them left
        self._live = 1  # alive + suspect, ourselves included
        self._probe_order: list[str] = []
        self._probe_idx = 0
        self._bulk = False  # preloading: members go to the probe order unshuffled, then one shuffle
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._reconnects: dict[int, tuple[str, float]] = {}
        self._suspicions: dict[str, Suspicion] = {}
        self._queue = BroadcastQueue(3)
        self._limit_for, self._limit = 0, 0  # retransmit limit, cached per live count
        self._rlimit = 0  # the records' retransmit limit, for the same count
        self._rqueue = BroadcastQueue(1)
        self._pending, self._rpending = self._queue.pending, self._rqueue.pending  # (emptiness)
        self._news = RelayNews()  # what the next round passes to our ring successors
        self._ring: list[str] | None = None  # every member's id, sorted (None: to be sorted)
        self._records = RecordStore()
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._awareness.apply_delta(config.start_health_score)
        self._vivaldi = VivaldiClient(VivaldiConfig(), rng)
        jitter = rng.random()
        self._next_probe = now + jitter * config.probe_interval_s
        self._next_gossip: float | None = None
        self._gossip_phase = now + jitter * config.gossip_interval_s
        self._next_push_pull = now + (1.0 + rng.random()) * config.catch_up_push_pull_s
        self._catch_up_until = now + config.catch_up_window_s
        self._quiet_exchanges = 0  # push-pulls in a row that found both views the same
        self._next_reconnect = now + rng.random() * config.reconnect_interval_s
        self._next_reap = now + _REAP_EVERY_S
        trust.admit(self.node_id, signer.credential, now)
        alive = self._signed_alive()
        self._self = Member(self.node_id, config.addr, self._incarnation, _A, now, alive)
        self._members[self.node_id] = self._self
        for seed in self._seeds:
            if seed != config.addr:
                self._send(seed, self._push_pull(0, (alive,)))
        if self._seeds:
            # A cold join also gossips its own Alive (memberlist does): once the seed's answer
            # names the members, they hear of the newcomer from it as well as from the seed.
            self._broadcast(self.node_id, alive, _ALIVE, now)

    # -- public API ------------------------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self._incarnation

    @property
    def self_alive(self) -> Alive:
        """Our current signed Alive (what a warm-start snapshot of us holds)."""
        return self._self.alive

    @property
    def health_score(self) -> int:
        """Lifeguard local health: 0 is healthy; timeouts scale by ``score + 1``."""
        return self._awareness.score

    @property
    def coordinate(self) -> Coordinate:
        return self._vivaldi.coord

    def messages_to_send(self) -> list[tuple[str, Message]]:
        """Everything to send, for a transport where every send is reliable (HTTPS over TCP)."""
        out, self._out = self._out, []
        if self._out_reliable:
            out.extend(self._out_reliable)
            self._out_reliable = []
        return out

    def take_outgoing(self) -> tuple[list[tuple[str, Message]], list[tuple[str, Message]]]:
        """What to send as (datagrams, reliable): for a transport with both kinds of channel
        (the simulator); the reliable ones are the fallback probes, last looks and their acks."""
        out, rel = self._out, self._out_reliable
        if out:
            self._out = []
        if rel:
            self._out_reliable = []
        return out, rel

    def events(self) -> list[Event]:
        ev, self._events = self._events, []
        return ev

    def take_output(
        self,
    ) -> tuple[list[tuple[str, Message]], list[tuple[str, Message]], list[Event]] | None:
        """What :meth:`take_outgoing` and :meth:`events` return, in one call, or None when both
        are empty: for a driver that asks after every input (the simulator)."""
        out, rel, ev = self._out, self._out_reliable, self._events
        if not (out or rel or ev):
            return None
        if out:
            self._out = []
        if rel:
            self._out_reliable = []
        if ev:
            self._events = []
        return out, rel, ev

    def members(self) -> list[MemberInfo]:
        return [
            MemberInfo(m.node, m.addr, m.incarnation, m.state, m.state_since)
            for m in self._members.values()
        ]

    def member(self, node: str) -> MemberInfo | None:
        m = self._members.get(node)
        if m is None:
            return None
        return MemberInfo(m.node, m.addr, m.incarnation, m.state, m.state_since)

    def live_count(self) -> int:
        """Members alive or suspect, ourselves included (the N of every formula)."""
        return self._live

    def records(self) -> list[StoredRecord]:
        return list(self._records)

    def record(self, origin: str, kind: str) -> StoredRecord | None:
        return self._records.get(origin, kind)

    @property
    def records_held(self) -> int:
        """Records in the store now, every origin's (a level)."""
        return len(self._records)

    @property
    def records_tombstones(self) -> int:
        """Versions of retired records kept, to refuse their copies (a level)."""
        return self._records.retired

    def retire(self, kinds: set[str]) -> int:
        """Retire every origin's record of ``kinds`` (see :mod:`gossip.records`): they leave
        this member's store and digests for good; how many records left."""
        gone = self._records.retire(kinds)
        self.stats.records_retired += gone
        return gone

    def rtt_estimate(self, a: str, b: str) -> float | None:
        """Estimated RTT in seconds between nodes ``a`` and ``b`` from Vivaldi coordinates."""
        viv = self._vivaldi
        ca = viv.coord if a == self.node_id else viv.coordinate_of(a)
        cb = viv.coord if b == self.node_id else viv.coordinate_of(b)
        if ca is None or cb is None:
            return None
        return ca.distance_s(cb)

    def probe_soon(self, node: str, now: float) -> bool:
        """A hint that ``node`` may be gone (the transport saw its connection end, or could not
        open one): probe it next, out of turn. The hint decides nothing, the probe does; only the
        order changes, not the pace, and a member is moved at most once a probe round (one
        interval per live member), so however many hints come this member probes no more often,
        and no member more than twice a round. False if nothing changed (not an alive member, or
        hinted this round already)."""
        m = self._members.get(node)
        if m is None or m is self._self or m.state is not _A:
            return False  # a suspect is being judged already
        return self._probe_next(m, now)

    def _probe_next(self, m: Member, now: float) -> bool:
        p = self._probe
        if p is not None and p.target == m.node:
            return False  # being probed now
        if now - m.hinted_at < self._live * self._awareness.scale(self.config.probe_interval_s):
            return False
        m.hinted_at = now
        order, i = self._probe_order, self._probe_idx
        with contextlib.suppress(ValueError):  # else probed this round, or joined since it began
            del order[order.index(m.node, i)]
        order.insert(i, m.node)
        self.stats.probes_hinted += 1
        return True

    def report_loop_lag(self, lag_s: float) -> None:
        """Feed the event loop's observed lag into Lifeguard's local health."""
        if lag_s >= self.config.loop_lag_threshold_s:
            self._awareness.apply_delta(1)

    def publish(self, kind: str, payload: bytes, now: float) -> Record:
        """Sign and disseminate a new version of our record of ``kind``."""
        if len(payload) > self.config.max_record_payload_bytes:
            raise ValueError(f"record payload of {len(payload)} bytes exceeds the limit")
        self._record_counter += 1
        rec = signed_record(self._signer, kind, self._incarnation, self._record_counter, payload)
        self._records.put(rec, now)
        size = encoded_size(rec)
        self._rqueue.push((rec.origin, rec.kind), rec, size, 0)
        self._relay_later((rec.origin, rec.kind), rec, size)
        self._emit(RecordChanged(rec.origin, kind, rec.incarnation, rec.counter, payload, now))
        self._wake_gossip(now)
        return rec

    def leave(self, now: float) -> None:
        """Announce a graceful leave; keep calling handle_timer a few gossip rounds to spread it."""
        if self._left:
            return
        self._left = True
        dead = self._sign_dead(self.node_id, self._incarnation)
        self._self.state = _L
        self._dirty.append(self._self)
        self._self.accusation = dead
        self._self.state_since = now
        self._broadcast(self.node_id, dead, _ALIVE, now)
        for m in self._random_members(self.config.gossip_nodes, self._gossipable(now)):
            self._send(m.addr, Compound((dead,)))

    def preload(self, updates: Iterable[Alive], now: float) -> None:
        """Admit a trusted snapshot of members (a warm start) without re-broadcasting it."""
        self._bulk = True
        try:
            for u in updates:
                if u.node != self.node_id:
                    self._on_alive(u, now, broadcast=False)
        finally:
            self._bulk = False
        rest = self._probe_order[self._probe_idx :]  # one shuffle, not a random insert per member
        self._rng.shuffle(rest)
        self._probe_order[self._probe_idx :] = rest
        n = self._live
        self._next_push_pull = now + self._rng.random() * self.config.push_pull_scaled_s(n)
        self._catch_up_until = now  # a full view already: nothing to catch up on

    def count_bytes(self, inbound: int = 0, outbound: int = 0) -> None:
        """The encoder (transport or simulator) reports wire bytes here."""
        self.stats.bytes_in += inbound
        self.stats.bytes_out += outbound

    def get_timer(self) -> float | None:
        t = self._next_probe if not self._left else self._next_reap
        p = self._probe
        if p is not None:
            x = p.end_at if p.indirect_sent else p.timeout_at
            if x < t:
                t = x
        g = self._next_gossip
        if g is not None and g < t:
            t = g
        if self._left:
            # Otherwise housekeeping rides on the probe tick (at most a scaled interval late),
            # which saves a wake-up per task per period on every node.
            if self._next_push_pull < t:
                t = self._next_push_pull
            if self._next_reconnect < t:
                t = self._next_reconnect
        if self._relays:
            for r in self._relays.values():
                x = r.expires if r.nacked else r.deadline
                if x < t:
                    t = x
        if self._suspicions:
            for s in self._suspicions.values():
                x = s.due
                if x < t:
                    t = x
        return t

    def handle_timer(self, now: float) -> None:
        cfg = self.config
        p = self._probe
        if p is not None:
            if not p.indirect_sent and now >= p.timeout_at:
                self._send_indirect(p, now)
            if now >= p.end_at:
                self._probe_end(p, now)
        if not self._left and now >= self._next_probe:
            if self._probe is None:
                self._start_probe(now)
            else:  # still waiting on the reliable fallback: probe again once it concludes
                self._next_probe = self._probe.end_at
        if self._relays:
            for seq, r in list(self._relays.items()):
                if r.expires <= now:
                    del self._relays[seq]
                elif not r.nacked and r.deadline <= now:
                    r.nacked = True
                    if r.nack:
                        self._send(r.origin_addr, Nack(r.origin_seq, self.node_id))
        if self._suspicions:
            for node in [n for n, s in self._suspicions.items() if s.due <= now]:
                self._suspicion_expired(node, now)
        if self._next_gossip is not None and now >= self._next_gossip:
            self._gossip(now)
        if now >= self._next_push_pull:
            # catching up: the join found nobody up yet, or the mesh may still be starting
            alone = self._live <= 1 and bool(self._seeds)
            catching_up = alone or now < self._catch_up_until
            every = cfg.catch_up_push_pull_s if catching_up else self._push_pull_every_s()
            self._next_push_pull = now + every
            self._start_push_pull()
        if now >= self._next_reconnect:
            self._next_reconnect = now + cfg.reconnect_interval_s
            self._reconnect(now)
        if now >= self._next_reap:
            self._next_reap = now + _REAP_EVERY_S
            self._reap(now)

    def receive(self, src_addr: str, message: Message, now: float, reliable: bool = False) -> None:
        """Handle one decoded message. ``src_addr`` must be the sender's advertised gossip address
        (acks and push-pull replies go there), not an ephemeral client port. ``reliable``: it
        came over the reliable channel, so a ping in it is answered the same way."""
        self.stats.messages_in += 1
        if isinstance(message, Compound):
            dispatch = self._DISPATCH
            for part in message.parts:
                handler = dispatch.get(type(part))
                if handler is not None:
                    handler(self, src_addr, part, now, reliable)
                elif isinstance(part, Compound):
                    self.stats.rejected_malformed += 1
                else:
                    self._receive_one(src_addr, part, now, reliable)
        else:
            handler = self._DISPATCH.get(type(message))
            if handler is not None:
                handler(self, src_addr, message, now, reliable)
            else:
                self._receive_one(src_addr, message, now, reliable)

    # -- dispatch --------------------------------------------------------------------------------

    def _receive_one(self, src: str, m: Message, now: float, reliable: bool = False) -> None:
        """A message of a type the dispatch table lacks: a subclass of one it has, or junk."""
        for t in type(m).__mro__:
            handler = self._DISPATCH.get(t)
            if handler is not None:
                handler(self, src, m, now, reliable)
                return

    def _recv_alive(self, src: str, m: Alive, now: float, reliable: bool) -> None:
        self._on_alive(m, now)

    def _recv_record(self, src: str, m: Record, now: float, reliable: bool) -> None:
        held = self._records.get(m.origin, m.kind)
        if held is not None and held.record is m:  # the very object we hold: a duplicate
            self.stats.duplicates += 1
            return
        self._on_record(m, now)

    def _recv_accusation(self, src: str, m: Suspect | Dead, now: float, reliable: bool) -> None:
        held = self._members.get(m.node)
        if held is not None and held.accusation is m and held is not self._self:
            # the very accusation behind the state we hold: the table ignores it (a dead or
            # left member) or finds nothing to count (its accuser counted when it came)
            self.stats.duplicates += 1
            return
        if m.node == self.node_id and m.incarnation < self._incarnation and not self._left:
            # a stale accusation: the sender missed our refutation; tell it directly
            self._send(src, Compound((self._self.alive,)))
        elif isinstance(m, Suspect):
            self._on_suspect(m, now)
        else:
            self._on_dead(m, now)

    def _recv_nack(self, src: str, m: Nack, now: float, reliable: bool) -> None:
        if self._probe is not None and m.seq == self._probe.seq:
            self._probe.nacks += 1
            self.stats.nacks_received += 1

    def _recv_push_pull(self, src: str, m: PushPull, now: float, reliable: bool) -> None:
        self._on_push_pull(src, m, now)

    # -- probing ---------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _start_probe(self, now: float) -> None:
        cfg = self.config
        interval = self._awareness.scale(cfg.probe_interval_s)
        self._next_probe = now + interval
        target = self._next_probe_target()
        if target is None:
            return
        seq = self._next_seq()
        timeout = self._awareness.scale(cfg.probe_timeout_s)
        self._probe = _Probe(target.node, seq, now, now + timeout, now + interval)
        self.stats.probes_sent += 1
        first: list[Message] = [Ping(seq, self.node_id, target.node)]
        if target.state == _S and target.accusation is not None:
            first.append(target.accusation)  # buddy system: tell the suspect first
        self._send_piggybacked(target.addr, first)

    def _next_probe_target(self) -> Member | None:
        order = self._probe_order
        for _ in range(2):
            while self._probe_idx < len(order):
                node = order[self._probe_idx]
                self._probe_idx += 1
                m = self._members.get(node)
                if m is not None and m.state in _LIVE:
                    return m
            order[:] = [m.node for m in self._others if m.state in _LIVE]
            self._rng.shuffle(order)
            self._probe_idx = 0
            if not order:
                return None
        return None

    def _send_indirect(self, p: _Probe, now: float) -> None:
        p.indirect_sent = True
        target = self._members.get(p.target)
        if target is None:
            return
        wait = self.config.reliable_probe_wait_s
        if wait > 0.0:  # memberlist's TCP fallback ping, alongside the indirect probes
            p.fallback_seq = self._next_seq()
            p.fallback_end_at = now + wait
            self._out_reliable.append((target.addr, Ping(p.fallback_seq, self.node_id, p.target)))
            self.stats.messages_out += 1
            self.stats.reliable_probes += 1
        relays = self._random_members(
            self.config.indirect_checks,
            lambda m: m.state == _A and m.node != p.target,
        )
        for r in relays:
            self._send(r.addr, IndirectPingReq(p.seq, self.node_id, p.target, target.addr, True))
        p.expected_nacks = len(relays)
        self.stats.indirect_probes += len(relays)

    def _probe_end(self, p: _Probe, now: float) -> None:
        """The interval (or the fallback's wait) ended without an ack by datagram."""
        if not p.datagrams_failed:
            p.datagrams_failed = True
            self.stats.probes_failed += 1
        if p.fallback_acked:
            self._probe_rescued(p)
        elif p.fallback_seq and now < p.fallback_end_at:
            p.end_at = p.fallback_end_at
        else:
            self._probe_failed(p, now)

    def _probe_rescued(self, p: _Probe) -> None:
        # Only the reliable channel got through: the target lives and our datagram path is
        # lossy. Neither a suspicion nor a health strike (memberlist logs a warning here).
        self._probe = None
        self.stats.probes_rescued += 1

    def _probe_failed(self, p: _Probe, now: float) -> None:
        self._probe = None
        if p.expected_nacks > 0:
            self._awareness.apply_delta(max(0, p.expected_nacks - p.nacks))
        else:
            self._awareness.apply_delta(1)
        m = self._members.get(p.target)
        if m is None or m.state not in _LIVE:
            return
        self._on_suspect(self._sign_suspect(m.node, m.incarnation), now, ours=True)

    def _on_ping(self, src: str, m: Ping, now: float, reliable: bool = False) -> None:
        if m.target != self.node_id:
            return
        self._send_piggybacked(src, [Ack(m.seq, self.node_id, self._vivaldi.coord)], reliable)

    def _on_ack(self, src: str, m: Ack, now: float, reliable: bool = False) -> None:
        p = self._probe
        if p is not None and m.seq == p.fallback_seq:
            if p.datagrams_failed:
                self._probe_rescued(p)
            else:  # keep listening for the datagram path until the interval ends
                p.fallback_acked = True
            return
        if p is not None and m.seq == p.seq:
            self._probe = None
            self._awareness.apply_delta(-1)
            if m.source == p.target and m.coordinate is not None:
                self._vivaldi.update(m.source, m.coordinate, now - p.sent_at)
            return
        if self._suspicions:
            s = self._suspicions.get(m.source)
            if s is not None and s.final_seq == m.seq:
                s.final_acked = True
                return
        relay = self._relays.pop(m.seq, None)
        if relay is not None:
            self._send(relay.origin_addr, Ack(relay.origin_seq, self.node_id, None))
            return
        rc = self._reconnects.pop(m.seq, None)
        if rc is not None:
            target = self._members.get(rc[0])
            if target is not None:
                self.stats.push_pulls += 1
                self._send(target.addr, self._push_pull(0, ()))

    def _on_indirect(
        self, src: str, m: IndirectPingReq, now: float, reliable: bool = False
    ) -> None:
        seq = self._next_seq()
        timeout = self._awareness.scale(self.config.probe_timeout_s)
        self._relays[seq] = _Relay(src, m.seq, m.nack, now + timeout, now + 2.0 * timeout)
        self._send(m.target_addr, Ping(seq, self.node_id, m.target))

    def _reconnect(self, now: float) -> None:
        self._reconnects = {s: v for s, v in self._reconnects.items() if v[1] > now}
        if self._left_down:
            cands = [n for n in self._down if self._members[n].state == _D]
        else:
            cands = list(self._down)  # all dead
        if cands:
            m = self._members[cands[int(self._rng.random() * len(cands))]]
            seq = self._next_seq()
            self._reconnects[seq] = (m.node, now + self.config.reconnect_interval_s)
            self._send(m.addr, Ping(seq, self.node_id, m.node))

    # -- membership updates ----------------------------------------------------------------------

    def _accuser_ok(self, node: str, accuser: str) -> bool:
        if accuser != self.node_id and accuser not in self._members:
            self.stats.rejected_unknown_origin += 1
            return False
        if self._trust.is_revoked(accuser):
            self.stats.rejected_revoked += 1
            return False
        return True

    def _verify(self, signer: str, u: Update) -> bool:
        if self._trust.verify(signer, signing_bytes(u), u.signature):
            return True
        self.stats.rejected_signature += 1
        return False

    def _on_alive(self, u: Alive, now: float, broadcast: bool = True) -> None:
        m = self._members.get(u.node)
        if m is not None and u.incarnation <= m.incarnation and u.node != self.node_id:
            self.stats.duplicates += 1  # the table's (any state, alive, lower/equal) rows
            return
        is_self = u.node == self.node_id
        held = self._incarnation if is_self else (m.incarnation if m else 0)
        outcome = decide(m.state if m else None, held, u, is_self)
        if outcome is _IGNORE:
            self.stats.duplicates += 1
            return
        if outcome is _REFUTE:
            if self._verify(u.node, u):
                self._refute(u.incarnation, now)
            return
        if self._trust.is_revoked(u.node):
            self.stats.rejected_revoked += 1
            return
        if (m is None or m.alive.credential != u.credential) and not self._trust.admit(
            u.node, u.credential, now
        ):
            self.stats.rejected_credential += 1
            return
        if not self._verify(u.node, u):
            return
        self.stats.updates_applied += 1
        if m is None:
            m = Member(u.node, u.addr, u.incarnation, _A, now, u)
            self._members[u.node] = m
            self._digest = self._by_node = self._ring = None
            self._other_pos[u.node] = len(self._others)
            self._others.append(m)
            self._live += 1
            self._insert_probe(u.node)
            self._emit(MemberJoined(u.node, u.addr, u.incarnation, now))
        else:
            was = m.state
            if was not in _LIVE:
                self._live += 1
                self._down.pop(u.node, None)
                if was == _L:
                    self._left_down -= 1
                self._insert_probe(u.node)
            self._suspicions.pop(u.node, None)
            m.addr, m.incarnation, m.alive, m.accusation = u.addr, u.incarnation, u, None
            m.state = _A
            self._dirty.append(m)
            m.state_since = now
            if was in _LIVE:
                self._emit(MemberUpdated(u.node, u.addr, u.incarnation, now))
            else:
                self._emit(MemberJoined(u.node, u.addr, u.incarnation, now))
        if broadcast:
            self._broadcast(u.node, u, _ALIVE, now)

    def _judge(self, u: Suspect | Dead) -> tuple[Member, Outcome] | None:
        """The member an accusation is about and what the state table makes of it; None when it
        does nothing (about us after we left, about a life too far ahead: counted as refused,
        or ignored: counted as a duplicate)."""
        is_self = u.node == self.node_id
        if is_self and self._left:
            return None
        m = self._members.get(u.node)
        held = self._incarnation if is_self else (m.incarnation if m else 0)
        if m is not None and u.incarnation - held > self.config.accusation_lead_max:
            self.stats.rejected_ahead += 1  # a life nobody could know of: a lie
            return None
        outcome = decide(m.state if m else None, held, u, is_self)
        if outcome is _IGNORE or m is None:
            self.stats.duplicates += 1
            return None
        return m, outcome

    def _on_suspect(self, u: Suspect, now: float, ours: bool = False) -> None:
        judged = self._judge(u)
        if judged is None:
            return
        m, outcome = judged
        s = self._suspicions.get(u.node)
        # A new accuser counts while confirmations shorten the timeout, or while a held-back
        # Dead waits for one (then nobody but that Dead's accuser has accused yet).
        counts = s is not None and (s.n < s.k or s.dead is not None) and u.accuser not in s.accusers
        if outcome is _CONFIRM and not counts and u.incarnation <= m.incarnation:
            self.stats.duplicates += 1
            return
        if not ours and not (self._accuser_ok(u.node, u.accuser) and self._verify(u.accuser, u)):
            return
        if outcome is _REFUTE:
            self._refute(u.incarnation, now)
            return
        self.stats.updates_applied += 1
        if outcome is _CONFIRM:
            if s is not None and counts:
                s.confirm(u.accuser)
                held = s.dead
                if held is not None and held.incarnation >= u.incarnation:
                    self.stats.dead_confirmed += 1
                    self._apply_dead(m, held, now)
                    return
            if u.incarnation > m.incarnation:
                m.incarnation, m.accusation = u.incarnation, u
                self._dirty.append(m)
                if s is not None:
                    s.dead = None  # about an older life
            self._broadcast(u.node, u, _SUSPECT, now)
            return
        # Outcome.SUSPECT
        if ours:
            self.stats.suspicions_raised += 1
        self._start_suspicion(m, u, now)

    def _start_suspicion(self, m: Member, u: Suspect | Dead, now: float) -> Suspicion:
        """Make ``m`` a suspect on ``u``'s accuser's word and spread ``u`` as the accusation."""
        cfg = self.config
        k = cfg.suspicion_confirmations if self._live - 2 >= cfg.suspicion_confirmations else 0
        min_s = cfg.suspicion_min_s(self._live)
        s = self._suspicions[u.node] = Suspicion.start(
            u.accuser, now, k, min_s, min_s * cfg.suspicion_max_timeout_mult, self._check_lead_s()
        )
        m.state, m.incarnation, m.accusation, m.state_since = _S, u.incarnation, u, now
        self._dirty.append(m)
        self._emit(MemberSuspect(u.node, u.incarnation, u.accuser, now))
        self._broadcast(u.node, u, _SUSPECT, now)
        if u.accuser != self.node_id:
            # Look for ourselves next: a confirmation if it is gone, and a live one hears the
            # accusation with our ping (the buddy system) and refutes sooner.
            self._probe_next(m, now)
        return s

    def _on_dead(self, u: Dead, now: float, ours: bool = False) -> None:
        """A Dead: a graceful leave (signed by the node itself), our own verdict (``ours``: our
        suspicion ran out), or another member's accusation, which alone kills nobody."""
        judged = self._judge(u)
        if judged is None:
            return
        m, outcome = judged
        s = self._suspicions.get(u.node) if outcome is _DEAD_IF_CONFIRMED else None
        if s is not None and not ours:
            held = s.dead
            if held is not None and held.accuser == u.accuser and u.incarnation <= held.incarnation:
                self.stats.duplicates += 1  # held back already
                return
        if not ours and not (self._accuser_ok(u.node, u.accuser) and self._verify(u.accuser, u)):
            return
        if outcome is _REFUTE:
            self._refute(u.incarnation, now)
            return
        if ours or outcome is _LEAVES or (s is not None and s.confirms_dead(u.accuser, now)):
            self._apply_dead(m, u, now, ours)
            return
        self._defer_dead(m, s, u, now)

    def _defer_dead(self, m: Member, s: Suspicion | None, u: Dead, now: float) -> None:
        """Hold back another member's unconfirmed Dead: about a live node it starts a suspicion
        on that accuser's word; either way the Dead travels on as that accuser's accusation (so
        the accused hears it and refutes) and waits on the suspicion for a second accuser."""
        self.stats.dead_deferred += 1
        self.stats.updates_applied += 1
        if s is None:
            s = self._start_suspicion(m, u, now)
        else:
            if u.incarnation > m.incarnation:
                m.incarnation, m.accusation = u.incarnation, u
                self._dirty.append(m)
            self._broadcast(u.node, u, _SUSPECT, now)
        s.dead = u

    def _apply_dead(self, m: Member, u: Dead, now: float, ours: bool = False) -> None:
        left = u.accuser == u.node
        self.stats.updates_applied += 1
        self._suspicions.pop(u.node, None)
        if m.state in _LIVE:
            self._live -= 1
            self._down[u.node] = None
            if left:
                self._left_down += 1
        m.state = _L if left else _D
        self._dirty.append(m)
        m.incarnation, m.accusation, m.state_since = u.incarnation, u, now
        self._vivaldi.forget(u.node)
        if left:
            self._emit(MemberLeft(u.node, u.incarnation, now))
        else:
            if ours:
                self.stats.deaths_declared += 1
            self._emit(MemberDead(u.node, u.incarnation, u.accuser, now))
        self._broadcast(u.node, u, _DEAD, now)

    def _check_lead_s(self) -> float:
        wait = self.config.reliable_probe_wait_s
        return wait if wait > 0.0 else self._awareness.scale(self.config.probe_timeout_s)

    def _suspicion_expired(self, node: str, now: float) -> None:
        s = self._suspicions.get(node)
        m = self._members.get(node)
        if s is None or m is None or m.state != _S:
            self._suspicions.pop(node, None)
            return
        if s.final_seq is not None and s.final_acked and s.final_checks < 3:
            # It answered but no refutation reached us: look again one probe interval on.
            s.final_seq = None
            s.deadline = max(s.deadline, now + self._check_lead_s() + self.config.probe_interval_s)
            return
        if s.final_seq is None:
            # Last look before the timeout: ping it, accusation first, over the reliable channel.
            # A live node refutes and its ack carries the new Alive (piggyback picks it first).
            seq = self._next_seq()
            s.final_seq, s.final_acked, s.final_sent_at = seq, False, now
            s.final_checks += 1
            parts: list[Message] = [Ping(seq, self.node_id, node)]
            if m.accusation is not None:
                parts.insert(0, m.accusation)
            msg = Compound(tuple(parts))
            self.stats.messages_out += 1
            if self.config.reliable_probe_wait_s > 0.0:
                self._out_reliable.append((m.addr, msg))
            else:
                self._out.append((m.addr, msg))
            return
        self._suspicions.pop(node, None)
        self._on_dead(self._sign_dead(node, m.incarnation), now, ours=True)

    def _refute(self, incarnation: int, now: float) -> None:
        self._incarnation = max(self._incarnation, incarnation) + 1
        self.stats.refutations += 1
        self._awareness.apply_delta(1)
        alive = self._signed_alive()
        self._self.incarnation, self._self.alive = self._incarnation, alive
        self._dirty.append(self._self)
        self._broadcast(self.node_id, alive, _ALIVE, now)

    # -- records ---------------------------------------------------------------------------------

    def _on_record(self, r: Record, now: float) -> None:
        held = self._records.get(r.origin, r.kind)
        if held is not None and held.record is r:  # the very object we hold: a duplicate
            self.stats.duplicates += 1
            return
        if len(r.payload) > self.config.max_record_payload_bytes:
            self.stats.rejected_oversize += 1
            return
        offer = self._records.classify(r)
        if offer is Offer.DUPLICATE:
            self.stats.duplicates += 1
            return
        if offer is Offer.STALE:
            self.stats.rejected_replay += 1
            return
        if offer is Offer.RETIRED:
            self.stats.retired_refused += 1
            return
        if r.origin not in self._members:
            self.stats.rejected_unknown_origin += 1
            return
        if self._trust.is_revoked(r.origin):
            self.stats.rejected_revoked += 1
            return
        if not self._verify(r.origin, r):
            return
        self.stats.updates_applied += 1
        self._records.put(r, now)
        self._emit(RecordChanged(r.origin, r.kind, r.incarnation, r.counter, r.payload, now))
        size = encoded_size(r)
        self._rqueue.push((r.origin, r.kind), r, size, 0)
        self._relay_later((r.origin, r.kind), r, size)
        self._wake_gossip(now)

    # -- dissemination ---------------------------------------------------------------------------

    def _broadcast(self, node: str, u: Update, klass: int, now: float) -> None:
        size = encoded_size(u)
        self._queue.push(node, u, size, klass)
        self._relay_later(node, u, size)
        self._wake_gossip(now)

    def _relay_later(self, key: object, u: Update, size: int) -> None:
        if self.config.relay_successors > 0:
            self._news.add(key, u, size)

    def _relay(self) -> None:
        """Pass the news since the last round to our ring successors (:mod:`gossip.relay`)."""
        ring = self._ring
        if ring is None:
            ring = self._ring = sorted(self._members)
        members = self._members
        ok = lambda n: members[n].state is _A  # noqa: E731
        for node, msg in relay_round(self._news, self.config, self.stats, ring, ok):
            self._out_reliable.append((members[node].addr, msg))

    def _wake_gossip(self, now: float) -> None:
        if self._next_gossip is None:
            iv = self.config.gossip_interval_s
            self._next_gossip = next_round_at(self._gossip_phase, iv, now)

    def _take_piggyback(self) -> list[Message]:
        cfg = self.config
        live = self._live
        if live != self._limit_for:
            self._limit_for, self._limit = live, cfg.retransmit_limit(live)
            self._rlimit = cfg.records_retransmit_limit(live)
        out = self._queue.take(cfg.membership_budget_bytes, self._limit) if self._pending else []
        if self._rpending:
            out.extend(self._rqueue.take(cfg.records_budget_bytes, self._rlimit))
        return out

    def _send_piggybacked(self, addr: str, first: list[Message], reliable: bool = False) -> None:
        extra = self._take_piggyback()
        msg = first[0] if not extra and len(first) == 1 else Compound(tuple(first + extra))
        self.stats.messages_out += 1
        (self._out_reliable if reliable else self._out).append((addr, msg))

    def _gossipable(self, now: float) -> Callable[[Member], bool]:
        horizon = self.config.gossip_to_the_dead_s

        def ok(m: Member) -> bool:
            return m.state in _LIVE or (m.state == _D and now - m.state_since < horizon)

        return ok

    def _gossip(self, now: float) -> None:
        self.stats.gossip_rounds += 1
        if self._news:
            self._relay()
        targets = self._random_members(self.config.gossip_nodes, self._gossipable(now), True)
        for m in targets:
            parts = self._take_piggyback()
            if not parts:
                break
            self._send(m.addr, Compound(tuple(parts)))
        if self._pending or self._rpending:
            iv = self.config.gossip_interval_s
            self._next_gossip = after_round(self._next_gossip, self._gossip_phase, iv, now)
        else:
            self._next_gossip = None

    def _send(self, addr: str, m: Message) -> None:
        self.stats.messages_out += 1
        self._out.append((addr, m))

    def _random_members(
        self, k: int, pred: Callable[[Member], bool], alive_pass: bool = False
    ) -> list[Member]:
        """Up to ``k`` distinct random members for which ``pred`` holds. ``alive_pass``: every
        alive member does (it is then asked only about the others: this runs every round)."""
        others = self._others
        n = len(others)
        if n == 0 or k <= 0:
            return []
        picked: dict[str, Member] = {}
        rnd = self._rng.random
        alive = _A if alive_pass else None
        for _ in range(3 * k + 8):
            m = others[int(rnd() * n)]
            if m.node not in picked and (m.state is alive or pred(m)):
                picked[m.node] = m
                if len(picked) >= k:
                    return list(picked.values())
        pool = [m for m in others if m.node not in picked and pred(m)]
        need = k - len(picked)
        extra = pool if len(pool) <= need else self._rng.sample(pool, need)
        return list(picked.values()) + extra

    def _insert_probe(self, node: str) -> None:
        if self._bulk:
            self._probe_order.append(node)
            return
        lo = self._probe_idx
        pos = lo + int(self._rng.random() * (len(self._probe_order) - lo + 1))
        self._probe_order.insert(pos, node)

    def _reap(self, now: float) -> None:
        if len(self._dirty) > len(self._members):  # nobody asked for a digest in a long while
            self._by_node = None
            self._dirty.clear()
        horizon = self.config.tombstone_s
        expired = []
        for node in self._down:  # in the order they went down: the oldest first
            if now - self._members[node].state_since < horizon:
                break
            expired.append(node)
        by_node = self._by_node
        for node in expired:
            del self._down[node]
            if self._members.pop(node).state == _L:
                self._left_down -= 1
            if by_node is not None:  # its digest line goes, the others keep their order
                i = bisect_left(by_node, node, key=_node_of)
                del by_node[i], self._rows[i]
                self._digest = None
            pos = self._other_pos.pop(node)
            last = self._others.pop()
            if last.node != node:
                self._others[pos] = last
                self._other_pos[last.node] = pos
            self._records.drop_origin(node)
            self._vivaldi.drop(node)
            self._queue.drop(node)
        if expired:
            self._ring = None

    # -- anti-entropy ----------------------------------------------------------------------------

    def _member_digest(self) -> tuple[MemberDigest, ...]:
        """Sorted by node. Built in full after a join (the order changed); otherwise a reap
        drops its line and only the lines of the members changed since are replaced (each
        member keeps its line until its incarnation or state changes)."""
        by_node, dirty = self._by_node, self._dirty
        if by_node is None or len(dirty) > len(by_node) // 8:
            if by_node is None:
                by_node = self._by_node = sorted(self._members.values(), key=_node_of)
            self._rows = [m.digest() for m in by_node]
            self._digest = None
            dirty.clear()
        elif dirty:
            rows = self._rows
            for m in dirty:
                i = bisect_left(by_node, m.node, key=_node_of)
                if i < len(by_node) and by_node[i] is m:  # else reaped since
                    rows[i] = m.digest()
            self._digest = None
            dirty.clear()
        if self._digest is None:
            self._digest = tuple(self._rows)
        return self._digest

    def _push_pull(self, phase: int, updates: tuple[Update, ...]) -> PushPull:
        return PushPull(
            self.node_id,
            phase,
            self._member_digest(),
            tuple(self._records.digest()),
            updates,
        )

    def _start_push_pull(self) -> None:
        if self._left:
            return
        picks = self._random_members(1, lambda m: m.state == _A, True)
        if picks:
            self.stats.push_pulls += 1
            self._send(picks[0].addr, self._push_pull(0, ()))
        elif self._seeds:
            seed = self._seeds[int(self._rng.random() * len(self._seeds))]
            if seed != self.config.addr:
                self._send(seed, self._push_pull(0, (self._self.alive,)))

    def _full(self, m: Member) -> list[Update]:
        out: list[Update] = [m.alive]
        if m.accusation is not None:
            out.append(m.accusation)
        return out

    def _missing_for(
        self, members: Sequence[MemberDigest], records: Sequence[RecordDigest]
    ) -> tuple[Update, ...]:
        """Full updates the holder of these digests lacks or holds older than we do."""
        out: list[Update] = []
        same = tuple(members) == self._member_digest()
        theirs = {} if same else {d.node: d for d in members}
        for m in () if same else self._members.values():
            d = theirs.get(m.node)
            if d is None:
                if m.state in _LIVE or m.state == _L:
                    out.extend(self._full(m))
            elif (m.incarnation, _RANK[m.state]) > (d.incarnation, _RANK[d.state]):
                out.extend(self._full(m))
        ours = self._records.digest()
        if len(records) == len(ours) and set(records) == set(ours):
            return tuple(out)  # the same records at the same versions
        rtheirs = {(d.origin, d.kind): (d.incarnation, d.counter) for d in records}
        for s in self._records:
            r = s.record
            v = rtheirs.get((r.origin, r.kind))
            if v is None or r.version > v:
                out.append(r)
        return tuple(out)

    def _merge(self, updates: Sequence[Update], now: float) -> None:
        for u in updates:  # alives first so that accusations and records find their member
            if isinstance(u, Alive):
                self._on_alive(u, now)
        for u in updates:
            if isinstance(u, Suspect):
                self._on_suspect(u, now)
            elif isinstance(u, Dead):
                self._on_dead(u, now)
            elif isinstance(u, Record):
                self._on_record(u, now)

    def _on_push_pull(self, src: str, m: PushPull, now: float) -> None:
        self._merge(m.updates, now)
        if m.phase == 0:
            reply = self._push_pull(1, self._missing_for(m.members, m.records))
            self._send(src, reply)
        elif m.phase == 1:
            missing = self._missing_for(m.members, m.records)
            if missing:
                self._send(src, PushPull(self.node_id, 2, (), (), missing))
            self._caught_up(quiet=not m.updates and not missing, now=now)

    def _caught_up(self, quiet: bool, now: float) -> None:
        """End the start-up's catch-up pace early once push-pulls keep finding nothing to repair:
        ``catch_up_quiet_exchanges`` in a row with both views the same."""
        enough = self.config.catch_up_quiet_exchanges
        if not enough or now >= self._catch_up_until:
            return
        self._quiet_exchanges = self._quiet_exchanges + 1 if quiet else 0
        if self._quiet_exchanges >= enough:
            self._catch_up_until = now
            self._next_push_pull = now + self._rng.random() * self._push_pull_every_s()

    def _push_pull_every_s(self) -> float:
        """The regular push-pull interval, scaled to the mesh: its live members, or a quarter
        of every member it knows when that is more."""
        return self.config.push_pull_scaled_s(max(self._live, len(self._others) // 4))

    # -- signing ---------------------------------------------------------------------------------

    def _signed_alive(self) -> Alive:
        return signed_alive(self._signer, self._incarnation, self.config.addr)

    def _sign_suspect(self, node: str, incarnation: int) -> Suspect:
        return signed_accusation(self._signer, Suspect, node, incarnation)

    def _sign_dead(self, node: str, incarnation: int) -> Dead:
        return signed_accusation(self._signer, Dead, node, incarnation)

    def _emit(self, ev: Event) -> None:
        self._events.append(ev)

    _DISPATCH: ClassVar[dict[type, Callable[[Peer, str, Any, float, bool], None]]] = {
        Ping: _on_ping,
        Ack: _on_ack,
        Alive: _recv_alive,
        Record: _recv_record,
        Suspect: _recv_accusation,
        Dead: _recv_accusation,
        IndirectPingReq: _on_indirect,
        Nack: _recv_nack,
        PushPull: _recv_push_pull,
    }
    """The handler of each message type (a compound's parts included), by exact type."""
