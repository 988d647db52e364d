"""A light member model for the simulator: background members that speak the protocol over one
converged view they all share, so that a few real cores (observers) can sit in a mesh of 10,000.

Why: a real :class:`gossip.peer.Peer` holds a row per member (a ``Member`` object of ~100 bytes,
its entries in ``_members``, ``_others``, ``_other_pos``, the probe order and the digest lists:
~220 bytes per row measured with tracemalloc at 500 nodes), so N full cores hold N² rows: 10,000
of them would take ~22 GB even with every message and credential shared (the simulator already
hands every receiver the same immutable message object). A background member holds no rows.

What a background member does, as the real core does it (same config, same message types, sizes
counted with the real codec, every update signed by its author with the simulated keys):

- probes one member per ``probe_interval_s``, every member in turn (a random affine permutation
  of the view per pass); at ``probe_timeout_s`` without an ack, asks ``indirect_checks`` members
  to ping it and sends the reliable fallback ping; with no ack by the end, suspects it;
- answers pings with an ack (a fixed Vivaldi coordinate), relays indirect pings (acks relayed,
  a nack when the target stays silent);
- disseminates: every update newer than what it holds (alive, suspect, dead, record) goes into
  its own :class:`~gossip.broadcast.BroadcastQueue` (the real one, the real retransmit limit and
  budgets), piggybacked on its pings and acks and gossiped to ``gossip_nodes`` random members
  every ``gossip_interval_s`` while anything is queued, and passed once to its ring successor
  (:mod:`gossip.relay`; the shared view's ids in order, skipping those it holds dead);
- keeps a real :class:`~gossip.suspicion.Suspicion` per suspect it heard of (independent accusers
  shorten it), gives the suspect a last look over the reliable channel, then signs a Dead;
  refutes an accusation about itself with a newer Alive; pings a known-dead member every
  ``reconnect_interval_s``;
- push-pulls with a random member every ``push_pull_scaled_s(N)``, with the full digests.

What it does not do: it holds no per-member rows. Its digests, and the full updates it sends in a
push-pull, are those of the shared converged view (every update any background member accepted);
it knows its own view only as the updates it received (versions by key). It verifies no
signature (the observers do), applies another member's Dead at once (no hold-back until a second
accuser), has no Lifeguard local health (timeouts never stretch) and emits no events. So counts,
dissemination and detection are read from the observers, which are real cores with full views;
the background members make the traffic those observers see.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from gossip import messages as wire
from gossip.broadcast import BroadcastQueue
from gossip.codec import encoded_size, signed_accusation, signed_alive, signed_record
from gossip.config import GossipConfig
from gossip.events import Event
from gossip.membership import MemberInfo
from gossip.messages import Alive, Compound, Dead, Message, Ping, Record, Suspect, Update
from gossip.relay import RelayNews, relay_round
from gossip.simview import SharedView, Version, key_version
from gossip.spreading import after_round, next_round_at
from gossip.stats import GossipStats
from gossip.suspicion import Suspicion
from gossip.trust import Signer
from gossip.vivaldi import VivaldiConfig, origin

_ALIVE = 0  # an Alive's version rank (see gossip.simview), as the core's broadcast class
_COORD = origin(VivaldiConfig())


@dataclass(slots=True)
class _Probe:
    target: str
    seq: int
    timeout_at: float
    end_at: float
    fallback_seq: int = 0
    indirect_sent: bool = False


class BackgroundPeer:
    """One background member (see the module docstring): the calls the simulator makes of a
    :class:`gossip.peer.Peer`, over a :class:`SharedView`."""

    __slots__ = (
        "_cycle",
        "_down",
        "_events",
        "_gossip_phase",
        "_held",
        "_nb",
        "_nb_ids",
        "_news",
        "_next_gossip",
        "_next_probe",
        "_next_push_pull",
        "_next_reconnect",
        "_order",
        "_out",
        "_out_reliable",
        "_probe",
        "_queue",
        "_record_counter",
        "_relays",
        "_rng",
        "_rqueue",
        "_seq",
        "_signer",
        "_suspicions",
        "alive",
        "config",
        "incarnation",
        "node_id",
        "stats",
        "view",
    )

    def __init__(
        self,
        view: SharedView,
        config: GossipConfig,
        signer: Signer,
        seeds: Iterable[str],
        now: float,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.view = view
        self.stats = GossipStats()
        self._signer = signer
        self._rng = rng
        self.incarnation = config.boot_incarnation
        self._out: list[tuple[str, Message]] = []
        self._out_reliable: list[tuple[str, Message]] = []
        self._events: list[Event] = []  # it emits none: the observers tell what happened
        self._seq = self._record_counter = 0
        self._held: dict[object, Version] = {}
        """Versions received beyond the warm-start snapshot, by key."""
        self._down: dict[str, float] = {}
        """Members this one holds dead, and since when."""
        self._queue = BroadcastQueue(3)
        self._rqueue = BroadcastQueue(1)
        self._news = RelayNews()
        self._probe: _Probe | None = None
        self._relays: dict[int, tuple[str, int, bool, float]] = {}
        self._suspicions: dict[str, tuple[Suspicion, Suspect | Dead]] = {}
        self._order = (0, 1, 0, 0)  # (stride, offset, step, pass length): a pass in turn
        self._nb: tuple[list[str], list[str], list[str]] | None = None
        """With the probe rings: (subjects, contacts, dead after us), found again when a
        member joins or this one's dead change."""
        self._nb_ids = 0
        self._cycle: list[str] = []
        jitter = rng.random()
        self._next_probe = now + jitter * config.probe_interval_s
        self._gossip_phase = now + jitter * config.gossip_interval_s
        self._next_gossip: float | None = None
        self._next_push_pull = now + rng.random() * config.push_pull_interval_s
        self._next_reconnect = now + rng.random() * config.reconnect_interval_s
        self.alive = self._signed_alive()
        view.add(self.alive)
        seeds = [s for s in seeds if s != config.addr]
        if seeds:  # a cold (re)start: announce the new life, as the core does
            self._learn(self.alive, now)
            self._send(seeds[0], wire.PushPull(self.node_id, 0, (), (), (self.alive,)))

    def warm(self, now: float) -> None:
        """The view is complete: push-pull on the cluster's period from now on."""
        self._next_push_pull = now + self._rng.random() * self._push_pull_s()

    # -- what the simulator calls ------------------------------------------------------------------

    @property
    def self_alive(self) -> Alive:
        return self.alive

    def member(self, node: str) -> MemberInfo | None:
        """This member's word on ``node``: the shared view, unless it holds it dead."""
        a = self.view.alive.get(node)
        if a is None:
            return None
        state = wire.MemberState.DEAD if node in self._down else wire.MemberState.ALIVE
        return MemberInfo(node, a.addr, a.incarnation, state, 0.0)

    def report_loop_lag(self, lag_s: float) -> None:
        """No Lifeguard local health here (see the module docstring): a lag changes nothing."""

    def take_output(
        self,
    ) -> tuple[list[tuple[str, Message]], list[tuple[str, Message]], list[Event]] | None:
        out, rel = self._out, self._out_reliable
        if not (out or rel):
            return None
        self._out, self._out_reliable = [], []
        return out, rel, self._events

    def publish(self, kind: str, payload: bytes, now: float) -> Record:
        self._record_counter += 1
        rec = signed_record(self._signer, kind, self.incarnation, self._record_counter, payload)
        self._learn(rec, now)
        return rec

    def get_timer(self) -> float:
        due = [self._next_probe, self._next_push_pull]
        p = self._probe
        if p is not None:
            due.append(p.end_at if p.indirect_sent else p.timeout_at)
        if self._next_gossip is not None:
            due.append(self._next_gossip)
        if self._down:
            due.append(self._next_reconnect)
        due.extend(r[3] for r in self._relays.values())
        due.extend(s.due for s, _ in self._suspicions.values())
        return min(due)

    def handle_timer(self, now: float) -> None:
        cfg = self.config
        if self._probe is not None:
            self._probe_due(self._probe, now)
        if now >= self._next_probe:
            self._next_probe = now + cfg.probe_interval_s
            if self._probe is None:
                self._start_probe(now)
        if self._relays:
            for seq, (addr, oseq, nack, at) in list(self._relays.items()):
                if at <= now:
                    del self._relays[seq]
                    if nack:
                        self._send(addr, wire.Nack(oseq, self.node_id))
        if self._suspicions:
            for node in [n for n, (s, _) in self._suspicions.items() if s.due <= now]:
                self._suspicion_due(node, now)
        if self._next_gossip is not None and now >= self._next_gossip:
            self._gossip(now)
        if now >= self._next_push_pull:
            self._next_push_pull = now + self._push_pull_s()
            target = self._random_members(1, now)
            if target:
                self.stats.push_pulls += 1
                self._send(target[0], self._push_pull(0, ()))
        if now >= self._next_reconnect:
            self._next_reconnect = now + cfg.reconnect_interval_s
            downs = list(self._down) if cfg.probe_rings <= 0 else self._neighbours()[2]
            if downs:
                node = downs[int(self._rng.random() * len(downs))]
                self._send(self._addr(node), Ping(self._next_seq(), self.node_id, node))

    def receive(self, src: str, message: Message, now: float, reliable: bool = False) -> None:
        self.stats.messages_in += 1
        parts = message.parts if type(message) is Compound else (message,)
        for m in parts:
            t = type(m)
            if t is Ping:
                if m.target == self.node_id:  # type: ignore[union-attr]
                    ack = wire.Ack(m.seq, self.node_id, _COORD)  # type: ignore[union-attr]
                    self._send_piggybacked(src, ack, reliable)
            elif t is wire.Ack:
                self._on_ack(m, now)  # type: ignore[arg-type]
            elif t is wire.IndirectPingReq:
                seq = self._next_seq()
                timeout = self.config.probe_timeout_s
                self._relays[seq] = (src, m.seq, m.nack, now + timeout)  # type: ignore[union-attr]
                self._send(m.target_addr, Ping(seq, self.node_id, m.target))  # type: ignore[union-attr]
            elif t is wire.PushPull:
                self._on_push_pull(src, m, now)  # type: ignore[arg-type]
            elif t is wire.Nack:
                self.stats.nacks_received += 1
            else:
                self._receive_update(src, m, now)  # type: ignore[arg-type]

    # -- probing -----------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _addr(self, node: str) -> str:
        return self.view.alive[node].addr

    def _neighbours(self) -> tuple[list[str], list[str], list[str]]:
        """(subjects, contacts, dead after us) on the probe rings, as the core finds them."""
        nb = self._nb
        ids = len(self.view.ids)
        if nb is None or self._nb_ids != ids:
            down, me = self._down, self.node_id
            rings = self.view.rings(self.config.probe_rings)
            subjects, observers, skipped = rings.neighbours(me, lambda n: n != me and n not in down)
            contacts = subjects + [n for n in observers if n not in subjects]
            nb = self._nb = (subjects, contacts, skipped)
            self._nb_ids = ids
        return nb

    def _next_target(self) -> str | None:
        if self.config.probe_rings > 0:
            for _ in range(2):
                while self._cycle:
                    node = self._cycle.pop()
                    if node not in self._down:
                        return node
                self._cycle = list(self._neighbours()[0])
                self._rng.shuffle(self._cycle)
            return None
        ids = self.view.ids
        n = len(ids)
        for _ in range(n):
            stride, offset, step, length = self._order
            if step >= length:  # a new pass, in a new order
                stride = 1 + int(self._rng.random() * (n - 1)) if n > 1 else 1
                while math.gcd(stride, n) != 1:
                    stride += 1
                offset, step, length = int(self._rng.random() * n), 0, n
            self._order = (stride, offset, step + 1, length)
            node = ids[(offset + stride * step) % n]
            if node != self.node_id and node not in self._down:
                return node
        return None

    def _start_probe(self, now: float) -> None:
        target = self._next_target()
        if target is None:
            return
        cfg = self.config
        seq = self._next_seq()
        self._probe = _Probe(target, seq, now + cfg.probe_timeout_s, now + cfg.probe_interval_s)
        self.stats.probes_sent += 1
        self._send_piggybacked(self._addr(target), Ping(seq, self.node_id, target))

    def _probe_due(self, p: _Probe, now: float) -> None:
        """No ack yet: ask others at the timeout; suspect the target at the end."""
        if now >= p.timeout_at and not p.indirect_sent:
            self._send_indirect(p, now)
        if p.end_at <= now:
            self._probe = None
            self.stats.probes_failed += 1
            self._suspect(p.target, now)

    def _send_indirect(self, p: _Probe, now: float) -> None:
        p.indirect_sent = True
        addr = self._addr(p.target)
        wait = self.config.reliable_probe_wait_s
        if wait > 0.0:
            p.fallback_seq = self._next_seq()
            p.end_at = max(p.end_at, now + wait)
            self.stats.messages_out += 1
            self.stats.reliable_probes += 1
            self._out_reliable.append((addr, Ping(p.fallback_seq, self.node_id, p.target)))
        k = self.config.indirect_checks
        relays = [r for r in self._random_members(k + 1, now) if r != addr]
        for r in relays[:k]:
            self.stats.indirect_probes += 1
            self._send(r, wire.IndirectPingReq(p.seq, self.node_id, p.target, addr, True))

    def _on_ack(self, m: wire.Ack, now: float) -> None:
        p = self._probe
        if p is not None and m.seq in (p.seq, p.fallback_seq):
            self._probe = None
            return
        relay = self._relays.pop(m.seq, None)
        if relay is not None:
            self._send(relay[0], wire.Ack(relay[1], self.node_id, None))
            return
        held = self._suspicions.get(m.source)
        if held is not None and held[0].final_seq == m.seq:
            held[0].final_acked = True

    # -- suspicion ---------------------------------------------------------------------------------

    def _suspect(self, node: str, now: float) -> None:
        if node in self._down:
            return
        self.stats.suspicions_raised += 1
        u = signed_accusation(self._signer, Suspect, node, self._version(node)[0])
        self._receive_update(self.node_id, u, now)

    def _suspicion_due(self, node: str, now: float) -> None:
        s, acc = self._suspicions[node]
        if s.final_seq is not None and s.final_acked and s.final_checks < 3:
            s.final_seq = None  # it answered: look again one probe interval on
            s.deadline = max(s.deadline, now + s.lead_s + self.config.probe_interval_s)
            return
        if s.final_seq is None:
            s.final_seq, s.final_acked, s.final_sent_at = self._next_seq(), False, now
            s.final_checks += 1
            ping = Ping(s.final_seq, self.node_id, node)
            self.stats.messages_out += 1
            self._out_reliable.append((self._addr(node), Compound((acc, ping))))
            return
        del self._suspicions[node]
        self.stats.deaths_declared += 1
        dead = signed_accusation(self._signer, Dead, node, self._version(node)[0])
        self._receive_update(self.node_id, dead, now)

    # -- dissemination -----------------------------------------------------------------------------

    def _version(self, key: object) -> Version:
        v = self._held.get(key)
        if v is not None:
            return v
        base = self.view.base.get(key)  # type: ignore[call-overload]
        return (base, _ALIVE) if base is not None else (-1, -1)

    def _receive_update(self, src: str, u: Update, now: float) -> None:
        key, v, klass = key_version(u)
        if isinstance(u, Record):
            if v > self._version(key):
                self.stats.updates_applied += 1
                self._learn(u, now)
            else:
                self.stats.duplicates += 1
            return
        node = u.node
        if node == self.node_id:
            if not isinstance(u, Alive) and u.incarnation >= self.incarnation:
                self._refute(u.incarnation, now)
            return
        held = self._version(key)
        if v <= held:
            sus = self._suspicions.get(node) if isinstance(u, Suspect) and v == held else None
            if sus is not None and sus[0].confirm(u.accuser):  # type: ignore[union-attr]
                self._broadcast(key, u, klass, now)  # another accuser of the same suspicion
                return
            self.stats.duplicates += 1
            return
        self.stats.updates_applied += 1
        self._learn(u, now)
        if isinstance(u, Suspect):
            cfg, n = self.config, self.view.live
            k = cfg.suspicion_confirmations if n - 2 >= cfg.suspicion_confirmations else 0
            min_s = cfg.suspicion_min_s(n)
            lead = cfg.reliable_probe_wait_s or cfg.probe_timeout_s
            max_s = min_s * cfg.suspicion_max_timeout_mult
            self._suspicions[node] = (Suspicion.start(u.accuser, now, k, min_s, max_s, lead), u)
            return
        self._suspicions.pop(node, None)
        if isinstance(u, Dead):
            if node not in self._down:
                self._down[node] = now
                self._nb = None
        elif self._down.pop(node, None) is not None:
            self._nb = None

    def _learn(self, u: Update, now: float) -> None:
        """Hold ``u`` as the newest of its key, queue it, and put it in the shared view."""
        key, v, klass = key_version(u)
        self._held[key] = v
        self.view.learn(u)
        if type(u) is Record:
            size = encoded_size(u)
            self._rqueue.push(key, u, size, 0)
            if self.config.relay_successors > 0:
                self._news.add(key, u, size)
            self._wake_gossip(now)
        else:
            self._broadcast(key, u, klass, now)

    def _broadcast(self, key: object, u: Update, klass: int, now: float) -> None:
        size = encoded_size(u)
        self._queue.push(key, u, size, klass)
        if self.config.relay_successors > 0:
            self._news.add(key, u, size)
        self._wake_gossip(now)

    def _refute(self, incarnation: int, now: float) -> None:
        self.incarnation = max(self.incarnation, incarnation) + 1
        self.stats.refutations += 1
        self.alive = self._signed_alive()
        self._learn(self.alive, now)

    def _signed_alive(self) -> Alive:
        return signed_alive(self._signer, self.incarnation, self.config.addr)

    def _wake_gossip(self, now: float) -> None:
        """Gossip from the next round of this member's grid on, unless it already does."""
        if self._next_gossip is not None:
            return
        self._next_gossip = next_round_at(self._gossip_phase, self.config.gossip_interval_s, now)

    def _take_piggyback(self) -> list[Message]:
        cfg = self.config
        live = self.view.live
        out: list[Message] = []
        if self._queue.pending:
            out = self._queue.take(cfg.membership_budget_bytes, cfg.retransmit_limit(live))
        if self._rqueue.pending:
            out.extend(
                self._rqueue.take(cfg.records_budget_bytes, cfg.records_retransmit_limit(live))
            )
        return out

    def _send_piggybacked(self, addr: str, first: Message, reliable: bool = False) -> None:
        extra = self._take_piggyback()
        msg = Compound((first, *extra)) if extra else first
        self.stats.messages_out += 1
        (self._out_reliable if reliable else self._out).append((addr, msg))

    def _gossip(self, now: float) -> None:
        self.stats.gossip_rounds += 1
        if self._news:
            down = self._down
            ring, ok = self.view.ring, lambda n: n not in down
            for node, msg in relay_round(self._news, self.config, self.stats, ring, ok):
                self._out_reliable.append((self._addr(node), msg))
        for addr in self._random_members(self.config.gossip_nodes, now):
            parts = self._take_piggyback()
            if not parts:
                break
            self._send(addr, Compound(tuple(parts)))
        scheduled, self._next_gossip = self._next_gossip, None
        if self._queue.pending or self._rqueue.pending:
            iv = self.config.gossip_interval_s
            self._next_gossip = after_round(scheduled, self._gossip_phase, iv, now)

    def _random_members(self, k: int, now: float) -> list[str]:
        """Up to ``k`` distinct random addresses of members this one may gossip to: alive,
        suspect, or dead for less than ``gossip_to_the_dead_s``; never itself."""
        ids, alive = self.view.ids, self.view.alive
        if self.config.probe_rings > 0:  # the ring neighbours (see gossip.rings)
            contacts = self._neighbours()[1]
            pick = contacts if len(contacts) <= k else self._rng.sample(contacts, k)
            return [alive[n].addr for n in pick]
        n = len(ids)
        horizon = self.config.gossip_to_the_dead_s
        picked: dict[str, None] = {}
        rnd = self._rng.random
        for _ in range(3 * k + 8):
            node = ids[int(rnd() * n)]
            since = self._down.get(node)
            if node != self.node_id and (since is None or now - since < horizon):
                picked[alive[node].addr] = None
                if len(picked) >= k:
                    break
        return list(picked)

    def _send(self, addr: str, m: Message) -> None:
        self.stats.messages_out += 1
        self._out.append((addr, m))

    # -- anti-entropy ------------------------------------------------------------------------------

    def _push_pull_s(self) -> float:
        return self.config.push_pull_scaled_s(self.view.live)

    def _push_pull(self, phase: int, updates: tuple[Update, ...]) -> wire.PushPull:
        view = self.view
        digests = view.member_digest(), view.record_digest()
        return wire.PushPull(self.node_id, phase, *digests, updates)

    def _on_push_pull(self, src: str, m: wire.PushPull, now: float) -> None:
        for u in sorted(m.updates, key=lambda u: type(u) is not Alive):
            self._receive_update(src, u, now)
        if m.phase == 0:
            self._send(src, self._push_pull(1, self.view.missing_for(m.members, m.records)))
        elif m.phase == 1:
            missing = self.view.missing_for(m.members, m.records)
            if missing:
                self._send(src, wire.PushPull(self.node_id, 2, (), (), missing))
