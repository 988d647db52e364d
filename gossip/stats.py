"""Named counters of one core (plain ints; the agent exports them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gossip.messages import (
    Ack,
    Alive,
    Compound,
    Dead,
    IndirectPingReq,
    Message,
    Nack,
    Ping,
    PushPull,
    Record,
    Suspect,
)


@dataclass(slots=True)
class GossipStats:
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    """Counted by whoever encodes (the transport or the simulator) through ``Peer.count_bytes``."""
    bytes_out: int = 0
    updates_applied: int = 0
    duplicates: int = 0
    """Updates we already held (normal gossip redundancy, not an attack)."""
    rejected_signature: int = 0
    rejected_replay: int = 0
    """Older version, or same version with different content."""
    records_retired: int = 0
    """Records the application retired (an ended job's, long after it ended)."""
    retired_refused: int = 0
    """Copies of retired records that came back (a member that has not retired them yet)."""
    rejected_oversize: int = 0
    rejected_revoked: int = 0
    rejected_unknown_origin: int = 0
    rejected_malformed: int = 0
    rejected_ahead: int = 0
    """Accusations about a life further ahead than ``accusation_lead_max`` (a lie)."""
    rejected_credential: int = 0
    """Alive whose credential ``Trust.admit`` refused: the node is not admitted."""
    probes_sent: int = 0
    probes_failed: int = 0
    """Probes with no ack by datagram (direct or indirect) within the probe interval."""
    probes_rescued: int = 0
    """Of those, probes the reliable fallback ping still got an answer to (no suspicion)."""
    probes_hinted: int = 0
    """Members moved to the front of the probe order: their connection ended without this
    member closing it, or could not be opened, or another member suspects them."""
    indirect_probes: int = 0
    reliable_probes: int = 0
    """Fallback pings sent over the reliable channel after a late direct ack."""
    nacks_received: int = 0
    refutations: int = 0
    records_refuted: int = 0
    """Records in our name at a version we never reached, outrun
    (:func:`gossip.spreading.refute_record`)."""
    incarnations_unkept: int = 0
    """Refutations whose raised incarnation could not be written where the node keeps it
    (:mod:`gossip.incarnation`): a restart soon after may start below it."""
    suspicions_raised: int = 0
    deaths_declared: int = 0
    dead_deferred: int = 0
    """Deads by another member held back: about a live node (it became a suspect on that
    accuser's word) or a suspect nobody else accused yet. One member cannot kill a node."""
    dead_confirmed: int = 0
    """Held-back Deads applied later, when an independent accuser confirmed them."""
    neighbourhoods: int = 0
    """Times the ring neighbours were found again (a neighbour went down, a member joined)."""
    push_pulls: int = 0
    relayed: int = 0
    """Updates passed to ring successors (one count per update per successor)."""
    relay_skipped: int = 0
    """Updates left out of a round's relay by its byte budget (random gossip still sends them)."""
    gossip_rounds: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


KINDS: dict[type, str] = {
    Ping: "ping",
    Ack: "ack",
    IndirectPingReq: "indirect",
    Nack: "nack",
    PushPull: "push_pull",
    Alive: "gossip",
    Suspect: "gossip",
    Dead: "gossip",
    Record: "gossip",
}
"""A message's kind, for its counts and CPU: a compound is the kind of its first part (a ping
or ack with updates piggybacked is a ping or an ack; a gossip round's updates are gossip)."""


def kind_of(message: Message) -> str:
    m = message.parts[0] if isinstance(message, Compound) and message.parts else message
    return KINDS.get(type(m), "other")


@dataclass(slots=True)
class MessageCosts:
    """Messages received by kind, and the CPU each kind took to handle and answer (counted by
    the transport around the core's ``receive`` and the sends it made)."""

    counts: dict[str, int] = field(default_factory=dict)
    cpu_ns: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, cpu_ns: int) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.cpu_ns[kind] = self.cpu_ns.get(kind, 0) + cpu_ns

    def snapshot(self) -> dict[str, int]:
        out = {f"messages_in_{k}": n for k, n in self.counts.items()}
        out.update({f"cpu_us_{k}": ns // 1000 for k, ns in self.cpu_ns.items()})
        return out
