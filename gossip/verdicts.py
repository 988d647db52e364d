"""Liveness verdicts of :class:`gossip.peer.Peer`: Alive, Suspect and Dead updates judged by the
state table (:mod:`gossip.membership`), Lifeguard's suspicions and their confirmations, the last
look before a suspicion runs out, refutations of accusations about ourselves, and the reaping of
tombstones.

Functions of the peer's state, which they take as ``peer``; sans-I/O like the peer.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter
from typing import TYPE_CHECKING

from gossip.codec import signing_bytes
from gossip.events import (
    MemberDead,
    MemberJoined,
    MemberLeft,
    MemberSuspect,
    MemberUpdated,
)
from gossip.incarnation import MAX_INCARNATION
from gossip.membership import Member, Outcome, decide
from gossip.messages import (
    Alive,
    Compound,
    Dead,
    MemberState,
    Message,
    Ping,
    Suspect,
    Update,
)
from gossip.probing import is_contact
from gossip.suspicion import Suspicion

if TYPE_CHECKING:
    from gossip.peer import Peer

_ALIVE, _SUSPECT, _DEAD = 0, 1, 2  # broadcast priority classes
# Enum members read once: ``MemberState.ALIVE`` runs ``EnumType.__getattr__`` at every use.
_A, _S, _D, _L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
_IGNORE, _REFUTE, _CONFIRM = Outcome.IGNORE, Outcome.REFUTE, Outcome.CONFIRM
_DEAD_IF_CONFIRMED, _LEAVES = Outcome.DEAD_IF_CONFIRMED, Outcome.LEFT
_LIVE = (_A, _S)
_node_of = attrgetter("node")


def recv_accusation(peer: Peer, src: str, m: Suspect | Dead, now: float, reliable: bool) -> None:
    held = peer._members.get(m.node)
    if held is not None and held.accusation is m and held is not peer._self:
        # the very accusation behind the state we hold: the table ignores it (a dead or
        # left member) or finds nothing to count (its accuser counted when it came)
        peer.stats.duplicates += 1
        return
    if m.node == peer.node_id and m.incarnation < peer._incarnation and not peer._left:
        # a stale accusation: the sender missed our refutation; tell it directly
        peer._send(src, Compound((peer._self.alive,)))
    elif isinstance(m, Suspect):
        on_suspect(peer, m, now)
    else:
        on_dead(peer, m, now)


def accuser_ok(peer: Peer, node: str, accuser: str) -> bool:
    if accuser != peer.node_id and accuser not in peer._members:
        peer.stats.rejected_unknown_origin += 1
        return False
    if peer._trust.is_revoked(accuser):
        peer.stats.rejected_revoked += 1
        return False
    return True


def verify(peer: Peer, signer: str, u: Update) -> bool:
    if peer._trust.verify(signer, signing_bytes(u), u.signature):
        return True
    peer.stats.rejected_signature += 1
    return False


def on_alive(peer: Peer, u: Alive, now: float, broadcast: bool = True) -> None:
    m = peer._members.get(u.node)
    if m is not None and u.incarnation <= m.incarnation and u.node != peer.node_id:
        peer.stats.duplicates += 1  # the table's (any state, alive, lower/equal) rows
        return
    is_self = u.node == peer.node_id
    held = peer._incarnation if is_self else (m.incarnation if m else 0)
    outcome = decide(m.state if m else None, held, u, is_self)
    if outcome is _IGNORE:
        peer.stats.duplicates += 1
        return
    if outcome is _REFUTE:
        if verify(peer, u.node, u):
            refute(peer, u.incarnation, now)
        return
    if peer._trust.is_revoked(u.node):
        peer.stats.rejected_revoked += 1
        return
    if (m is None or m.alive.credential != u.credential) and not peer._trust.admit(
        u.node, u.credential, now
    ):
        peer.stats.rejected_credential += 1
        return
    if not verify(peer, u.node, u):
        return
    peer.stats.updates_applied += 1
    if m is None:
        m = Member(u.node, u.addr, u.incarnation, _A, now, u)
        peer._members[u.node] = m
        peer._digest = peer._by_node = None
        peer._rings.add(u.node)
        peer._other_pos[u.node] = len(peer._others)
        peer._others.append(m)
        peer._live += 1
        peer._insert_probe(u.node)
        peer._emit(MemberJoined(u.node, u.addr, u.incarnation, now))
    else:
        was = m.state
        if was not in _LIVE:
            peer._live += 1
            peer._down.pop(u.node, None)
            if was == _L:
                peer._left_down -= 1
            peer._insert_probe(u.node)
        peer._suspicions.pop(u.node, None)
        m.addr, m.incarnation, m.alive, m.accusation = u.addr, u.incarnation, u, None
        m.state = _A
        peer._dirty.append(m)
        m.state_since = now
        if was in _LIVE:
            peer._emit(MemberUpdated(u.node, u.addr, u.incarnation, now))
        else:
            peer._emit(MemberJoined(u.node, u.addr, u.incarnation, now))
    if broadcast:
        peer._broadcast(u.node, u, _ALIVE, now)


def judge(peer: Peer, u: Suspect | Dead) -> tuple[Member, Outcome] | None:
    """The member an accusation is about and what the state table makes of it; None when it
    does nothing (about us after we left, about a life too far ahead: counted as refused,
    or ignored: counted as a duplicate)."""
    is_self = u.node == peer.node_id
    if is_self and peer._left:
        return None
    m = peer._members.get(u.node)
    held = peer._incarnation if is_self else (m.incarnation if m else 0)
    if m is not None and u.incarnation - held > peer.config.accusation_lead_max:
        peer.stats.rejected_ahead += 1  # a life nobody could know of: a lie
        return None
    outcome = decide(m.state if m else None, held, u, is_self)
    if outcome is _IGNORE or m is None:
        peer.stats.duplicates += 1
        return None
    return m, outcome


def on_suspect(peer: Peer, u: Suspect, now: float, ours: bool = False) -> None:
    judged = judge(peer, u)
    if judged is None:
        return
    m, outcome = judged
    s = peer._suspicions.get(u.node)
    # A new accuser counts while confirmations shorten the timeout, or while a held-back
    # Dead waits for one (then nobody but that Dead's accuser has accused yet).
    counts = s is not None and (s.n < s.k or s.dead is not None) and u.accuser not in s.accusers
    if outcome is _CONFIRM and not counts and u.incarnation <= m.incarnation:
        peer.stats.duplicates += 1
        return
    if not ours and not (accuser_ok(peer, u.node, u.accuser) and verify(peer, u.accuser, u)):
        return
    if outcome is _REFUTE:
        refute(peer, u.incarnation, now)
        return
    peer.stats.updates_applied += 1
    if outcome is _CONFIRM:
        if s is not None and counts:
            s.confirm(u.accuser)
            held = s.dead
            if held is not None and held.incarnation >= u.incarnation:
                peer.stats.dead_confirmed += 1
                apply_dead(peer, m, held, now)
                return
        if u.incarnation > m.incarnation:
            m.incarnation, m.accusation = u.incarnation, u
            peer._dirty.append(m)
            if s is not None:
                s.dead = None  # about an older life
        peer._broadcast(u.node, u, _SUSPECT, now)
        return
    # Outcome.SUSPECT
    if ours:
        peer.stats.suspicions_raised += 1
    start_suspicion(peer, m, u, now)


def start_suspicion(peer: Peer, m: Member, u: Suspect | Dead, now: float) -> Suspicion:
    """Make ``m`` a suspect on ``u``'s accuser's word and spread ``u`` as the accusation."""
    cfg = peer.config
    k = cfg.suspicion_confirmations if peer._live - 2 >= cfg.suspicion_confirmations else 0
    min_s = cfg.suspicion_min_s(peer._live)
    s = peer._suspicions[u.node] = Suspicion.start(
        u.accuser, now, k, min_s, min_s * cfg.suspicion_max_timeout_mult, check_lead_s(peer)
    )
    m.state, m.incarnation, m.accusation, m.state_since = _S, u.incarnation, u, now
    peer._dirty.append(m)
    peer._emit(MemberSuspect(u.node, u.incarnation, u.accuser, now))
    peer._broadcast(u.node, u, _SUSPECT, now)
    # Look for ourselves next: a confirmation if it is gone, and a live one hears the
    # accusation with our ping (the buddy system) and refutes sooner. Only a ring neighbour
    # does (its probes need no new stream): past the rings, every member of a large mesh
    # would open a stream to the suspect at once, on a member already slow.
    if u.accuser != peer.node_id and is_contact(peer, m):
        peer._probe_next(m, now)
    return s


def on_dead(peer: Peer, u: Dead, now: float, ours: bool = False) -> None:
    """A Dead: a graceful leave (signed by the node itself), our own verdict (``ours``: our
    suspicion ran out), or another member's accusation, which alone kills nobody."""
    judged = judge(peer, u)
    if judged is None:
        return
    m, outcome = judged
    s = peer._suspicions.get(u.node) if outcome is _DEAD_IF_CONFIRMED else None
    if s is not None and not ours:
        held = s.dead
        if held is not None and held.accuser == u.accuser and u.incarnation <= held.incarnation:
            peer.stats.duplicates += 1  # held back already
            return
    if not ours and not (accuser_ok(peer, u.node, u.accuser) and verify(peer, u.accuser, u)):
        return
    if outcome is _REFUTE:
        refute(peer, u.incarnation, now)
        return
    if ours or outcome is _LEAVES or (s is not None and s.confirms_dead(u.accuser, now)):
        apply_dead(peer, m, u, now, ours)
        return
    defer_dead(peer, m, s, u, now)


