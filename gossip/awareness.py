"""Lifeguard local health (memberlist's ``awareness.go``).

A score in ``[0, max_multiplier - 1]``: raised by missed nacks, by having to refute a suspicion of
ourselves and by event-loop lag; lowered by every successful probe. Timeouts scale by
``score + 1``, so a node that is itself slow waits longer before accusing others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Awareness:
    max_multiplier: int
    score: int = 0

    def apply_delta(self, delta: int) -> None:
        self.score = min(max(self.score + delta, 0), self.max_multiplier - 1)

    def scale(self, timeout_s: float) -> float:
        return timeout_s * (self.score + 1)
