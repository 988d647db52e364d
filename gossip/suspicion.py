"""A suspicion timer whose timeout shrinks with independent confirmations (memberlist's
``suspicion.go``; Lifeguard's dynamic suspicion), with a last look before it runs out.

With ``k`` expected confirmations and ``n`` received, the timeout is
``max - log(n + 1) / log(k + 1) * (max - min)``, floored at ``min`` (millisecond resolution).

``lead_s`` before the timeout, the core pings the suspect over the reliable channel with the
accusation (see ``Peer``); the suspicion ends in a death only if that ping stays unanswered until
both the timeout and ``lead_s`` after the ping have passed. The check runs alongside the timeout,
so it costs a truly dead node's detection nothing.

A Dead signed by another member is never enough on its own (one member's word cannot kill a live
node): the core holds it back on the suspicion (``dead``) until :meth:`Suspicion.confirms_dead`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gossip.messages import Dead


def suspicion_timeout_s(n: int, k: int, min_s: float, max_s: float) -> float:
    """Total timeout after ``n`` of ``k`` confirmations."""
    if k < 1:
        return min_s
    frac = math.log(n + 1.0) / math.log(k + 1.0)
    raw = max_s - frac * (max_s - min_s)
    return max(math.floor(1000.0 * raw) / 1000.0, min_s)


@dataclass(slots=True)
class Suspicion:
    """One running suspicion of one member."""

    started_at: float
    k: int
    min_s: float
    max_s: float
    accusers: set[str] = field(default_factory=set)
    n: int = 0
    deadline: float = 0.0
    """When the suspicion times out (shrinks with confirmations)."""
    lead_s: float = 0.0
    """How long before ``deadline`` the last-look ping goes out, and the longest it may take."""
    final_seq: int | None = None
    """Seq of the last-look ping, once sent."""
    final_sent_at: float = 0.0
    final_acked: bool = False
    final_checks: int = 0
    dead: Dead | None = None
    """A Dead by another member held back until the suspicion is confirmed."""

    @classmethod
    def start(
        cls, accuser: str, now: float, k: int, min_s: float, max_s: float, lead_s: float = 0.0
    ) -> Suspicion:
        s = cls(now, k, min_s, max_s, {accuser}, lead_s=lead_s)
        s.deadline = now + suspicion_timeout_s(0, k, min_s, max_s)
        return s

    @property
    def due(self) -> float:
        """When the core must act next: send the last-look ping, or judge its answer."""
        if self.final_seq is None:
            return self.deadline - self.lead_s
        return max(self.deadline, self.final_sent_at + self.lead_s)

    def confirm(self, accuser: str) -> bool:
        """Count an independent accuser; True if it was new and shortened the timeout."""
        if self.n >= self.k or accuser in self.accusers:
            return False
        self.accusers.add(accuser)
        self.n += 1
        self.deadline = self.started_at + suspicion_timeout_s(
            self.n, self.k, self.min_s, self.max_s
        )
        return True

    def confirms_dead(self, accuser: str, now: float) -> bool:
        """Whether a Dead signed by ``accuser`` may be applied: somebody else accuses the suspect
        too, or the suspicion has stood its minimum timeout (the suspect had its chance to
        refute)."""
        accusers = self.accusers
        return len(accusers) > 1 or accuser not in accusers or now - self.started_at >= self.min_s
