"""A deterministic in-process simulator: N real :class:`Peer` cores on a fake clock and network.

The clock is a heap of timed events (message deliveries and each node's next timer). The network
drops (``loss``), delays (uniform between ``delay_min_s`` and ``delay_max_s``), duplicates
(``duplicate``) and partitions (nodes in different groups cannot talk). A CPU-starved node is
frozen ``stall_s`` out of every ``period_s`` (like a SIGSTOP): messages and timers wait for it to
wake, and it then reports the lag to its Lifeguard awareness, as the asyncio adapter does.

Besides these datagrams, a core may send over a reliable channel (its fallback probes and last
looks, as memberlist uses TCP): such a message is never lost while its path is up, only late: each
loss draw costs a retransmit timeout (``rto_s``, doubling, as TCP's), and a ping that came that
way is answered that way. A crashed or partitioned destination gets nothing either way.

Every message is sized with the real codec to count bytes (``measure_bytes``: the exact
``len(codec.encode(m))``, with each update sized once), and can be encoded and decoded again
(``codec_roundtrip``) so that what peers receive went through the wire format.
Signing uses :class:`SimSigner`/:class:`SimTrust` (keyed BLAKE2b: cheap, and forged or altered
data fails exactly as with real keys); pass ``trust_factory`` to plug the real identity instead.

Every member is a real core, unless ``observers`` is set: then only that many members, spread
evenly over the ids, are real cores with full views, and the others are background members
(:mod:`gossip.simbackground`: the protocol's traffic over one shared converged view, no
per-member rows), so that a mesh of 10,000 fits in a few GB. Counts are then read from the
observers (see that module for what a background member does and does not do).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from gossip import codec
from gossip.codec import SIM_REMEMBERED_UPDATES, compound_sizes, remember_updates, wire_size
from gossip.config import GossipConfig
from gossip.events import Event
from gossip.incarnation import boot_incarnation
from gossip.messages import Compound, Message
from gossip.peer import Peer
from gossip.simbackground import BackgroundPeer
from gossip.simkeys import SimKeyring, SimSigner, SimTrust
from gossip.simview import SharedView
from gossip.trust import Signer, Trust


@dataclass(slots=True)
class SimNode:
    node_id: str
    peer: Peer | BackgroundPeer
    up: bool = True
    starve_period_s: float = 0.0
    starve_stall_s: float = 0.0
    starve_phase_s: float = 0.0
    timer_at: float | None = None
    last_lag_report: float = -1.0


@dataclass(slots=True)
class NetStats:
    sent: int = 0
    reliable_sent: int = 0
    dropped: int = 0
    retransmits: int = 0
    delivered: int = 0
    bytes: int = 0
    record_bytes: int = 0


class StreamModel:
    """Counts what the real transport's streams would cost: one stream per pair of nodes that
    talk, both directions on it, at most ``bound`` per node, least recently used closed first
    (as :class:`gossip.streams.StreamPool` holds them). A message between two nodes without a
    stream opens one: a handshake. A message to a node that is down opens nothing."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.lru: dict[str, OrderedDict[str, None]] = {}
        self.handshakes = 0
        self.closed_lru = 0
        self.ends: dict[str, int] = {}
        """Handshakes each node took part in (either end)."""

    def use(self, a: str, b: str) -> None:
        lru = self.lru
        la = lru.get(a)
        if la is None:
            la = lru[a] = OrderedDict()
        if b in la:
            la.move_to_end(b)
            lb = lru[b]
            lb.move_to_end(a)
            return
        lb2 = lru.get(b)
        if lb2 is None:
            lb2 = lru[b] = OrderedDict()
        lb = lb2
        self.handshakes += 1
        ends = self.ends
        ends[a] = ends.get(a, 0) + 1
        ends[b] = ends.get(b, 0) + 1
        la[b] = None
        lb[a] = None
        for x, lx in ((a, la), (b, lb)):
            while len(lx) > self.bound:
                old = next(iter(lx))
                del lx[old]
                lru[old].pop(x, None)
                self.closed_lru += 1

    def close(self, a: str) -> None:
        """``a`` went down: its peers see its streams end."""
        for b in self.lru.pop(a, {}):
            self.lru[b].pop(a, None)

    def open_counts(self, ids: Iterable[str]) -> list[int]:
        return [len(self.lru.get(i, ())) for i in ids]