def defer_dead(peer: Peer, m: Member, s: Suspicion | None, u: Dead, now: float) -> None:
    """Hold back another member's unconfirmed Dead: about a live node it starts a suspicion
    on that accuser's word; either way the Dead travels on as that accuser's accusation (so
    the accused hears it and refutes) and waits on the suspicion for a second accuser."""
    peer.stats.dead_deferred += 1
    peer.stats.updates_applied += 1
    if s is None:
        s = start_suspicion(peer, m, u, now)
    else:
        if u.incarnation > m.incarnation:
            m.incarnation, m.accusation = u.incarnation, u
            peer._dirty.append(m)
        peer._broadcast(u.node, u, _SUSPECT, now)
    s.dead = u


def apply_dead(peer: Peer, m: Member, u: Dead, now: float, ours: bool = False) -> None:
    left = u.accuser == u.node
    peer.stats.updates_applied += 1
    peer._suspicions.pop(u.node, None)
    if m.state in _LIVE:
        peer._live -= 1
        peer._down[u.node] = None
        if left:
            peer._left_down += 1
    m.state = _L if left else _D
    peer._dirty.append(m)
    m.incarnation, m.accusation, m.state_since = u.incarnation, u, now
    peer._vivaldi.forget(u.node)
    if left:
        peer._emit(MemberLeft(u.node, u.incarnation, now))
    else:
        if ours:
            peer.stats.deaths_declared += 1
        peer._emit(MemberDead(u.node, u.incarnation, u.accuser, now))
    peer._broadcast(u.node, u, _DEAD, now)


