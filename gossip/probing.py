"""Probing, the SWIM half of :class:`gossip.peer.Peer`: one member probed per interval in a shuffled
round (of its ring subjects, :mod:`gossip.rings`; of every member with the rings off), indirect
probes through ``indirect_checks`` others with Lifeguard's nacks, the reliable fallback ping,
the relay of other members' indirect probes, and the reconnect pings to the dead.

Functions of the peer's state, which they take as ``peer``; sans-I/O like the peer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gossip.membership import Member
from gossip.messages import (
    Ack,
    IndirectPingReq,
    MemberState,
    Message,
    Nack,
    Ping,
)

if TYPE_CHECKING:
    from gossip.peer import Peer

# Enum members read once: ``MemberState.ALIVE`` runs ``EnumType.__getattr__`` at every use.
_A, _S, _D = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
_LIVE = (_A, _S)


@dataclass(slots=True)
class Probe:
    """The probe in flight: one target, its ping's seq, and its deadlines."""

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


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    """This member's ring neighbours (:mod:`gossip.rings`), found again when one of them stops
    being live or a member joins, comes back, or is reaped."""

    subjects: tuple[Member, ...]
    """The first live member after us on each ring: whom we probe, in turn."""
    contacts: tuple[Member, ...]
    """The subjects and the observers (the first live member before us on each ring): whom we
    gossip to and ask for indirect probes."""
    dead_after: tuple[Member, ...]
    """Dead (not left) members between us and a subject: whom we ping to reconnect."""


def neighbourhood(peer: Peer) -> Neighbourhood | None:
    """Our ring neighbours, or None when the rings are off (``probe_rings`` 0)."""
    if peer.config.probe_rings <= 0:
        return None
    nb = peer._contacts
    if nb is not None:
        for m in nb.contacts:
            if m.state not in _LIVE:
                break
        else:
            return nb
    members = peer._members
    me = peer.node_id
    subjects, observers, skipped = peer._rings.neighbours(
        me, lambda n: n != me and members[n].state in _LIVE
    )
    subs = tuple(members[n] for n in subjects)
    contacts = subs + tuple(members[n] for n in observers if n not in subjects)
    dead = tuple(members[n] for n in skipped if members[n].state == _D)
    nb = peer._contacts = Neighbourhood(subs, contacts, dead)
    peer.stats.neighbourhoods += 1
    return nb


def is_contact(peer: Peer, m: Member) -> bool:
    """``m`` is one of our ring neighbours (always true with the rings off)."""
    nb = neighbourhood(peer)
    return nb is None or m in nb.contacts


def measured_contacts(peer: Peer, measured: Iterable[str]) -> list[str]:
    """The ``measured`` members (with RTT samples) this node probes now, its ring neighbours: a
    few, whatever N; not those it probed before members joined and the rings moved."""
    members = peer._members
    return [n for n in measured if (m := members.get(n)) is not None and is_contact(peer, m)]


def contact_members(
    peer: Peer, k: int, pred: Callable[[Member], bool], alive_pass: bool = False
) -> list[Member]:
    """Up to ``k`` random ring neighbours for which ``pred`` holds (random members with the
    rings off, see :func:`gossip.spreading.random_members`)."""
    nb = neighbourhood(peer)
    if nb is None:
        return peer._random_members(k, pred, alive_pass)
    pool = [m for m in nb.contacts if pred(m)]
    if len(pool) <= k:
        return pool
    return peer._rng.sample(pool, k)


@dataclass(slots=True)
class RelayedPing:
    """Another member's indirect probe that we ping on its behalf."""

    origin_addr: str
    origin_seq: int
    nack: bool
    deadline: float
    """Send the nack now if the target stayed silent (Lifeguard)."""
    expires: float
    """A late ack is still relayed until then: a stalled target answers late, not never."""
    nacked: bool = False


def recv_nack(peer: Peer, src: str, m: Nack, now: float, reliable: bool) -> None:
    if peer._probe is not None and m.seq == peer._probe.seq:
        peer._probe.nacks += 1
        peer.stats.nacks_received += 1


def next_seq(peer: Peer) -> int:
    peer._seq += 1
    return peer._seq


def start_probe(peer: Peer, now: float) -> None:
    cfg = peer.config
    interval = peer._awareness.scale(cfg.probe_interval_s)
    peer._next_probe = now + interval
    target = next_probe_target(peer)
    if target is None:
        return
    seq = next_seq(peer)
    timeout = peer._awareness.scale(cfg.probe_timeout_s)
    peer._probe = Probe(target.node, seq, now, now + timeout, now + interval)
    peer.stats.probes_sent += 1
    first: list[Message] = [Ping(seq, peer.node_id, target.node)]
    if target.state == _S and target.accusation is not None:
        first.append(target.accusation)  # buddy system: tell the suspect first
    peer._send_piggybacked(target.addr, first)


def next_probe_target(peer: Peer) -> Member | None:
    order = peer._probe_order
    for _ in range(2):
        while peer._probe_idx < len(order):
            node = order[peer._probe_idx]
            peer._probe_idx += 1
            m = peer._members.get(node)
            if m is not None and m.state in _LIVE:
                return m
        nb = neighbourhood(peer)
        pool = peer._others if nb is None else nb.subjects
        order[:] = [m.node for m in pool if m.state in _LIVE]
        peer._rng.shuffle(order)
        peer._probe_idx = 0
        if not order:
            return None
    return None


