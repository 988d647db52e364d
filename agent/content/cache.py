"""The store's cache rules, sans I/O: a budget, two watermarks, and which manifests go first.

A node's store may hold up to its budget (``store_budget_bytes``, or ``store_budget_share`` of its
disk). When what it holds passes the high watermark (90% of the budget by default), manifests are
evicted until it is under the low one (70%): the least recently used first, weighted by popularity
(a manifest used ``uses`` times is kept as if last used ``1 + log2(1 + uses)`` times more
recently). Never evicted: a pinned manifest, one the caller protects (what jobs running or queued
on this node need), and one of local origin (its files are the operator's, the store keeps none of
their bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

DEFAULT_HIGH: Final = 0.90
DEFAULT_LOW: Final = 0.70


@dataclass(frozen=True, slots=True)
class CacheRules:
    budget_bytes: int
    high: float = DEFAULT_HIGH
    low: float = DEFAULT_LOW

    def __post_init__(self) -> None:
        problem = rules_problem(self.budget_bytes, self.high, self.low)
        if problem is not None:
            raise ValueError(problem)

    @property
    def high_bytes(self) -> int:
        return int(self.budget_bytes * self.high)

    @property
    def low_bytes(self) -> int:
        return int(self.budget_bytes * self.low)


def rules_problem(budget_bytes: int, high: float, low: float) -> str | None:
    """Why these cache rules cannot be, or ``None``."""
    if budget_bytes <= 0:
        return f"store budget {budget_bytes}: must be a positive number of bytes"
    if not (0.0 < low < high <= 1.0):
        return f"store watermarks {low}..{high}: need 0 < low < high <= 1"
    return None


def budget_from_share(share: float, disk_total_bytes: int) -> int:
    """The budget that ``share`` (0 < share <= 1) of a disk of ``disk_total_bytes`` gives."""
    if not (0.0 < share <= 1.0) or math.isnan(share):
        raise ValueError(f"store budget share {share}: must be above 0 and at most 1")
    return max(1, int(disk_total_bytes * share))


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One manifest as eviction sees it."""

    digest: str
    held_bytes: int
    """Bytes of it the store keeps (what evicting it frees, at most)."""
    last_use_s: float
    uses: int
    pinned: bool = False
    local: bool = False


def evict_score(entry: CacheEntry, now: float) -> float:
    """Higher goes first: idle time, shrunk by popularity."""
    idle_s = max(0.0, now - entry.last_use_s)
    return idle_s / (1.0 + math.log2(1.0 + max(0, entry.uses)))


def plan_eviction(
    entries: Sequence[CacheEntry],
    held_bytes: int,
    rules: CacheRules,
    now: float,
    protected: Iterable[str] = (),
    force: bool = False,
) -> tuple[str, ...]:
    """The digests to evict, in order, so that ``held_bytes`` goes under the low watermark:
    nothing while it is at or under the high one (unless ``force``). May not reach the low
    watermark when too much is pinned or protected."""
    if held_bytes <= rules.high_bytes and not force:
        return ()
    keep = frozenset(protected)
    candidates = [
        e
        for e in entries
        if not e.pinned and not e.local and e.digest not in keep and e.held_bytes > 0
    ]
    candidates.sort(key=lambda e: (-evict_score(e, now), -e.held_bytes, e.digest))
    out: list[str] = []
    left = held_bytes
    for e in candidates:
        if left <= rules.low_bytes:
            break
        out.append(e.digest)
        left -= e.held_bytes
    return tuple(out)