_TIMER, _MSG, _RELIABLE = 0, 1, 2
_Entry = tuple[float, int, int, str, str, Message | None, int]
"""(time, sequence, kind, destination, source, message, bytes the destination counts in on
delivery): ordered by time, then sequence."""
_SLOTS_PER_S = 1000


class _Timers:
    """Timer entries in (time, sequence) order, bucketed by millisecond slot: only the earliest
    slot is a heap (a few entries), the later ones plain lists, and a heap of slot numbers says
    which comes next. With ~N pending timers (one per node, plus superseded ones), this keeps
    every push and pop off a heap of N tuples, whose comparisons miss the cache at each level."""

    def __init__(self) -> None:
        self.cur: list[_Entry] = []
        """The earliest slot's entries, a heap; refilled from the next slot once empty."""
        self._cur_slot = -1
        self._slots: dict[int, list[_Entry]] = {}
        self._order: list[int] = []

    def push(self, e: _Entry) -> None:
        slot = int(e[0] * _SLOTS_PER_S)
        if slot == self._cur_slot:
            heapq.heappush(self.cur, e)
            return
        if slot < self._cur_slot:  # earlier than the slot moved up (entries there still pend)
            if self.cur:
                self._slots[self._cur_slot] = self.cur
                heapq.heappush(self._order, self._cur_slot)
            self.cur, self._cur_slot = [], -1
        entries = self._slots.get(slot)
        if entries is None:
            self._slots[slot] = [e]
            heapq.heappush(self._order, slot)
        else:
            entries.append(e)

    def refill(self) -> bool:
        """Move the next slot up into ``cur`` (which is empty); False if there is none."""
        if not self._order:
            return False
        slot = heapq.heappop(self._order)
        cur = self._slots.pop(slot)
        heapq.heapify(cur)
        self.cur, self._cur_slot = cur, slot
        return True


@contextmanager
def few_collections() -> Iterator[None]:
    """Collect the young generation every 50,000 allocations instead of every 700 (Python's
    default), for a long simulation: it makes millions of short-lived, acyclic tuples and
    messages, and scanning them that often costs ~15% of the run for nothing."""
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


