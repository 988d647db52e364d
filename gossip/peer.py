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

:class:`Peer` is the facade and holds the state; the work is done by functions of that state in
:mod:`gossip.probing` (probe rounds, indirect probes, fallback and reconnect pings),
:mod:`gossip.verdicts` (Alive, Suspect and Dead judged, suspicions, refutations, tombstones),
:mod:`gossip.spreading` (broadcast queues, gossip rounds, the ring relay, records) and
:mod:`gossip.antientropy` (digests and push-pull).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from gossip import antientropy, probing, spreading, verdicts
from gossip.awareness import Awareness
from gossip.broadcast import BroadcastQueue
from gossip.codec import encoded_size, signed_accusation, signed_alive, signed_record
from gossip.config import GossipConfig
from gossip.events import (
    Event,
    RecordChanged,
)
from gossip.membership import Member, MemberInfo
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
    Suspect,
)
from gossip.probing import Neighbourhood, Probe, RelayedPing
from gossip.records import RecordStore, StoredRecord
from gossip.relay import RelayNews
from gossip.rings import Rings
from gossip.stats import GossipStats
from gossip.suspicion import Suspicion
from gossip.trust import Signer, Trust
from gossip.vivaldi import Coordinate, VivaldiClient, VivaldiConfig

_ALIVE = 0  # the broadcast priority class of Alives (and of our own leave)
# Enum members read once: ``MemberState.ALIVE`` runs ``EnumType.__getattr__`` at every use.
_A, _L = MemberState.ALIVE, MemberState.LEFT
_REAP_EVERY_S = 5.0


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
        "_records_due",
        "_catch_up_until",
        "_quiet_exchanges",
        "_news",
        "_rings",
        "_contacts",
        "_seed_turn",
        "_on_incarnation",
    )

    def __init__(
        self,
        config: GossipConfig,
        signer: Signer,
        trust: Trust,
        seeds: Sequence[str],
        now: float,
        rng: random.Random,
        on_incarnation: Callable[[int], bool] | None = None,
    ) -> None:
        """``on_incarnation``: called with each incarnation a refutation raises ours to, before
        anything carries it, for the caller to keep (:mod:`gossip.incarnation`); False: it could
        not (counted in ``stats.incarnations_unkept``)."""
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
        self._on_incarnation = on_incarnation
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
        self._probe: Probe | None = None
        self._relays: dict[int, RelayedPing] = {}
        self._reconnects: dict[int, tuple[str, float]] = {}
        self._suspicions: dict[str, Suspicion] = {}
        self._queue = BroadcastQueue(3)
        self._limit_for, self._limit = 0, 0  # retransmit limit, cached per live count
        self._rlimit = 0  # the records' retransmit limit, for the same count
        self._rqueue = BroadcastQueue(1)
        self._pending, self._rpending = self._queue.pending, self._rqueue.pending  # (emptiness)
        self._news = RelayNews()  # what the next round passes to our ring successors
        self._rings = Rings(max(1, config.probe_rings))  # ring 0: ids sorted (the relay's)
        self._rings.add(self.node_id)
        self._contacts: Neighbourhood | None = None  # the ring neighbours (None: to be found)
        self._seed_turn = False  # push-pulls alternate with seeds not yet met (antientropy)
        self._records = RecordStore()
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._awareness.apply_delta(config.start_health_score)
        self._vivaldi = VivaldiClient(VivaldiConfig(), rng)
        jitter = rng.random()
        self._next_probe = now + jitter * config.probe_interval_s
        self._next_gossip: float | None = None
        self._gossip_phase = now + jitter * config.gossip_interval_s
        self._records_due = 0.0  # the first gossip round records ride again (records_spaced)
        self._next_push_pull = now + (1.0 + rng.random()) * config.catch_up_push_pull_s
        self._catch_up_until = now + config.catch_up_window_s
        self._quiet_exchanges = 0  # push-pulls in a row that found both views the same
        self._next_reconnect = now + rng.random() * config.reconnect_interval_s
        self._next_reap = now + _REAP_EVERY_S
        trust.admit(self.node_id, signer.credential, now)
        alive = self._signed_alive()
        self._self = Member(self.node_id, config.addr, self._incarnation, _A, now, alive)
        self._members[self.node_id] = self._self
        seeds = [seed for seed in self._seeds if seed != config.addr]
        if seeds:
            # One seed, drawn at random: a mesh starting at once spreads its joins over the
            # seeds instead of sending each of them every joiner's full exchange. If it does
            # not answer, the catch-up push-pulls try a random seed again until one does.
            self._send(seeds[int(rng.random() * len(seeds))], self._push_pull(0, (alive,)))
        if self._seeds:
            # A cold join also gossips its own Alive (memberlist does): once the seed's answer
            # names the members, they hear of the newcomer from it as well as from the seed.
            self._broadcast(self.node_id, alive, _ALIVE, now)

    # -- the parts -------------------------------------------------------------------------------
    # The work is done by functions of the peer's state in four modules; those that this class,
    # another part, a test or a benchmark calls are bound here as methods (no wrapper to pay).

    # probing (gossip/probing.py)
    _insert_probe = probing.insert_probe
    _next_seq = probing.next_seq
    _probe_end = probing.probe_end
    _probe_next = probing.probe_next
    _reconnect = probing.reconnect
    _send_indirect = probing.send_indirect
    _start_probe = probing.start_probe
    # liveness verdicts (gossip/verdicts.py)
    _on_alive = verdicts.on_alive
    _on_dead = verdicts.on_dead
    _on_suspect = verdicts.on_suspect
    _suspicion_expired = verdicts.suspicion_expired
    _reap = verdicts.reap
    _verify = verdicts.verify
    # record spreading and the ring relay (gossip/spreading.py)
    _broadcast = spreading.broadcast
    _gossip = spreading.gossip_round
    _gossipable = spreading.gossipable
    _on_record = spreading.on_record
    _random_members = spreading.random_members
    _relay_later = spreading.relay_later
    _send_piggybacked = spreading.send_piggybacked
    _wake_gossip = spreading.wake_gossip
    # push-pull anti-entropy (gossip/antientropy.py)
    _member_digest = antientropy.member_digest
    _push_pull = antientropy.push_pull
    _push_pull_every_s = antientropy.push_pull_every_s
    _start_push_pull = antientropy.start_push_pull

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

    def measured_rtt(self, node: str) -> float | None:
        """The median of the recent measured probe RTTs to ``node`` in seconds, if any."""
        return self._vivaldi.measured_rtt_s(node)

    def measured_nodes(self) -> list[str]:
        """See :func:`gossip.probing.measured_contacts`."""
        return probing.measured_contacts(self, self._vivaldi.measured())

    def probe_soon(self, node: str, now: float) -> bool:
        """A hint that ``node`` may be gone (the transport saw its connection end, or could not
        open one): probe it next, out of turn. The hint decides nothing, the probe does; only the
        order changes, not the pace, and a member is moved at most once a probe round (one
        interval per live member), so however many hints come this member probes no more often,
        and no member more than twice a round. False if nothing changed (not an alive member, not
        a ring neighbour, or hinted this round already)."""
        m = self._members.get(node)
        if m is None or m is self._self or m.state is not _A:
            return False  # a suspect is being judged already
        if not probing.is_contact(self, m):
            # Not a ring neighbour: its observers, which hold streams to it, got the same hint
            # if it died. Probing it here would open a stream (a mesh's joins all ending at
            # the seed's bound would send every member to it at once).
            return False
        return self._probe_next(m, now)

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
            catching_up = now < self._catch_up_until
            if alone:
                every = cfg.catch_up_push_pull_s
            elif catching_up:  # backs off while Lifeguard's local health says we are slow
                every = self._awareness.scale(cfg.catch_up_push_pull_s)
            else:
                every = self._push_pull_every_s()
            self._next_push_pull = now + every
            self._start_push_pull(catching_up and not alone)
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

    def _send(self, addr: str, m: Message) -> None:
        self.stats.messages_out += 1
        self._out.append((addr, m))

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
        Ping: probing.on_ping,
        Ack: probing.on_ack,
        Alive: _recv_alive,
        Record: spreading.recv_record,
        Suspect: verdicts.recv_accusation,
        Dead: verdicts.recv_accusation,
        IndirectPingReq: probing.on_indirect,
        Nack: probing.recv_nack,
        PushPull: antientropy.recv_push_pull,
    }
    """The handler of each message type (a compound's parts included), by exact type."""
