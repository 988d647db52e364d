"""Push-pull anti-entropy of :class:`gossip.peer.Peer`: the member and record digests, the
three-phase exchange that repairs whatever gossip missed, and the start-up's catch-up pace.

Functions of the peer's state, which they take as ``peer``; sans-I/O like the peer.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

from gossip.membership import Member
from gossip.messages import (
    Alive,
    Dead,
    MemberDigest,
    MemberState,
    PushPull,
    Record,
    RecordDigest,
    Suspect,
    Update,
)
from gossip.probing import contact_members

if TYPE_CHECKING:
    from gossip.peer import Peer

# Enum members read once: ``MemberState.ALIVE`` runs ``EnumType.__getattr__`` at every use.
_A, _S, _D, _L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
_RANK = {_A: 0, _S: 1, _D: 2, _L: 2}
_LIVE = (_A, _S)
_node_of = attrgetter("node")


def recv_push_pull(peer: Peer, src: str, m: PushPull, now: float, reliable: bool) -> None:
    on_push_pull(peer, src, m, now)


def member_digest(peer: Peer) -> tuple[MemberDigest, ...]:
    """Sorted by node. Built in full after a join (the order changed); otherwise a reap
    drops its line and only the lines of the members changed since are replaced (each
    member keeps its line until its incarnation or state changes)."""
    by_node, dirty = peer._by_node, peer._dirty
    if by_node is None or len(dirty) > len(by_node) // 8:
        if by_node is None:
            by_node = peer._by_node = sorted(peer._members.values(), key=_node_of)
        peer._rows = [m.digest() for m in by_node]
        peer._digest = None
        dirty.clear()
    elif dirty:
        rows = peer._rows
        for m in dirty:
            i = bisect_left(by_node, m.node, key=_node_of)
            if i < len(by_node) and by_node[i] is m:  # else reaped since
                rows[i] = m.digest()
        peer._digest = None
        dirty.clear()
    if peer._digest is None:
        peer._digest = tuple(peer._rows)
    return peer._digest


def push_pull(peer: Peer, phase: int, updates: tuple[Update, ...]) -> PushPull:
    return PushPull(
        peer.node_id,
        phase,
        member_digest(peer),
        tuple(peer._records.digest()),
        updates,
    )


def start_push_pull(peer: Peer, catching_up: bool = False) -> None:
    """Push-pull with a random alive member; while ``catching_up`` (the start-up's pace), with
    a ring neighbour: its stream is open already, so a mesh starting at once does not open a
    TLS handshake to a random member every few seconds per member (the neighbours' digests
    still reach the whole mesh: the rings are connected)."""
    if peer._left:
        return
    peer._seed_turn = not peer._seed_turn
    if peer._seed_turn:
        seed = unmet_seed(peer)
        if seed is not None:
            peer.stats.push_pulls += 1
            peer._send(seed, push_pull(peer, 0, (peer._self.alive,)))
            return
    if catching_up:
        picks = contact_members(peer, 1, lambda m: m.state == _A, True)
    else:
        picks = peer._random_members(1, lambda m: m.state == _A, True)
    if picks:
        peer.stats.push_pulls += 1
        peer._send(picks[0].addr, push_pull(peer, 0, ()))
    elif peer._seeds:
        seed = peer._seeds[int(peer._rng.random() * len(peer._seeds))]
        if seed != peer.config.addr:
            peer._send(seed, push_pull(peer, 0, (peer._self.alive,)))


def unmet_seed(peer: Peer) -> str | None:
    """A seed no live member of our view sits at, drawn at random; None when every seed is met.

    Every other push-pull goes to one while any is left: agents started together whose joins
    each reached only another newcomer (a busy seed, or a seed list naming each other) formed
    an island that knew nobody of the mesh, and nothing else ever sent it there. A seed address
    no member advertises (a name where members give addresses, an agent gone for good) keeps
    getting every other push-pull: one exchange per interval, the price of never being cut off.
    """
    if not peer._seeds:
        return None
    me = peer.config.addr
    met = {m.addr for m in peer._members.values() if m.state in _LIVE}
    unmet = [s for s in peer._seeds if s != me and s not in met]
    if not unmet:
        return None
    return unmet[int(peer._rng.random() * len(unmet))]


def full_updates(peer: Peer, m: Member) -> list[Update]:
    out: list[Update] = [m.alive]
    if m.accusation is not None:
        out.append(m.accusation)
    return out


def missing_for(
    peer: Peer, members: Sequence[MemberDigest], records: Sequence[RecordDigest]
) -> tuple[Update, ...]:
    """Full updates the holder of these digests lacks or holds older than we do."""
    out: list[Update] = []
    same = tuple(members) == member_digest(peer)
    theirs = {} if same else {d.node: d for d in members}
    for m in () if same else peer._members.values():
        d = theirs.get(m.node)
        if d is None:
            if m.state in _LIVE or m.state == _L:
                out.extend(full_updates(peer, m))
        elif (m.incarnation, _RANK[m.state]) > (d.incarnation, _RANK[d.state]):
            out.extend(full_updates(peer, m))
    ours = peer._records.digest()
    if len(records) == len(ours) and set(records) == set(ours):
        return tuple(out)  # the same records at the same versions
    rtheirs = {(d.origin, d.kind): (d.incarnation, d.counter) for d in records}
    for s in peer._records:
        r = s.record
        v = rtheirs.get((r.origin, r.kind))
        if v is None or r.version > v:
            out.append(r)
    return tuple(out)


def merge(peer: Peer, updates: Sequence[Update], now: float) -> None:
    for u in updates:  # alives first so that accusations and records find their member
        if isinstance(u, Alive):
            peer._on_alive(u, now)
    for u in updates:
        if isinstance(u, Suspect):
            peer._on_suspect(u, now)
        elif isinstance(u, Dead):
            peer._on_dead(u, now)
        elif isinstance(u, Record):
            peer._on_record(u, now)


def on_push_pull(peer: Peer, src: str, m: PushPull, now: float) -> None:
    merge(peer, m.updates, now)
    if m.phase == 0:
        reply = push_pull(peer, 1, missing_for(peer, m.members, m.records))
        peer._send(src, reply)
    elif m.phase == 1:
        missing = missing_for(peer, m.members, m.records)
        if missing:
            peer._send(src, PushPull(peer.node_id, 2, (), (), missing))
        caught_up(peer, quiet=not m.updates and not missing, now=now)


def caught_up(peer: Peer, quiet: bool, now: float) -> None:
    """End the start-up's catch-up pace early once push-pulls keep finding nothing to repair:
    ``catch_up_quiet_exchanges`` in a row with both views the same."""
    enough = peer.config.catch_up_quiet_exchanges
    if not enough or now >= peer._catch_up_until:
        return
    peer._quiet_exchanges = peer._quiet_exchanges + 1 if quiet else 0
    if peer._quiet_exchanges >= enough:
        peer._catch_up_until = now
        peer._next_push_pull = now + peer._rng.random() * push_pull_every_s(peer)


def push_pull_every_s(peer: Peer) -> float:
    """The regular push-pull interval, scaled to the mesh: its live members, or a quarter
    of every member it knows when that is more."""
    return peer.config.push_pull_scaled_s(max(peer._live, len(peer._others) // 4))