def send_indirect(peer: Peer, p: Probe, now: float) -> None:
    p.indirect_sent = True
    target = peer._members.get(p.target)
    if target is None:
        return
    wait = peer.config.reliable_probe_wait_s
    if wait > 0.0:  # memberlist's TCP fallback ping, alongside the indirect probes
        p.fallback_seq = next_seq(peer)
        p.fallback_end_at = now + wait
        peer._out_reliable.append((target.addr, Ping(p.fallback_seq, peer.node_id, p.target)))
        peer.stats.messages_out += 1
        peer.stats.reliable_probes += 1
    relays = contact_members(
        peer, peer.config.indirect_checks, lambda m: m.state == _A and m.node != p.target
    )
    for r in relays:
        peer._send(r.addr, IndirectPingReq(p.seq, peer.node_id, p.target, target.addr, True))
    p.expected_nacks = len(relays)
    peer.stats.indirect_probes += len(relays)


def probe_end(peer: Peer, p: Probe, now: float) -> None:
    """The interval (or the fallback's wait) ended without an ack by datagram."""
    if not p.datagrams_failed:
        p.datagrams_failed = True
        peer.stats.probes_failed += 1
    if p.fallback_acked:
        probe_rescued(peer, p)
    elif p.fallback_seq and now < p.fallback_end_at:
        p.end_at = p.fallback_end_at
    else:
        probe_failed(peer, p, now)


def probe_rescued(peer: Peer, p: Probe) -> None:
    # Only the reliable channel got through: the target lives and our datagram path is
    # lossy. Neither a suspicion nor a health strike (memberlist logs a warning here).
    peer._probe = None
    peer.stats.probes_rescued += 1


def probe_failed(peer: Peer, p: Probe, now: float) -> None:
    peer._probe = None
    if p.expected_nacks > 0:
        peer._awareness.apply_delta(max(0, p.expected_nacks - p.nacks))
    else:
        peer._awareness.apply_delta(1)
    m = peer._members.get(p.target)
    if m is None or m.state not in _LIVE:
        return
    peer._on_suspect(peer._sign_suspect(m.node, m.incarnation), now, ours=True)


def on_ping(peer: Peer, src: str, m: Ping, now: float, reliable: bool = False) -> None:
    if m.target != peer.node_id:
        return
    peer._send_piggybacked(src, [Ack(m.seq, peer.node_id, peer._vivaldi.coord)], reliable)


def on_ack(peer: Peer, src: str, m: Ack, now: float, reliable: bool = False) -> None:
    p = peer._probe
    if p is not None and m.seq == p.fallback_seq:
        if p.datagrams_failed:
            probe_rescued(peer, p)
        else:  # keep listening for the datagram path until the interval ends
            p.fallback_acked = True
        return
    if p is not None and m.seq == p.seq:
        peer._probe = None
        peer._awareness.apply_delta(-1)
        if m.source == p.target and m.coordinate is not None:
            peer._vivaldi.update(m.source, m.coordinate, now - p.sent_at)
        return
    if peer._suspicions:
        s = peer._suspicions.get(m.source)
        if s is not None and s.final_seq == m.seq:
            s.final_acked = True
            return
    relay = peer._relays.pop(m.seq, None)
    if relay is not None:
        peer._send(relay.origin_addr, Ack(relay.origin_seq, peer.node_id, None))
        return
    rc = peer._reconnects.pop(m.seq, None)
    if rc is not None:
        target = peer._members.get(rc[0])
        if target is not None:
            peer.stats.push_pulls += 1
            peer._send(target.addr, peer._push_pull(0, ()))


def on_indirect(
    peer: Peer, src: str, m: IndirectPingReq, now: float, reliable: bool = False
) -> None:
    seq = next_seq(peer)
    timeout = peer._awareness.scale(peer.config.probe_timeout_s)
    peer._relays[seq] = RelayedPing(src, m.seq, m.nack, now + timeout, now + 2.0 * timeout)
    peer._send(m.target_addr, Ping(seq, peer.node_id, m.target))


def reconnect(peer: Peer, now: float) -> None:
    peer._reconnects = {s: v for s, v in peer._reconnects.items() if v[1] > now}
    if not peer._down:
        return
    nb = neighbourhood(peer)
    if nb is not None:  # the dead just after us on a ring: each dead one has one pinger a ring
        cands = [m.node for m in nb.dead_after]
    elif peer._left_down:
        cands = [n for n in peer._down if peer._members[n].state == _D]
    else:
        cands = list(peer._down)  # all dead
    if cands:
        m = peer._members[cands[int(peer._rng.random() * len(cands))]]
        seq = next_seq(peer)
        peer._reconnects[seq] = (m.node, now + peer.config.reconnect_interval_s)
        peer._send(m.addr, Ping(seq, peer.node_id, m.node))


def probe_next(peer: Peer, m: Member, now: float) -> bool:
    p = peer._probe
    if p is not None and p.target == m.node:
        return False  # being probed now
    if now - m.hinted_at < peer._live * peer._awareness.scale(peer.config.probe_interval_s):
        return False
    m.hinted_at = now
    order, i = peer._probe_order, peer._probe_idx
    with contextlib.suppress(ValueError):  # else probed this round, or joined since it began
        del order[order.index(m.node, i)]
    order.insert(i, m.node)
    peer.stats.probes_hinted += 1
    return True


def insert_probe(peer: Peer, node: str) -> None:
    if peer.config.probe_rings > 0:  # it may be a ring neighbour now; the rings order probes
        peer._contacts = None
        return
    if peer._bulk:
        peer._probe_order.append(node)
        return
    lo = peer._probe_idx
    pos = lo + int(peer._rng.random() * (len(peer._probe_order) - lo + 1))
    peer._probe_order.insert(pos, node)