def check_lead_s(peer: Peer) -> float:
    wait = peer.config.reliable_probe_wait_s
    return wait if wait > 0.0 else peer._awareness.scale(peer.config.probe_timeout_s)


def suspicion_expired(peer: Peer, node: str, now: float) -> None:
    s = peer._suspicions.get(node)
    m = peer._members.get(node)
    if s is None or m is None or m.state != _S:
        peer._suspicions.pop(node, None)
        return
    if s.final_seq is not None and s.final_acked and s.final_checks < 3:
        # It answered but no refutation reached us: look again one probe interval on.
        s.final_seq = None
        s.deadline = max(s.deadline, now + check_lead_s(peer) + peer.config.probe_interval_s)
        return
    if s.final_seq is None:
        # Last look before the timeout: ping it, accusation first, over the reliable channel.
        # A live node refutes and its ack carries the new Alive (piggyback picks it first).
        seq = peer._next_seq()
        s.final_seq, s.final_acked, s.final_sent_at = seq, False, now
        s.final_checks += 1
        parts: list[Message] = [Ping(seq, peer.node_id, node)]
        if m.accusation is not None:
            parts.insert(0, m.accusation)
        msg = Compound(tuple(parts))
        peer.stats.messages_out += 1
        if peer.config.reliable_probe_wait_s > 0.0:
            peer._out_reliable.append((m.addr, msg))
        else:
            peer._out.append((m.addr, msg))
        return
    peer._suspicions.pop(node, None)
    on_dead(peer, peer._sign_dead(node, m.incarnation), now, ours=True)


def refute(peer: Peer, incarnation: int, now: float) -> None:
    """Raise our incarnation past ``incarnation`` and say so. At the last incarnation a
    message may carry no life can follow, and ours stays one every member can decode: a lie
    made there with our key (only our key can sign it) is counted as refused instead."""
    if incarnation >= MAX_INCARNATION:
        peer.stats.rejected_ahead += 1
        return
    peer._incarnation = max(peer._incarnation, incarnation) + 1
    keep = peer._on_incarnation  # kept before the Alive that carries it
    if keep is not None and not keep(peer._incarnation):
        peer.stats.incarnations_unkept += 1
    peer.stats.refutations += 1
    peer._awareness.apply_delta(1)
    alive = peer._signed_alive()
    peer._self.incarnation, peer._self.alive = peer._incarnation, alive
    peer._dirty.append(peer._self)
    peer._broadcast(peer.node_id, alive, _ALIVE, now)


def reap(peer: Peer, now: float) -> None:
    if len(peer._dirty) > len(peer._members):  # nobody asked for a digest in a long while
        peer._by_node = None
        peer._dirty.clear()
    horizon = peer.config.tombstone_s
    expired = []
    for node in peer._down:  # in the order they went down: the oldest first
        if now - peer._members[node].state_since < horizon:
            break
        expired.append(node)
    by_node = peer._by_node
    for node in expired:
        del peer._down[node]
        if peer._members.pop(node).state == _L:
            peer._left_down -= 1
        if by_node is not None:  # its digest line goes, the others keep their order
            i = bisect_left(by_node, node, key=_node_of)
            del by_node[i], peer._rows[i]
            peer._digest = None
        pos = peer._other_pos.pop(node)
        last = peer._others.pop()
        if last.node != node:
            peer._others[pos] = last
            peer._other_pos[last.node] = pos
        peer._records.drop_origin(node)
        peer._vivaldi.drop(node)
        peer._queue.drop(node)
        peer._rings.remove(node)
    if expired:
        peer._contacts = None
