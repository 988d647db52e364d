"""Replay protection for operator commands: unique id + timestamp, bounded memory.

A command is accepted once, and only while ``|now - issued_at| <= window_s`` (default 120 s: a
command is valid for two minutes either side of the receiver's clock, enough for hosts kept by NTP
and short enough that the ids to remember stay few). An id is remembered until its command would be
rejected as stale anyway, then forgotten, so memory follows the command rate over one window.

Memory is also capped (``max_entries``). When the cap is reached the guard forgets the oldest
command (by ``issued_at``) and raises a floor: from then on any command issued at or before the
forgotten one is rejected as stale. So the guard tightens its window under a flood instead of ever
accepting a replay.

The guard lives in memory; an agent stores each command it accepts and :meth:`ReplayGuard.restore`
gives them back after a restart, so a captured command stays refused across restarts.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_WINDOW_S = 120.0
DEFAULT_MAX_ENTRIES = 100_000


class Verdict(enum.Enum):
    ACCEPTED = "accepted"
    REPLAYED = "replayed"  # this id was seen within the window
    STALE = "stale"  # issued too long ago, or at/before the eviction floor
    FUTURE = "future"  # issued further ahead of our clock than the window allows


@dataclass(slots=True)
class ReplayGuard:
    """Remembers accepted command ids for one skew window. Time is passed in (seconds)."""

    window_s: float = DEFAULT_WINDOW_S
    max_entries: int = DEFAULT_MAX_ENTRIES
    _seen: dict[str, float] = field(default_factory=dict)
    _by_time: list[tuple[float, str]] = field(default_factory=list)
    _floor_s: float = float("-inf")

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.max_entries < 1:
            raise ValueError("window_s must be positive and max_entries at least 1")

    def __len__(self) -> int:
        return len(self._seen)

    def _forget_before(self, horizon_s: float) -> None:
        while self._by_time and self._by_time[0][0] < horizon_s:
            _, command_id = heapq.heappop(self._by_time)
            del self._seen[command_id]

    def judge(self, command_id: str, issued_at: float, now: float) -> Verdict:
        """What ``check`` would say, without remembering anything."""
        self._forget_before(now - self.window_s)
        if issued_at > now + self.window_s:
            return Verdict.FUTURE
        if issued_at < now - self.window_s or issued_at <= self._floor_s:
            return Verdict.STALE
        if command_id in self._seen:
            return Verdict.REPLAYED
        return Verdict.ACCEPTED

    def restore(self, seen: Iterable[tuple[str, float]], now: float) -> int:
        """Remember commands accepted before a restart (``(id, issued_at)`` pairs, as the caller
        stored them); returns how many are still within the window."""
        restored = 0
        for command_id, issued_at in seen:
            if self.check(command_id, issued_at, now) is Verdict.ACCEPTED:
                restored += 1
        return restored

    def check(self, command_id: str, issued_at: float, now: float) -> Verdict:
        """Judge a command and, when accepted, remember its id until it goes stale."""
        verdict = self.judge(command_id, issued_at, now)
        if verdict is not Verdict.ACCEPTED:
            return verdict
        if len(self._seen) >= self.max_entries:
            if issued_at <= self._by_time[0][0]:
                return Verdict.STALE  # older than all we hold: keeping it would raise the floor
            while len(self._seen) >= self.max_entries:
                oldest_s, oldest_id = heapq.heappop(self._by_time)
                del self._seen[oldest_id]
                self._floor_s = max(self._floor_s, oldest_s)
        self._seen[command_id] = issued_at
        heapq.heappush(self._by_time, (issued_at, command_id))
        return Verdict.ACCEPTED
