"""Events the core reports to the application (drained by ``Peer.events()``).

``at`` is the caller's clock (the ``now`` passed to the call that produced the event).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MemberJoined:
    """A node became a member (first seen, or back from dead/left with a newer incarnation)."""

    node: str
    addr: str
    incarnation: int
    at: float


@dataclass(frozen=True, slots=True)
class MemberUpdated:
    """A member refuted a suspicion, or changed address, at a newer incarnation."""

    node: str
    addr: str
    incarnation: int
    at: float


@dataclass(frozen=True, slots=True)
class MemberSuspect:
    """A member became suspect (not yet dead: it may still refute)."""

    node: str
    incarnation: int
    accuser: str
    at: float


@dataclass(frozen=True, slots=True)
class MemberDead:
    """A member was declared dead (its suspicion timed out here or a Dead arrived)."""

    node: str
    incarnation: int
    accuser: str
    at: float


@dataclass(frozen=True, slots=True)
class MemberLeft:
    """A member left gracefully."""

    node: str
    incarnation: int
    at: float


@dataclass(frozen=True, slots=True)
class RecordChanged:
    """A newer version of ``(origin, kind)`` was accepted (or published by us)."""

    origin: str
    kind: str
    incarnation: int
    counter: int
    payload: bytes
    at: float


Event = MemberJoined | MemberUpdated | MemberSuspect | MemberDead | MemberLeft | RecordChanged