@dataclass
class Simulation:
    """``n`` peers named ``n0000``...; ``warm`` starts them with a full view (no join storm)."""

    n: int
    seed: int = 0
    loss: float = 0.0
    delay_min_s: float = 0.0002
    delay_max_s: float = 0.002
    duplicate: float = 0.0
    rto_s: float = 0.2
    """Reliable channel: the first retransmit timeout (Linux's minimum RTO); doubles per loss."""
    warm: bool = True
    measure_bytes: bool = True
    codec_roundtrip: bool = False
    config: Callable[[GossipConfig], GossipConfig] | None = None
    trust_factory: Callable[[str], tuple[Signer, Trust]] | None = None
    on_event: Callable[[str, Event], None] | None = None
    streams: StreamModel | None = None
    """Count streams and their handshakes as the real transport would hold them (slower: every
    message goes through the model)."""
    observers: int | None = None
    """Only this many real cores, the rest background members (see the module docstring)."""
    now: float = 0.0
    net: NetStats = field(default_factory=NetStats)
    nodes: dict[str, SimNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        remember_updates(SIM_REMEMBERED_UPDATES)
        self.rng = random.Random(self.seed)
        self.keyring = SimKeyring()
        self._heap: list[_Entry] = []
        """Messages in flight: a few dozen, so a push or pop is a handful of comparisons."""
        self._timers = _Timers()
        """Each node's next timer (and superseded ones, skipped when they come up): ~N."""
        self._seq = itertools.count(1)
        """Ties between entries due at the same time go in the order they were queued."""
        self._group: dict[str, int] = {}
        self._boots: dict[str, int] = {}
        ids = [f"n{i:04d}" for i in range(self.n)]
        self.view: SharedView | None = None
        self.observer_ids = ids
        if self.observers is not None:
            if not self.warm:
                raise ValueError("observers need a warm start (background members join warm)")
            if not 0 < self.observers <= self.n:
                raise ValueError(f"observers must be 1..{self.n}")
            self.view = SharedView()
            self.observer_ids = [ids[i * self.n // self.observers] for i in range(self.observers)]
        self._observer_set = set(self.observer_ids)
        seeds = [] if self.warm else ids[:1]
        for nid in ids:
            self._boot(nid, seeds)
        if self.warm:
            snapshot = [self.nodes[nid].peer.self_alive for nid in ids]
            for node in self.nodes.values():
                peer = node.peer
                if isinstance(peer, BackgroundPeer):
                    peer.warm(self.now)
                else:
                    peer.preload(snapshot, self.now)
                    peer.events()
                self._flush(node)

    # -- lifecycle -----------------------------------------------------------------------------

    def _boot(self, nid: str, seeds: Iterable[str]) -> None:
        old = self.nodes.get(nid)
        clock_s = self._boots[nid] = self._boots.get(nid, 1_000_000) + 1000  # a later boot time
        # above every incarnation its earlier life used, as a node's kept incarnation makes it
        boot = boot_incarnation(None if old is None else old.peer.incarnation, clock_s)
        cfg = GossipConfig(node_id=nid, addr=nid, boot_incarnation=boot)
        if self.config is not None:
            cfg = self.config(cfg)
        if self.trust_factory is not None:
            signer, trust = self.trust_factory(nid)
        else:
            signer, trust = SimSigner(nid, self.keyring), SimTrust(self.keyring)
        rng = random.Random(self.rng.getrandbits(64))
        others = [s for s in seeds if s != nid]
        peer: Peer | BackgroundPeer
        if self.view is not None and nid not in self._observer_set:
            peer = BackgroundPeer(self.view, cfg, signer, others, self.now, rng)
        else:
            peer = Peer(cfg, signer, trust, others, self.now, rng)
            if self.view is not None:
                self.view.add(peer.self_alive)
        node = SimNode(nid, peer)
        if old is not None:
            node.starve_period_s = old.starve_period_s
            node.starve_stall_s = old.starve_stall_s
            node.starve_phase_s = old.starve_phase_s
        self.nodes[nid] = node
        self._flush(node)

    def crash(self, nid: str) -> None:
        """Stop ``nid`` silently (kill -9): it neither sends nor receives."""
        self.nodes[nid].up = False
        if self.streams is not None:
            self.streams.close(nid)

    def restart(self, nid: str, seeds: Iterable[str]) -> None:
        """Boot a fresh core for ``nid`` (a later boot time, above its last incarnation)."""
        self._boot(nid, seeds)

    def starve(self, nid: str, period_s: float = 1.0, stall_s: float = 0.4) -> None:
        node = self.nodes[nid]
        node.starve_period_s, node.starve_stall_s = period_s, stall_s
        node.starve_phase_s = self.rng.random() * period_s

    def partition(self, *groups: Iterable[str]) -> None:
        """Only nodes in the same group can talk (nodes in no group form group 0)."""
        self._group = {nid: i + 1 for i, g in enumerate(groups) for nid in g}

    def heal(self) -> None:
        self._group = {}

    def peer(self, nid: str) -> Peer:
        """``nid``'s real core (a background member has none: TypeError)."""
        peer = self.nodes[nid].peer
        if not isinstance(peer, Peer):
            raise TypeError(f"{nid} is a background member, not a real core")
        return peer

    def live_observers(self) -> list[str]:
        """The real cores that are up (every live node, without ``observers``)."""
        return [nid for nid in self.observer_ids if self.nodes[nid].up]

    def live_ids(self) -> list[str]:
        return [nid for nid, node in self.nodes.items() if node.up]

    # -- the event loop ------------------------------------------------------------------------

    def _push(
        self, t: float, kind: int, dst: str, src: str, msg: Message | None, size: int = 0
    ) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, dst, src, msg, size))

    def _stalled_until(self, node: SimNode, t: float) -> float | None:
        if node.starve_stall_s <= 0.0:
            return None
        pos = (t - node.starve_phase_s) % node.starve_period_s
        if pos < node.starve_stall_s:
            return t + (node.starve_stall_s - pos) + 1e-6  # past the edge despite rounding
        return None

    def run_until(self, t_end: float) -> None:
        """Deliver every message and fire every timer due up to ``t_end``.

        Messages and timers wait apart, taken in one (time, sequence) order: the same order as
        one heap, but a message's push and pop compare a few dozen entries in flight, not the
        thousand timers (see :class:`_Timers`). This loop runs for every message and timer, so
        it does what :meth:`_flush` and (for sized datagrams, without duplication) what
        :meth:`_transmit` do inline, and brings ``net`` up to date when it returns."""
        heap, timers = self._heap, self._timers
        nodes = self.nodes
        pop, push = heapq.heappop, heapq.heappush
        on_event = self.on_event
        timer, reliable, seq = _TIMER, _RELIABLE, self._seq
        rnd, loss = self.rng.random, self.loss
        delay_min, span = self.delay_min_s, self.delay_max_s - self.delay_min_s
        inline = (
            self.measure_bytes
            and not self.codec_roundtrip
            and not self.duplicate
            and self.streams is None
        )
        sent = dropped = in_bytes = in_records = 0
        try:
            while True:
                cur = timers.cur
                if not cur and timers.refill():
                    cur = timers.cur
                if heap:
                    q = cur if cur and cur[0] < heap[0] else heap
                elif cur:
                    q = cur
                else:
                    break
                if q[0][0] > t_end:
                    break
                t, _, kind, dst, src, msg, size = pop(q)
                node = nodes[dst]
                if not node.up or (kind == timer and node.timer_at != t):
                    continue
                self.now = t
                if node.starve_stall_s > 0.0:
                    wake = self._stalled_until(node, t)
                    if wake is not None:
                        if kind == timer:
                            self._set_timer(node, wake)
                        else:
                            push(heap, (wake, next(seq), kind, dst, src, msg, size))
                        continue
                    if node.last_lag_report < t - node.starve_period_s:
                        node.last_lag_report = t
                        node.peer.report_loop_lag(node.starve_stall_s)
                peer = node.peer
                if kind == timer:
                    node.timer_at = None
                    peer.handle_timer(t)
                else:
                    if size:
                        peer.stats.bytes_in += size
                    peer.receive(src, msg, t, kind == reliable)  # type: ignore[arg-type]
                output = peer.take_output()
                if output is not None:
                    out, rel, evs = output
                    if out and inline and not self._group:
                        t0 = t + delay_min
                        out_bytes = 0
                        for addr, m in out:
                            if type(m) is Compound:
                                nbytes, records = compound_sizes(m)
                            else:
                                nbytes, records = wire_size(m), 0
                            out_bytes += nbytes
                            to = nodes.get(addr)
                            if to is None or rnd() < loss:
                                dropped += 1
                                continue
                            if to.up:  # it counts the bytes in on delivery
                                in_bytes += nbytes
                                in_records += records
                            else:
                                nbytes = 0
                            entry = (t0 + rnd() * span, next(seq), _MSG, addr, dst, m, nbytes)
                            push(heap, entry)
                        sent += len(out)
                        peer.stats.bytes_out += out_bytes
                    elif out:
                        self._transmit(node, out)
                    if rel:
                        self._transmit_reliable(node, rel)
                    if evs and on_event is not None:
                        for ev in evs:
                            on_event(dst, ev)
                at = peer.get_timer()
                if at is not None and at != node.timer_at:
                    if at < t:
                        at = t
                    node.timer_at = at
                    timers.push((at, next(seq), timer, dst, "", None, 0))
        finally:
            net = self.net
            net.sent += sent
            net.dropped += dropped
            net.delivered += sent - dropped
            net.bytes += in_bytes
            net.record_bytes += in_records
        self.now = max(self.now, t_end)

    def run_for(self, seconds: float) -> None:
        self.run_until(self.now + seconds)

    def _flush(self, node: SimNode) -> None:
        """Send what ``node`` queued, report its events and set its timer."""
        peer = node.peer
        output = peer.take_output()
        if output is not None:
            out, rel, evs = output
            if out:
                self._transmit(node, out)
            if rel:
                self._transmit_reliable(node, rel)
            if evs and self.on_event is not None:
                on_event, nid = self.on_event, node.node_id
                for ev in evs:
                    on_event(nid, ev)
        t = peer.get_timer()
        if t is not None and t != node.timer_at:
            self._set_timer(node, t if t > self.now else self.now)

    def _set_timer(self, node: SimNode, t: float) -> None:
        node.timer_at = t
        self._timers.push((t, next(self._seq), _TIMER, node.node_id, "", None, 0))

    def _sized(self, node: SimNode, msg: Message) -> tuple[Message, int, int]:
        """``msg`` as the receiver gets it, its wire size and the bytes of its record parts,
        counted as sent by ``node``."""
        if self.codec_roundtrip:
            data = codec.encode(msg)
            msg, size = codec.decode(data), len(data)
            records = _wire_sizes(msg)[1]
        else:
            size, records = _wire_sizes(msg)
        node.peer.stats.bytes_out += size
        return msg, size, records

    def _transmit(self, node: SimNode, out: list[tuple[str, Message]]) -> None:
        rnd = self.rng.random
        src = node.node_id
        group = self._group
        g_src = group.get(src, 0)
        t0, span = self.now + self.delay_min_s, self.delay_max_s - self.delay_min_s
        loss, duplicate = self.loss, self.duplicate
        nodes, heap, push = self.nodes, self._heap, heapq.heappush
        sizing = self.measure_bytes or self.codec_roundtrip
        roundtrip = self.codec_roundtrip
        seq = self._seq
        sent_bytes = dropped = delivered = in_bytes = in_records = 0
        size = records = 0
        streams = self.streams
        for addr, msg in out:
            if roundtrip:
                msg, size, records = self._sized(node, msg)
            elif sizing:
                if type(msg) is Compound:
                    size, records = compound_sizes(msg)
                else:
                    size, records = wire_size(msg), 0
                sent_bytes += size
            dst = nodes.get(addr)
            if streams is not None and dst is not None and dst.up:
                streams.use(src, addr)
            if dst is None or (group and group.get(addr, 0) != g_src) or rnd() < loss:
                dropped += 1
                continue
            twice = duplicate and rnd() < duplicate
            counted = size if dst.up else 0  # the destination counts it in on delivery
            delivered += 1
            in_bytes += counted
            in_records += records if counted else 0
            push(heap, (t0 + rnd() * span, next(seq), _MSG, addr, src, msg, counted))
            if twice:
                delivered += 1
                in_bytes += counted
                in_records += records if counted else 0
                push(heap, (t0 + rnd() * span, next(seq), _MSG, addr, src, msg, counted))
        net = self.net
        net.sent += len(out)
        net.dropped += dropped
        net.delivered += delivered
        net.bytes += in_bytes
        net.record_bytes += in_records
        node.peer.stats.bytes_out += sent_bytes

    def _transmit_reliable(self, node: SimNode, out: list[tuple[str, Message]]) -> None:
        rnd = self.rng.random
        net = self.net
        src = node.node_id
        group = self._group
        g_src = group.get(src, 0)
        span = self.delay_max_s - self.delay_min_s
        sizing = self.measure_bytes or self.codec_roundtrip
        for addr, msg in out:
            net.sent += 1
            net.reliable_sent += 1
            size = records = 0
            if sizing:
                msg, size, records = self._sized(node, msg)
            dst = self.nodes.get(addr)
            if dst is None or not dst.up or (group and group.get(addr, 0) != g_src):
                net.dropped += 1  # refused or timed out: the sender just hears nothing
                continue
            if self.streams is not None:
                self.streams.use(src, addr)
            delay = self.delay_min_s + rnd() * span
            rto = self.rto_s
            while rnd() < self.loss:  # each lost segment waits out one more, doubled, RTO
                net.retransmits += 1
                if size:
                    node.peer.stats.bytes_out += size
                delay += rto
                rto *= 2.0
            net.delivered += 1
            if size:
                net.bytes += size
                net.record_bytes += records
            self._push(self.now + delay, _RELIABLE, addr, src, msg, size)


def _wire_sizes(msg: Message) -> tuple[int, int]:
    """``msg``'s wire size and the bytes of its record parts."""
    if isinstance(msg, Compound):
        return compound_sizes(msg)
    return wire_size(msg), 0


def fast_config(**overrides: float | int) -> Callable[[GossipConfig], GossipConfig]:
    """A ``Simulation.config`` hook applying ``overrides`` to every node's config."""

    def apply(cfg: GossipConfig) -> GossipConfig:
        return replace(cfg, **overrides)  # type: ignore[arg-type]

    return apply
