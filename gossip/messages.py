"""Wire messages of the gossip protocol: frozen dataclasses, one per kind.

Probing (SWIM): :class:`Ping`, :class:`IndirectPingReq`, :class:`Ack`, :class:`Nack`.
Updates (piggybacked and gossiped): :class:`Alive`, :class:`Suspect`, :class:`Dead`,
:class:`Record`. Anti-entropy: :class:`PushPull` carrying :class:`MemberDigest` and
:class:`RecordDigest`. :class:`Compound` bundles a probe message with piggybacked updates.

Every update carries a signature over :func:`gossip.codec.signing_bytes`: an Alive by the node it
describes, a Suspect or Dead by its accuser (a Dead whose accuser is the node itself is a graceful
leave), a Record by its origin.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from gossip.vivaldi import Coordinate


class MemberState(IntEnum):
    """A member's state as one node sees it (the wire value is the int)."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@dataclass(frozen=True, slots=True)
class Ping:
    """Direct probe. ``target`` is the node id the sender means to reach (a different node now at
    that address does not answer)."""

    seq: int
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class IndirectPingReq:
    """Ask the receiver to ping ``target`` at ``target_addr`` for ``source`` and relay the ack;
    with ``nack`` it also answers :class:`Nack` if the target stays silent (Lifeguard)."""

    seq: int
    source: str
    target: str
    target_addr: str
    nack: bool


@dataclass(frozen=True, slots=True)
class Ack:
    """Answer to a ping with the same ``seq``. ``source`` is who sends this ack (the target for a
    direct ack, the relay for an indirect one); ``coordinate`` is the sender's Vivaldi position."""

    seq: int
    source: str
    coordinate: Coordinate | None


@dataclass(frozen=True, slots=True)
class Nack:
    """A relay's "I asked, the target did not answer": tells the prober its own path is fine."""

    seq: int
    source: str


@dataclass(frozen=True, slots=True)
class Alive:
    """``node`` is alive at ``incarnation`` and reachable at ``addr``; ``credential`` is what
    ``Trust.admit`` checks (a DER certificate); signed by ``node`` itself."""

    node: str
    incarnation: int
    addr: str
    credential: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class Suspect:
    """``accuser`` suspects ``node`` at ``incarnation``; signed by ``accuser``."""

    node: str
    incarnation: int
    accuser: str
    signature: bytes


@dataclass(frozen=True, slots=True)
class Dead:
    """``accuser`` declares ``node`` dead at ``incarnation``; signed by ``accuser``. When the
    accuser is the node itself, the node has left gracefully."""

    node: str
    incarnation: int
    accuser: str
    signature: bytes


@dataclass(frozen=True, slots=True)
class Record:
    """Application state of kind ``kind`` published by ``origin``, version
    ``(incarnation, counter)``; ``payload`` is opaque to gossip; signed by ``origin``."""

    origin: str
    kind: str
    incarnation: int
    counter: int
    payload: bytes
    signature: bytes

    @property
    def version(self) -> tuple[int, int]:
        return (self.incarnation, self.counter)


class MemberDigest(NamedTuple):
    """One line of a push-pull member digest (a tuple: digests are compared wholesale)."""

    node: str
    incarnation: int
    state: MemberState


class RecordDigest(NamedTuple):
    """One line of a push-pull record digest (a tuple: digests are compared wholesale)."""

    origin: str
    kind: str
    incarnation: int
    counter: int


@dataclass(frozen=True, slots=True)
class PushPull:
    """Anti-entropy exchange. ``phase`` 0: the initiator's digests; 1: the responder's digests plus
    the full updates the initiator lacks; 2: the initiator's full updates the responder lacks."""

    source: str
    phase: int
    members: tuple[MemberDigest, ...]
    records: tuple[RecordDigest, ...]
    updates: tuple[Update, ...]


@dataclass(frozen=True, slots=True)
class Compound:
    """Several messages in one datagram: a probe message first, then piggybacked updates."""

    parts: tuple[Message, ...]


Update = Alive | Suspect | Dead | Record
"""What the broadcast queue disseminates and push-pull sends in full."""

Message = (
    Ping | IndirectPingReq | Ack | Nack | Alive | Suspect | Dead | Record | PushPull | Compound
)
"""Anything :mod:`gossip.codec` encodes."""
