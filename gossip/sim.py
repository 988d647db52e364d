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
"""

from __future__ import annotations

import gc
import hashlib
import heapq
import hmac
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from gossip import codec
from gossip.config import GossipConfig
from gossip.events import Event
from gossip.messages import Compound, Message, Record
from gossip.peer import Peer
from gossip.trust import Signer, Trust

# -- cheap identity --------------------------------------------------------------------------------


class SimKeyring:
    """The simulated cluster CA: derives each node's key and credential from one secret."""

    def __init__(self, secret: bytes = b"shoal-sim-ca") -> None:
        self._secret = secret
        self._keys: dict[str, bytes] = {}
        self._creds: dict[str, bytes] = {}
        self._verified: dict[tuple[str, bytes, bytes], bool] = {}
        self.revoked: set[str] = set()

    def key(self, node: str) -> bytes:
        k = self._keys.get(node)
        if k is None:
            k = hashlib.blake2b(node.encode(), key=self._secret, digest_size=32).digest()
            self._keys[node] = k
        return k

    def credential(self, node: str) -> bytes:
        c = self._creds.get(node)
        if c is None:
            tag = hashlib.blake2b(b"cert:" + node.encode(), key=self._secret, digest_size=32)
            c = self._creds[node] = b"simcert:" + tag.digest()
        return c

    def verify(self, node: str, data: bytes, signature: bytes) -> bool:
        """Check a MAC, remembering the answer: every node verifies every update once, and the
        answer depends only on these three values (a forgery still fails)."""
        key = (node, data, signature)
        ok = self._verified.get(key)
        if ok is None:
            mac = hashlib.blake2b(data, key=self.key(node), digest_size=32).digest()
            ok = hmac.compare_digest(mac, signature)
            if len(self._verified) >= 1 << 18:
                self._verified.clear()
            self._verified[key] = ok
        return ok


@dataclass(frozen=True, slots=True)
class SimSigner:
    node: str
    keyring: SimKeyring

    @property
    def node_id(self) -> str:
        return self.node

    @property
    def credential(self) -> bytes:
        return self.keyring.credential(self.node)

    def sign(self, data: bytes) -> bytes:
        return hashlib.blake2b(data, key=self.keyring.key(self.node), digest_size=32).digest()


@dataclass(frozen=True, slots=True)
class SimTrust:
    keyring: SimKeyring

    def admit(self, node_id: str, credential: bytes, now: float) -> bool:
        if node_id in self.keyring.revoked:
            return False
        return hmac.compare_digest(credential, self.keyring.credential(node_id))

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool:
        return self.keyring.verify(node_id, data, signature)

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self.keyring.revoked


# -- the simulated cluster -------------------------------------------------------------------------


@dataclass(slots=True)
class SimNode:
    node_id: str
    peer: Peer
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


