"""The gossip core's one configuration object, with LAN-lab defaults and the reason for each.

The reference is memberlist's ``DefaultLANConfig``; where Shoal differs it is because its bars are
tighter (crash detected by all 1,000 nodes in <= 7 s median) and its network is a lab LAN with
sub-millisecond RTTs, where the dominant source of a late ack is a stalled Python event loop, not
the wire. Every duration is in seconds (float) and every size in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GossipConfig:
    """Tunables of one :class:`gossip.peer.Peer`."""

    node_id: str
    """This node's id (the hash of its public key for real nodes); must equal the Signer's."""

    addr: str
    """Where peers reach this node, as the transport spells it (``"host:port"``)."""

    boot_incarnation: int
    """Starting incarnation: above every one this node used in an earlier life, so a restarted
    node's first Alive and records outrank every report about its previous lives. The asyncio
    adapter takes ``max(highest kept + 1, boot time in whole seconds)`` from the node's kept
    incarnation (:mod:`gossip.incarnation`), which each refutation's raise is written to
    before use: the boot time alone fails a restart within the same second, after refutations
    raised the last life past the clock, or under a clock stepped back."""

    probe_interval_s: float = 0.5
    """One failure-detection probe per interval. memberlist uses 1 s; half that halves the time to
    the first failed probe of a crashed node, at ~200 B/s per node (a ping and an ack)."""

    probe_timeout_s: float = 0.25
    """Wait this long for a direct ack before asking ``indirect_checks`` peers. LAN RTT is < 1 ms;
    the budget is for a busy event loop. A late direct ack still counts until the interval ends."""

    reliable_probe_wait_s: float = 0.85
    """When the direct ack is late, also ping the target over the reliable channel (memberlist's
    TCP fallback; in the asyncio adapter every send is HTTPS over TCP already) and wait this long
    for its ack before suspecting. A lossy path then delays the ack instead of losing it: 0.85 s
    covers the RTT plus two TCP retransmits at Linux's 200 ms minimum RTO (0.2 + 0.4 s). At 10%
    loss this turns ~0.8% of probes into false suspicions into ~0.002%. The same window is the
    lead of the last-look ping before a suspicion times out. 0 disables both."""

    accusation_lead_max: int = 3600
    """An accusation (a Suspect, or a Dead by another member) about a life of a node further
    ahead of the one held here (for ourselves: our own) than this is refused and counted
    (``rejected_ahead``): nobody can know a life that far beyond what the node itself said. An
    honest accuser is a few refutations ahead at most, and an hour covers a restart under a
    clock that far behind; without a bound, one member's accusation at the wire's last
    incarnation left a live node no incarnation to refute with, and it was declared dead."""

    indirect_checks: int = 3
    """Peers asked to probe on our behalf (SWIM's k; memberlist's default)."""

    probe_rings: int = 4
    """Probe and gossip over this many pseudo-random rings of the members (see
    :mod:`gossip.rings`): a member probes its next member on each ring in turn and gossips to
    its ring neighbours, so it talks to at most ``2 * probe_rings`` members every few seconds,
    whatever N is, and the transport keeps one stream to each instead of opening a TLS
    handshake for most probes past its stream bound. Each member is still probed about once an
    interval (by one observer per ring in turn). 0: SWIM's own order (every member in turn,
    gossip to random members)."""

    suspicion_mult: int = 3
    """Minimum suspicion timeout = mult * log10(N) * probe_interval (4.5 s at N=1,000, 2.3 s at
    N=32). memberlist uses 4 at 1 s; 3 at 0.5 s is what the 7 s detection bar leaves room for."""

    suspicion_max_timeout_mult: int = 4
    """A suspicion nobody confirms lasts max = mult * min (18 s at N=1,000): a false suspicion of a
    live but slow node has that long to be refuted. Lifeguard's dynamic timeout."""

    suspicion_confirmations: int = 3
    """Independent accusers needed to shrink the timeout to its minimum (memberlist's
    ``suspicion_mult - 2``, made its own knob)."""

    awareness_max_multiplier: int = 8
    """Lifeguard local health: probe timeouts scale by up to this factor while we look unhealthy."""

    loop_lag_threshold_s: float = 0.1
    """An event-loop lag report above this counts as a health strike (awareness +1)."""

    start_health_score: int = 0
    """Lifeguard local health at boot (capped at ``awareness_max_multiplier - 1``). Above 0 a
    node starts doubting itself (its probe timeouts and interval scaled by ``score + 1``) until
    its probes succeed, each success taking one off: a process that starts with many others on
    busy cores accuses nobody for being slow while it is itself still catching up. 0 here (the
    simulator starts warm); the asyncio adapter starts real processes at the top."""

    gossip_interval_s: float = 0.2
    """Gossip round period (memberlist LAN default). Rounds only run while there is news."""

    gossip_nodes: int = 3
    """Fan-out per gossip round (memberlist LAN default)."""

    gossip_to_the_dead_s: float = 30.0
    """Keep gossiping to a dead node this long, so it learns it was declared dead and refutes."""

    retransmit_mult: int = 4
    """Each node sends an update max(retransmit_min, retransmit_mult * ceil(log10(N + 1))) times
    (memberlist's formula: 16 at 1,000 nodes)."""

    retransmit_min: int = 12
    """Floor of the retransmit count. With memberlist's bare formula a 97-node cluster sends each
    update only 8 times per node and one node in ~10^4 misses it (a Poisson tail), which showed up
    as 20 s dissemination stragglers and missed refutations at 10% loss. 12 closes that tail at
    small N without a third more gossip at 1,000 nodes that a larger multiplier would cost."""

    records_retransmit_min: int | None = None
    """The floor of the retransmit count for application records; ``None``: ``retransmit_min``.
    The real transport sets 0 (memberlist's bare formula, 8 sends per node below 100 nodes): its
    messages ride reliable streams rather than lossy datagrams, a missed record is repaired by the
    next push-pull, and records are most of a busy mesh's bytes (each copy past the first is
    received, decoded and dropped by every member). Membership keeps the floor: a refutation
    must not be missed."""

    records_spaced: bool = False
    """Past 16 live members, application records ride a gossip round only every
    :meth:`records_interval_s` (membership updates still go every round). Under a steady load
    there is always a record queued, so a member otherwise sends ``gossip_nodes`` messages every
    round whatever the mesh's size, and a message costs its receiver far more than a record in
    it (reading, decoding, dispatching): spacing the rounds packs more records into fewer
    messages. The real transport sets it; the simulator keeps every round."""

    relay_successors: int = 1
    """Each update this node applies first-hand (its own changes too) also goes, once, to the
    next this many alive members after it in node-id order, over the reliable channel, at the
    next gossip round (see :mod:`gossip.relay`). Random gossip alone misses one member in
    ``e ** limit`` per update (at 999 members, 12 sends: ~1% of updates, each then left to
    push-pull for 15-20 s); with the relay a member misses an update only if its ring
    predecessor missed it too. One message per update per successor. 0 disables it."""

    membership_budget_bytes: int = 1024
    """Bytes of membership updates piggybacked per message (alive/suspect/dead)."""

    records_budget_bytes: int = 1024
    """Separate bytes for application records per message, so records never starve membership."""

    push_pull_interval_s: float = 10.0
    """Anti-entropy: full digest exchange with one random peer. Scaled up with N as memberlist does
    (x ceil(log2(N) - log2(32)) + 1 above 32 nodes) so its cost per node stays bounded."""

    catch_up_push_pull_s: float = 1.5
    """The first push-pull comes this long after boot (jittered up to twice it), then every
    scaled interval: what gossip sent while this node was still starting (before peers could
    reach it) is caught up in seconds, not at the first regular exchange. A node that has found
    no live member yet retries its seeds at this pace too (they may still be starting)."""

    catch_up_window_s: float = 30.0
    """For this long after boot, push-pull at the catch-up pace: when a whole mesh starts at once
    on busy machines, gossip to members still starting is lost, and only push-pull repairs it.
    A warm start (a preloaded full view) skips it."""

    catch_up_quiet_exchanges: int = 2
    """The catch-up pace ends early after this many push-pulls in a row found both sides' views
    the same (nothing missing either way): once random peers agree with this node there is
    nothing left to repair, and a catch-up exchange of a 32-member view costs every member more
    than its probes do. 0: never early."""

    reconnect_interval_s: float = 2.0
    """Every interval, ping one random dead (not left) member; if it answers, push-pull with it.
    This is what heals a partition in seconds (serf's reconnect, on a LAN-lab clock)."""

    tombstone_s: float = 300.0
    """Dead and left members are remembered this long so stale alives cannot resurrect them."""

    max_record_payload_bytes: int = 4096
    """Bounded record size: a telemetry or inventory record larger than this is rejected."""

    max_message_bytes: int = 1 << 20
    """Largest encoded message (push-pull digests of 1,000 nodes are ~40 KB)."""

    max_updates_per_message: int = 4096
    """Upper bound of entries in a compound message or a digest."""

    def retransmit_limit(self, n_nodes: int) -> int:
        """How many times this node sends one update (memberlist's ``retransmitLimit``)."""
        return max(self.retransmit_min, self._sends_at(n_nodes))

    def records_retransmit_limit(self, n_nodes: int) -> int:
        """How many times this node sends one record (see ``records_retransmit_min``)."""
        floor = self.records_retransmit_min
        return max(1, self.retransmit_min if floor is None else floor, self._sends_at(n_nodes))

    def records_interval_s(self, n_nodes: int) -> float:
        """How often records ride a gossip round at cluster size ``n_nodes``: every round up to
        16 members; past that, when ``records_spaced``, ``log2(N / 8)`` rounds apart (0.6 s at
        64, 0.8 s at 128, 2 s at 10,000, with 0.2 s rounds)."""
        if not self.records_spaced or n_nodes <= 16:
            return self.gossip_interval_s
        return self.gossip_interval_s * math.log2(n_nodes / 8)

    def _sends_at(self, n_nodes: int) -> int:
        """memberlist's formula: ``retransmit_mult * ceil(log10(N + 1))``."""
        return self.retransmit_mult * math.ceil(math.log10(n_nodes + 1))

    def suspicion_min_s(self, n_nodes: int) -> float:
        """Lower bound of a suspicion timeout at cluster size ``n_nodes``."""
        scale = max(1.0, math.log10(max(1.0, float(n_nodes))))
        return self.suspicion_mult * scale * self.probe_interval_s

    def push_pull_scaled_s(self, n_nodes: int) -> float:
        """Push-pull period at cluster size ``n_nodes`` (memberlist's ``pushPullScale``)."""
        if n_nodes <= 32:
            return self.push_pull_interval_s
        mult = math.ceil(math.log2(n_nodes) - math.log2(32)) + 1.0
        return self.push_pull_interval_s * mult
