"""The membership state machine as one table, and the per-member row the core keeps.

``TRANSITIONS[(current state, incoming kind, incarnation order)]`` says what an update about
*another* node does; ``SELF_TRANSITIONS[(incoming kind, order)]`` what an update about *ourselves*
does. Incarnation order compares the update's incarnation with the one we hold. Rules follow SWIM
and memberlist (``aliveNode``/``suspectNode``/``deadNode``), with tombstones: a dead or left member
ignores everything but an Alive with a higher incarnation (a restart or a refutation).

The kinds are ``alive``, ``suspect``, ``dead`` (a Dead signed by another member: an accusation)
and ``leave`` (a Dead signed by the node itself: its graceful goodbye). Unlike memberlist, one
member's word cannot kill a live node (Lifeguard's intent): a Dead about a node we hold alive only
makes it a suspect, on that accuser's word, and one about a suspect is applied only once the
suspicion is confirmed (see :attr:`Outcome.DEAD_IF_CONFIRMED`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gossip.messages import Alive, Dead, MemberDigest, MemberState, Suspect


class Order(Enum):
    LOWER = "lower"
    EQUAL = "equal"
    HIGHER = "higher"


def order(incoming: int, held: int) -> Order:
    if incoming < held:
        return Order.LOWER
    return Order.EQUAL if incoming == held else Order.HIGHER


class Outcome(Enum):
    IGNORE = "ignore"
    ALIVE = "alive"  # become (or stay) alive at the incoming incarnation
    SUSPECT = "suspect"  # become suspect, start a suspicion timer
    CONFIRM = "confirm"  # already suspect: count an independent accuser
    DEAD_IF_CONFIRMED = "dead if confirmed"
    """Dead, if the suspicion already has an accuser other than this Dead's, or has stood its
    minimum timeout (the suspect had its chance to refute); otherwise the Dead is held back as
    its accuser's confirmation and applied when an independent one arrives."""
    LEFT = "left"  # the node's own goodbye
    REFUTE = "refute"  # about us: bump our incarnation and broadcast Alive


A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
LO, EQ, HI = Order.LOWER, Order.EQUAL, Order.HIGHER

TRANSITIONS: dict[tuple[MemberState, str, Order], Outcome] = {
    # alive
    (A, "alive", LO): Outcome.IGNORE,
    (A, "alive", EQ): Outcome.IGNORE,
    (A, "alive", HI): Outcome.ALIVE,
    (A, "suspect", LO): Outcome.IGNORE,
    (A, "suspect", EQ): Outcome.SUSPECT,
    (A, "suspect", HI): Outcome.SUSPECT,
    (A, "dead", LO): Outcome.IGNORE,
    (A, "dead", EQ): Outcome.SUSPECT,  # one member's word: a suspicion, the Dead its accusation
    (A, "dead", HI): Outcome.SUSPECT,
    (A, "leave", LO): Outcome.IGNORE,
    (A, "leave", EQ): Outcome.LEFT,
    (A, "leave", HI): Outcome.LEFT,
    # suspect
    (S, "alive", LO): Outcome.IGNORE,
    (S, "alive", EQ): Outcome.IGNORE,
    (S, "alive", HI): Outcome.ALIVE,
    (S, "suspect", LO): Outcome.IGNORE,
    (S, "suspect", EQ): Outcome.CONFIRM,
    (S, "suspect", HI): Outcome.CONFIRM,
    (S, "dead", LO): Outcome.IGNORE,
    (S, "dead", EQ): Outcome.DEAD_IF_CONFIRMED,
    (S, "dead", HI): Outcome.DEAD_IF_CONFIRMED,
    (S, "leave", LO): Outcome.IGNORE,
    (S, "leave", EQ): Outcome.LEFT,
    (S, "leave", HI): Outcome.LEFT,
    # dead: a tombstone; only a newer life revives it
    (D, "alive", LO): Outcome.IGNORE,
    (D, "alive", EQ): Outcome.IGNORE,
    (D, "alive", HI): Outcome.ALIVE,
    (D, "suspect", LO): Outcome.IGNORE,
    (D, "suspect", EQ): Outcome.IGNORE,
    (D, "suspect", HI): Outcome.IGNORE,
    (D, "dead", LO): Outcome.IGNORE,
    (D, "dead", EQ): Outcome.IGNORE,
    (D, "dead", HI): Outcome.IGNORE,
    (D, "leave", LO): Outcome.IGNORE,
    (D, "leave", EQ): Outcome.IGNORE,
    (D, "leave", HI): Outcome.IGNORE,
    # left: same as dead
    (L, "alive", LO): Outcome.IGNORE,
    (L, "alive", EQ): Outcome.IGNORE,
    (L, "alive", HI): Outcome.ALIVE,
    (L, "suspect", LO): Outcome.IGNORE,
    (L, "suspect", EQ): Outcome.IGNORE,
    (L, "suspect", HI): Outcome.IGNORE,
    (L, "dead", LO): Outcome.IGNORE,
    (L, "dead", EQ): Outcome.IGNORE,
    (L, "dead", HI): Outcome.IGNORE,
    (L, "leave", LO): Outcome.IGNORE,
    (L, "leave", EQ): Outcome.IGNORE,
    (L, "leave", HI): Outcome.IGNORE,
}