_TIMER, _MSG, _RELIABLE = 0, 1, 2


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
    now: float = 0.0
    net: NetStats = field(default_factory=NetStats)
    nodes: dict[str, SimNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.keyring = SimKeyring()
        self._heap: list[tuple[float, int, int, str, str, Message | None]] = []
        self._seq = 0
        self._group: dict[str, int] = {}
        self._boots: dict[str, int] = {}
        ids = [f"n{i:04d}" for i in range(self.n)]
        seeds = [] if self.warm else ids[:1]
        for nid in ids:
            self._boot(nid, seeds)
        if self.warm:
            snapshot = [self.nodes[nid].peer.self_alive for nid in ids]
            for node in self.nodes.values():
                node.peer.preload(snapshot, self.now)
                node.peer.events()
                self._flush(node)

    # -- lifecycle -----------------------------------------------------------------------------

    def _boot(self, nid: str, seeds: Iterable[str]) -> None:
        boot = self._boots.get(nid, 1_000_000) + 1000
        self._boots[nid] = boot
        cfg = GossipConfig(node_id=nid, addr=nid, boot_incarnation=boot)
        if self.config is not None:
            cfg = self.config(cfg)
        if self.trust_factory is not None:
            signer, trust = self.trust_factory(nid)
        else:
            signer, trust = SimSigner(nid, self.keyring), SimTrust(self.keyring)
        rng = random.Random(self.rng.getrandbits(64))
        peer = Peer(cfg, signer, trust, [s for s in seeds if s != nid], self.now, rng)
        old = self.nodes.get(nid)
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

    def restart(self, nid: str, seeds: Iterable[str]) -> None:
        """Boot a fresh core for ``nid`` (a later boot time, so a higher incarnation)."""
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
        return self.nodes[nid].peer

    def live_ids(self) -> list[str]:
        return [nid for nid, node in self.nodes.items() if node.up]

    # -- the event loop ------------------------------------------------------------------------

    def _push(self, t: float, kind: int, dst: str, src: str, msg: Message | None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, dst, src, msg))

    def _stalled_until(self, node: SimNode, t: float) -> float | None:
        if node.starve_stall_s <= 0.0:
            return None
        pos = (t - node.starve_phase_s) % node.starve_period_s
        if pos < node.starve_stall_s:
            return t + (node.starve_stall_s - pos) + 1e-6  # past the edge despite rounding
        return None

    def run_until(self, t_end: float) -> None:
        """Deliver every message and fire every timer due up to ``t_end``."""
        heap = self._heap
        nodes = self.nodes
        pop = heapq.heappop
        flush = self._flush
        while heap and heap[0][0] <= t_end:
            t, _, kind, dst, src, msg = pop(heap)
            node = nodes[dst]
            if not node.up or (kind == _TIMER and node.timer_at != t):
                continue
            self.now = t
            if node.starve_stall_s > 0.0:
                wake = self._stalled_until(node, t)
                if wake is not None:
                    if kind == _TIMER:
                        self._set_timer(node, wake)
                    else:
                        self._push(wake, kind, dst, src, msg)
                    continue
                if node.last_lag_report < t - node.starve_period_s:
                    node.last_lag_report = t
                    node.peer.report_loop_lag(node.starve_stall_s)
            if kind == _TIMER:
                node.timer_at = None
                node.peer.handle_timer(t)
            else:
                node.peer.receive(src, msg, t, kind == _RELIABLE)  # type: ignore[arg-type]
            flush(node)
        self.now = max(self.now, t_end)

    def run_for(self, seconds: float) -> None:
        self.run_until(self.now + seconds)

    def _flush(self, node: SimNode) -> None:
        peer = node.peer
        out, rel = peer.take_outgoing()
        if out:
            self._transmit(node, out)
        if rel:
            self._transmit_reliable(node, rel)
        if self.on_event is not None:
            evs = peer.events()
            if evs:
                on_event, nid = self.on_event, node.node_id
                for ev in evs:
                    on_event(nid, ev)
        else:
            peer.events()
        t = peer.get_timer()
        if t is not None and t != node.timer_at:
            self._set_timer(node, t if t > self.now else self.now)

    def _set_timer(self, node: SimNode, t: float) -> None:
        node.timer_at = t
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, _TIMER, node.node_id, "", None))

    def _size(self, node: SimNode, msg: Message) -> tuple[Message, int]:
        """``msg`` as the receiver gets it and its wire size, counted as sent by ``node``."""
        if self.codec_roundtrip:
            data = codec.encode(msg)
            node.peer.stats.bytes_out += len(data)
            return codec.decode(data), len(data)
        size = codec.wire_size(msg)
        node.peer.stats.bytes_out += size
        return msg, size

    def _count_in(self, dst: SimNode, msg: Message, size: int) -> None:
        dst.peer.stats.bytes_in += size
        net = self.net
        net.bytes += size
        if type(msg) is Compound:
            for p in msg.parts:
                if type(p) is Record:
                    net.record_bytes += codec.encoded_size(p)

    def _transmit(self, node: SimNode, out: list[tuple[str, Message]]) -> None:
        rnd = self.rng.random
        net = self.net
        src = node.node_id
        group = self._group
        g_src = group.get(src, 0)
        t0, span = self.now + self.delay_min_s, self.delay_max_s - self.delay_min_s
        loss, duplicate = self.loss, self.duplicate
        nodes, heap, push = self.nodes, self._heap, heapq.heappush
        sizing = self.measure_bytes or self.codec_roundtrip
        size = 0
        for addr, msg in out:
            net.sent += 1
            if sizing:
                msg, size = self._size(node, msg)
            dst = nodes.get(addr)
            if dst is None or (group and group.get(addr, 0) != g_src) or rnd() < loss:
                net.dropped += 1
                continue
            copies = 2 if duplicate and rnd() < duplicate else 1
            for _ in range(copies):
                net.delivered += 1
                if size and dst.up:
                    self._count_in(dst, msg, size)
                self._seq += 1
                push(heap, (t0 + rnd() * span, self._seq, _MSG, addr, src, msg))

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
            size = 0
            if sizing:
                msg, size = self._size(node, msg)
            dst = self.nodes.get(addr)
            if dst is None or not dst.up or (group and group.get(addr, 0) != g_src):
                net.dropped += 1  # refused or timed out: the sender just hears nothing
                continue
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
                self._count_in(dst, msg, size)
            self._push(self.now + delay, _RELIABLE, addr, src, msg)


def fast_config(**overrides: float | int) -> Callable[[GossipConfig], GossipConfig]:
    """A ``Simulation.config`` hook applying ``overrides`` to every node's config."""

    def apply(cfg: GossipConfig) -> GossipConfig:
        return replace(cfg, **overrides)  # type: ignore[arg-type]

    return apply
