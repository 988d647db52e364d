"""The membership state table, row by row, through a real core fed signed updates.

The incoming suspect, dead or leave is signed by ``acc2``; a suspect held was accused by ``acc``,
so a Dead about it is independently confirmed (the unconfirmed cases: test_dead_confirm.py).
"""

from __future__ import annotations

import pytest

from gossip.events import MemberDead, MemberJoined, MemberLeft, MemberSuspect, MemberUpdated
from gossip.membership import SELF_TRANSITIONS, TRANSITIONS
from gossip.messages import MemberState, Message
from gossip.peer import Peer
from tests.gossip.helpers import alive, dead, make_peer, suspect

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
HELD = 10
INC = {"lower": 9, "equal": 10, "higher": 11}

# (state held, incoming kind, incarnation order) -> (state after, incarnation after)
ROWS = [
    (A, "alive", "lower", A, 10),
    (A, "alive", "equal", A, 10),
    (A, "alive", "higher", A, 11),
    (A, "suspect", "lower", A, 10),
    (A, "suspect", "equal", S, 10),
    (A, "suspect", "higher", S, 11),
    (A, "dead", "lower", A, 10),
    (A, "dead", "equal", S, 10),  # one member's Dead about a live node: only a suspicion
    (A, "dead", "higher", S, 11),
    (A, "leave", "lower", A, 10),
    (A, "leave", "equal", L, 10),
    (A, "leave", "higher", L, 11),
    (S, "alive", "lower", S, 10),
    (S, "alive", "equal", S, 10),
    (S, "alive", "higher", A, 11),
    (S, "suspect", "lower", S, 10),
    (S, "suspect", "equal", S, 10),
    (S, "suspect", "higher", S, 11),
    (S, "dead", "lower", S, 10),
    (S, "dead", "equal", D, 10),
    (S, "dead", "higher", D, 11),
    (S, "leave", "lower", S, 10),
    (S, "leave", "equal", L, 10),
    (S, "leave", "higher", L, 11),
    (D, "alive", "lower", D, 10),
    (D, "alive", "equal", D, 10),
    (D, "alive", "higher", A, 11),
    (D, "suspect", "lower", D, 10),
    (D, "suspect", "equal", D, 10),
    (D, "suspect", "higher", D, 10),
    (D, "dead", "lower", D, 10),
    (D, "dead", "equal", D, 10),
    (D, "dead", "higher", D, 10),
    (D, "leave", "lower", D, 10),
    (D, "leave", "equal", D, 10),
    (D, "leave", "higher", D, 10),
    (L, "alive", "lower", L, 10),
    (L, "alive", "equal", L, 10),
    (L, "alive", "higher", A, 11),
    (L, "suspect", "lower", L, 10),
    (L, "suspect", "equal", L, 10),
    (L, "suspect", "higher", L, 10),
    (L, "dead", "lower", L, 10),
    (L, "dead", "equal", L, 10),
    (L, "dead", "higher", L, 10),
    (L, "leave", "lower", L, 10),
    (L, "leave", "equal", L, 10),
    (L, "leave", "higher", L, 10),
]


def _peer_holding(state: MemberState) -> Peer:
    p = make_peer()
    p.preload([alive("x", HELD), alive("acc", 1), alive("acc2", 1), alive("acc3", 1)], 0.0)
    if state is S:
        p.receive("acc:1", suspect("x", HELD, "acc"), 1.0)
    elif state is D:
        p.receive("acc3:1", suspect("x", HELD, "acc3"), 1.0)
        p.receive("acc:1", dead("x", HELD, "acc"), 1.0)
    elif state is L:
        p.receive("x:1", dead("x", HELD, "x"), 1.0)
    info = p.member("x")
    assert info is not None and info.state is state and info.incarnation == HELD
    p.events()
    return p


def test_every_row_is_listed() -> None:
    assert len(ROWS) == len(TRANSITIONS) == 48
    assert {(r[0], r[1], r[2]) for r in ROWS} == {(s, k, o.value) for s, k, o in TRANSITIONS}


@pytest.mark.parametrize(("held", "kind", "order", "want_state", "want_inc"), ROWS)
def test_row(
    held: MemberState, kind: str, order: str, want_state: MemberState, want_inc: int
) -> None:
    p = _peer_holding(held)
    inc = INC[order]
    updates: dict[str, Message] = {
        "alive": alive("x", inc),
        "suspect": suspect("x", inc, "acc2"),
        "dead": dead("x", inc, "acc2"),
        "leave": dead("x", inc, "x"),
    }
    update = updates[kind]
    p.receive("acc2:1", update, 2.0)
    info = p.member("x")
    assert info is not None
    assert (info.state, info.incarnation) == (want_state, want_inc)
    events = p.events()
    changed = (want_state, want_inc) != (held, HELD)
    assert bool(events) == changed or (held is S and kind == "suspect")


def test_events_name_the_transition() -> None:
    p = _peer_holding(A)
    p.receive("acc:1", suspect("x", 10, "acc"), 2.0)
    p.receive("acc:1", alive("x", 11), 3.0)
    p.receive("acc2:1", dead("x", 11, "acc2"), 4.0)
    p.receive("acc:1", suspect("x", 11, "acc"), 4.0)
    p.receive("acc:1", alive("x", 12), 5.0)
    p.receive("x:1", dead("x", 12, "x"), 6.0)
    kinds = [type(e) for e in p.events()]
    want = [MemberSuspect, MemberUpdated, MemberSuspect, MemberDead, MemberJoined, MemberLeft]
    assert kinds == want


SELF_ROWS = [
    ("alive", "lower", 100),
    ("alive", "equal", 100),
    ("alive", "higher", 102),
    ("suspect", "lower", 100),
    ("suspect", "equal", 101),
    ("suspect", "higher", 102),
    ("dead", "lower", 100),
    ("dead", "equal", 101),
    ("dead", "higher", 102),
    ("leave", "lower", 100),
    ("leave", "equal", 101),
    ("leave", "higher", 102),
]


def test_every_self_row_is_listed() -> None:
    assert {(k, o) for k, o, _ in SELF_ROWS} == {(k, o.value) for k, o in SELF_TRANSITIONS}


@pytest.mark.parametrize(("kind", "order", "want_inc"), SELF_ROWS)
def test_self_row_refutes(kind: str, order: str, want_inc: int) -> None:
    p = make_peer(boot=100)
    p.preload([alive("acc", 1)], 0.0)
    inc = {"lower": 99, "equal": 100, "higher": 101}[order]
    updates: dict[str, Message] = {
        "alive": alive("me", inc),
        "suspect": suspect("me", inc, "acc"),
        "dead": dead("me", inc, "acc"),
        "leave": dead("me", inc, "me"),
    }
    update = updates[kind]
    p.receive("acc:1", update, 1.0)
    assert p.incarnation == want_inc
    assert p.stats.refutations == (1 if want_inc > 100 else 0)


def test_unknown_member_only_joins_by_alive() -> None:
    p = make_peer()
    p.preload([alive("acc", 1)], 0.0)
    p.receive("acc:1", suspect("y", 5, "acc"), 1.0)
    p.receive("acc:1", dead("y", 5, "acc"), 1.0)
    assert p.member("y") is None
    p.receive("acc:1", alive("y", 5), 1.0)
    info = p.member("y")
    assert info is not None and info.state is A
