"""Spreading updates and records for :class:`gossip.peer.Peer`: the broadcast queues piggybacked
on probes and sent in gossip rounds, the ring relay to our successors (:mod:`gossip.relay`),
received records, and the random picks of members to send to.

Functions of the peer's state, which they take as ``peer``; sans-I/O like the peer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gossip.codec import encoded_size
from gossip.events import (
    RecordChanged,
)
from gossip.membership import Member
from gossip.messages import (
    Compound,
    MemberState,
    Message,
    Record,
    Update,
)
from gossip.probing import contact_members
from gossip.records import Offer, StoredRecord
from gossip.relay import relay_round
from gossip.verdicts import refute

if TYPE_CHECKING:
    from gossip.peer import Peer

# Enum members read once: ``MemberState.ALIVE`` runs ``EnumType.__getattr__`` at every use.
_A, _S, _D = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
_LIVE = (_A, _S)


def next_round_at(phase: float, interval_s: float, now: float) -> float:
    """The first gossip round after ``now`` on a node's grid ``phase + k * interval_s``."""
    return phase + (int((now - phase) // interval_s) + 1) * interval_s


def after_round(scheduled: float | None, phase: float, interval_s: float, now: float) -> float:
    """The round after the one ``scheduled`` at (or after ``now``, if that one is past)."""
    t = (scheduled or now) + interval_s
    return t if t > now else next_round_at(phase, interval_s, now)


def recv_record(peer: Peer, src: str, m: Record, now: float, reliable: bool) -> None:
    held = peer._records.get(m.origin, m.kind)
    if held is not None and held.record is m:  # the very object we hold: a duplicate
        peer.stats.duplicates += 1
        return
    on_record(peer, m, now)


def on_record(peer: Peer, r: Record, now: float) -> None:
    held = peer._records.get(r.origin, r.kind)
    if held is not None and held.record is r:  # the very object we hold: a duplicate
        peer.stats.duplicates += 1
        return
    if len(r.payload) > peer.config.max_record_payload_bytes:
        peer.stats.rejected_oversize += 1
        return
    offer = peer._records.classify(r)
    if offer is Offer.DUPLICATE:
        peer.stats.duplicates += 1
        return
    if offer is Offer.STALE:
        peer.stats.rejected_replay += 1
        return
    if offer is Offer.RETIRED:
        peer.stats.retired_refused += 1
        return
    if r.origin not in peer._members:
        peer.stats.rejected_unknown_origin += 1
        return
    if peer._trust.is_revoked(r.origin):
        peer.stats.rejected_revoked += 1
        return
    if not peer._verify(r.origin, r):
        return
    if r.origin == peer.node_id and refute_record(peer, r, held, now):
        return
    peer.stats.updates_applied += 1
    peer._records.put(r, now)
    peer._emit(RecordChanged(r.origin, r.kind, r.incarnation, r.counter, r.payload, now))
    size = encoded_size(r)
    peer._rqueue.push((r.origin, r.kind), r, size, 0)
    relay_later(peer, (r.origin, r.kind), r, size)
    wake_gossip(peer, now)


def refute_record(peer: Peer, r: Record, held: StoredRecord | None, now: float) -> bool:
    """A record in our name newer than ``held``, ours of its kind (the caller's lookup): made
    with our key elsewhere (a stolen key), or by an earlier life of ours. Where this life
    published the kind, the record is not ours: it is not taken in, and ours is published again
    at a version past it, which every member takes as newer (True). A version past any we
    reached raises our incarnation, as a refuted Alive does, so that what we publish next wins
    everywhere. Otherwise the record is taken in (False): an earlier life of ours may have said
    it."""
    mine = held is not None and held.record.incarnation >= peer.config.boot_incarnation
    ahead = r.version > (peer._incarnation, peer._record_counter)
    if not (mine or ahead):
        return False
    peer.stats.records_refuted += 1
    if ahead:
        refute(peer, r.incarnation, now)
    if held is None or not mine:
        return False
    peer.publish(r.kind, held.record.payload, now)
    return True


def broadcast(peer: Peer, node: str, u: Update, klass: int, now: float) -> None:
    size = encoded_size(u)
    peer._queue.push(node, u, size, klass)
    relay_later(peer, node, u, size)
    wake_gossip(peer, now)


def relay_later(peer: Peer, key: object, u: Update, size: int) -> None:
    if peer.config.relay_successors > 0:
        peer._news.add(key, u, size)


def relay(peer: Peer) -> None:
    """Pass the news since the last round to our ring successors (:mod:`gossip.relay`)."""
    ring = peer._rings.order(0)
    members = peer._members
    ok = lambda n: members[n].state is _A  # noqa: E731
    for node, msg in relay_round(peer._news, peer.config, peer.stats, ring, ok):
        peer._out_reliable.append((members[node].addr, msg))


def wake_gossip(peer: Peer, now: float) -> None:
    if peer._next_gossip is None:
        iv = peer.config.gossip_interval_s
        peer._next_gossip = next_round_at(peer._gossip_phase, iv, now)


def take_piggyback(peer: Peer, records: bool = True) -> list[Message]:
    """What rides the next message: membership updates, and records unless ``records`` is
    false (a gossip round they are not due in: ``GossipConfig.records_spaced``)."""
    cfg = peer.config
    live = peer._live
    if live != peer._limit_for:
        peer._limit_for, peer._limit = live, cfg.retransmit_limit(live)
        peer._rlimit = cfg.records_retransmit_limit(live)
    out = peer._queue.take(cfg.membership_budget_bytes, peer._limit) if peer._pending else []
    if records and peer._rpending:
        out.extend(peer._rqueue.take(cfg.records_budget_bytes, peer._rlimit))
    return out


def send_piggybacked(peer: Peer, addr: str, first: list[Message], reliable: bool = False) -> None:
    extra = take_piggyback(peer)
    msg = first[0] if not extra and len(first) == 1 else Compound(tuple(first + extra))
    peer.stats.messages_out += 1
    (peer._out_reliable if reliable else peer._out).append((addr, msg))


def gossipable(peer: Peer, now: float) -> Callable[[Member], bool]:
    horizon = peer.config.gossip_to_the_dead_s

    def ok(m: Member) -> bool:
        return m.state in _LIVE or (m.state == _D and now - m.state_since < horizon)

    return ok


def gossip_round(peer: Peer, now: float) -> None:
    """Send what is queued to ``gossip_nodes`` members: records only in the rounds they are due
    in (``GossipConfig.records_spaced``). The news for the ring successor goes in those rounds,
    or with membership news (then records ride along in the one message)."""
    cfg = peer.config
    iv = cfg.gossip_interval_s
    peer.stats.gossip_rounds += 1
    every_s = cfg.records_interval_s(peer._live)
    records = bool(peer._rpending) and (every_s <= iv or now >= peer._records_due)
    if records:  # the next due a half round early: the rounds' grid has float error
        peer._records_due = now + every_s - iv / 2
    if peer._news and (records or peer._pending or every_s <= iv):
        relay(peer)
    targets = contact_members(peer, cfg.gossip_nodes, gossipable(peer, now), True)
    for m in targets:
        parts = take_piggyback(peer, records)
        if not parts:
            break
        peer._send(m.addr, Compound(tuple(parts)))
    if peer._pending or peer._rpending:
        after = after_round(peer._next_gossip, peer._gossip_phase, iv, now)
        if not peer._pending and after < peer._records_due:
            after = next_round_at(peer._gossip_phase, iv, peer._records_due)
        peer._next_gossip = after
    else:
        peer._next_gossip = None


def random_members(
    peer: Peer, k: int, pred: Callable[[Member], bool], alive_pass: bool = False
) -> list[Member]:
    """Up to ``k`` distinct random members for which ``pred`` holds. ``alive_pass``: every
    alive member does (it is then asked only about the others: this runs every round)."""
    others = peer._others
    n = len(others)
    if n == 0 or k <= 0:
        return []
    picked: dict[str, Member] = {}
    rnd = peer._rng.random
    alive = _A if alive_pass else None
    for _ in range(3 * k + 8):
        m = others[int(rnd() * n)]
        if m.node not in picked and (m.state is alive or pred(m)):
            picked[m.node] = m
            if len(picked) >= k:
                return list(picked.values())
    pool = [m for m in others if m.node not in picked and pred(m)]
    need = k - len(picked)
    extra = pool if len(pool) <= need else peer._rng.sample(pool, need)
    return list(picked.values()) + extra