SELF_TRANSITIONS: dict[tuple[str, Order], Outcome] = {
    ("alive", LO): Outcome.IGNORE,
    ("alive", EQ): Outcome.IGNORE,  # our own Alive echoed back
    ("alive", HI): Outcome.REFUTE,  # someone claims a newer life of ours: outrank it
    ("suspect", LO): Outcome.IGNORE,
    ("suspect", EQ): Outcome.REFUTE,
    ("suspect", HI): Outcome.REFUTE,
    ("dead", LO): Outcome.IGNORE,
    ("dead", EQ): Outcome.REFUTE,
    ("dead", HI): Outcome.REFUTE,
    ("leave", LO): Outcome.IGNORE,
    ("leave", EQ): Outcome.REFUTE,  # a goodbye of ours we never said: we are here
    ("leave", HI): Outcome.REFUTE,
}


def kind_of(update: Alive | Suspect | Dead) -> str:
    if isinstance(update, Alive):
        return "alive"
    if isinstance(update, Suspect):
        return "suspect"
    return "leave" if update.accuser == update.node else "dead"


_KINDS: dict[type, str] = {Alive: "alive", Suspect: "suspect"}
_Row = tuple[Outcome, Outcome, Outcome]
"""What one kind of update does at a lower, an equal and a higher incarnation."""


def _row(
    table: dict[tuple[MemberState, str, Order], Outcome], state: MemberState, kind: str
) -> _Row:
    return (table[(state, kind, LO)], table[(state, kind, EQ)], table[(state, kind, HI)])


_KIND_NAMES = ("alive", "suspect", "dead", "leave")
_ROWS: dict[tuple[MemberState | None, str], _Row] = {
    (state, kind): _row(TRANSITIONS, state, kind) for state in MemberState for kind in _KIND_NAMES
}
"""``TRANSITIONS`` by (state, kind), the three orders in a tuple: what :func:`decide` reads, as
every update looks one up (hashing an ``Order`` key runs Python code). ``None``: unknown."""
for _kind in _KIND_NAMES:
    _ROWS[(None, _kind)] = ((Outcome.ALIVE if _kind == "alive" else Outcome.IGNORE),) * 3
_SELF_ROWS: dict[str, _Row] = {
    kind: (SELF_TRANSITIONS[(kind, LO)], SELF_TRANSITIONS[(kind, EQ)], SELF_TRANSITIONS[(kind, HI)])
    for kind in _KIND_NAMES
}


def decide(
    state: MemberState | None, held_incarnation: int, update: Alive | Suspect | Dead, is_self: bool
) -> Outcome:
    """What ``update`` does to a member we hold in ``state`` (None: unknown)."""
    kind = _KINDS.get(type(update)) or kind_of(update)
    inc = update.incarnation
    o = 0 if inc < held_incarnation else 1 if inc == held_incarnation else 2
    if is_self:
        return _SELF_ROWS[kind][o]
    return _ROWS[(state, kind)][o]


@dataclass(slots=True)
class Member:
    """What one node holds about another (mutable, owned by the core)."""

    node: str
    addr: str
    incarnation: int
    state: MemberState
    state_since: float
    alive: Alive
    """The latest signed Alive: re-sent in push-pull so others can admit the member too."""
    accusation: Suspect | Dead | None = None
    """The signed Suspect or Dead behind the current state, if any."""
    row: MemberDigest | None = None
    """The last digest line built for this member (rebuilt when it no longer matches)."""
    hinted_at: float = float("-inf")
    """When a hint last moved this member to the front of the probe order."""

    def digest(self) -> MemberDigest:
        """This member's push-pull digest line, reused while incarnation and state hold."""
        r = self.row
        if r is None or r.incarnation != self.incarnation or r.state is not self.state:
            r = self.row = digest_line(self.node, self.incarnation, self.state)
        return r


def digest_line(node: str, incarnation: int, state: MemberState) -> MemberDigest:
    """The shared digest line for these values (see :data:`_LINES`)."""
    line = (node, incarnation, state)
    r = _LINES.get(line)  # a plain tuple finds the equal line
    if r is None:
        if len(_LINES) >= 1 << 18:
            _LINES.clear()
        r = MemberDigest(*line)
        _LINES[r] = r
    return r


_LINES: dict[tuple[str, int, MemberState], MemberDigest] = {}
"""Digest lines shared by every core in the process (the simulator runs a thousand): equal
lines are then one object, so comparing two digests that agree is a row of identity checks."""


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A read-only view of one member for the application."""

    node: str
    addr: str
    incarnation: int
    state: MemberState
    state_since: float
