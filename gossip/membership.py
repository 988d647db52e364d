"""The membership state machine as one table, and the per-member row the core keeps.

``TRANSITIONS[(current state, incoming kind, incarnation order)]`` says what an update about
*another* node does; ``SELF_TRANSITIONS[(incoming kind, order)]`` what an update about *ourselves*
does. Incarnation order compares the update's incarnation with the one we hold. Rules follow SWIM
and memberlist (``aliveNode``/``suspectNode``/``deadNode``), with tombstones: a dead or left member
ignores everything but an Alive with a higher incarnation (a restart or a refutation).
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
    DEAD = "dead"  # declared dead (or left, when the accuser is the node itself)
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
    (A, "dead", EQ): Outcome.DEAD,
    (A, "dead", HI): Outcome.DEAD,
    # suspect
    (S, "alive", LO): Outcome.IGNORE,
    (S, "alive", EQ): Outcome.IGNORE,
    (S, "alive", HI): Outcome.ALIVE,
    (S, "suspect", LO): Outcome.IGNORE,
    (S, "suspect", EQ): Outcome.CONFIRM,
    (S, "suspect", HI): Outcome.CONFIRM,
    (S, "dead", LO): Outcome.IGNORE,
    (S, "dead", EQ): Outcome.DEAD,
    (S, "dead", HI): Outcome.DEAD,
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
}


def kind_of(update: Alive | Suspect | Dead) -> str:
    if isinstance(update, Alive):
        return "alive"
    return "suspect" if isinstance(update, Suspect) else "dead"


def decide(
    state: MemberState | None, held_incarnation: int, update: Alive | Suspect | Dead, is_self: bool
) -> Outcome:
    """What ``update`` does to a member we hold in ``state`` (None: unknown)."""
    kind = kind_of(update)
    if is_self:
        return SELF_TRANSITIONS[(kind, order(update.incarnation, held_incarnation))]
    if state is None:
        return Outcome.ALIVE if kind == "alive" else Outcome.IGNORE
    return TRANSITIONS[(state, kind, order(update.incarnation, held_incarnation))]


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

    def digest(self) -> MemberDigest:
        """This member's push-pull digest line, reused while incarnation and state hold."""
        r = self.row
        if r is None or r.incarnation != self.incarnation or r.state is not self.state:
            r = self.row = MemberDigest(self.node, self.incarnation, self.state)
        return r


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A read-only view of one member for the application."""

    node: str
    addr: str
    incarnation: int
    state: MemberState
    state_since: float
