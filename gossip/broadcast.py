"""Retransmit-limited broadcast queue (memberlist's ``TransmitLimitedQueue``).

Each queued update is sent at most ``limit`` times (the limit is read at send time, so it follows
the cluster size). Selection order: priority class first (the caller's order: alive/refute,
suspect, dead), then fewest transmissions, then newest. A newer update with the same key (the
same node, or the same record origin and kind) replaces the queued one. Entries live in buckets
indexed by transmit count, so picking is O(picked + classes * limit), never a sort.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gossip.messages import Message, Update


@dataclass(slots=True)
class _Entry:
    key: object
    update: Update
    size: int
    klass: int
    transmits: int


class BroadcastQueue:
    def __init__(self, n_classes: int) -> None:
        self._n_classes = n_classes
        self._buckets: list[list[dict[object, _Entry]]] = [[] for _ in range(n_classes)]
        self._low = [0] * n_classes
        """Per class, a bucket below which all are empty: entries only move up, so a take
        starts there (a long-lived queue has ``limit`` buckets, mostly empty, per class)."""
        self.pending: dict[object, _Entry] = {}
        """The queued entries by key. Read-only outside: its truth says whether :meth:`take`
        has anything, without the cost of a call (asked for every message sent)."""
        self._per_class = [0] * n_classes

    def __len__(self) -> int:
        return len(self.pending)

    def push(self, key: object, update: Update, size: int, klass: int) -> None:
        """Queue ``update`` (encoded size ``size``) in priority class ``klass`` (0 = first)."""
        old = self.pending.pop(key, None)
        if old is not None:
            del self._buckets[old.klass][old.transmits][key]
            self._per_class[old.klass] -= 1
        self._per_class[klass] += 1
        entry = _Entry(key, update, size, klass, 0)
        self.pending[key] = entry
        buckets = self._buckets[klass]
        if not buckets:
            buckets.append({})
        buckets[0][key] = entry
        self._low[klass] = 0

    def drop(self, key: object) -> None:
        old = self.pending.pop(key, None)
        if old is not None:
            del self._buckets[old.klass][old.transmits][key]
            self._per_class[old.klass] -= 1

    def take(self, budget: int, limit: int, overhead: int = 2) -> list[Message]:
        """Up to ``budget`` bytes of updates (``overhead`` counted per item), each counted sent.
        An update larger than the whole budget is sent alone when it is first in line, so a big
        record (an inventory of eight GPUs) is disseminated too, not queued forever."""
        pending = self.pending
        if not pending:
            return []
        if len(pending) == 1:  # the usual case: first in line, so sent whatever its size
            chosen = list(pending.values())
            out: list[Message] = [chosen[0].update]
        else:
            chosen, out = self._pick(budget, overhead)
        for entry in chosen:
            buckets = self._buckets[entry.klass]
            key = entry.key
            del buckets[entry.transmits][key]
            entry.transmits += 1
            if entry.transmits >= limit:
                del pending[key]
                self._per_class[entry.klass] -= 1
                continue
            if len(buckets) == entry.transmits:
                buckets.append({})
            buckets[entry.transmits][key] = entry
        return out

    def _pick(self, budget: int, overhead: int) -> tuple[list[_Entry], list[Message]]:
        """The entries ``take`` sends, in order, and their updates."""
        out: list[Message] = []
        chosen: list[_Entry] = []
        left = budget
        for klass in range(self._n_classes):
            unseen = self._per_class[klass]
            if not unseen:
                continue
            buckets = self._buckets[klass]
            t = self._low[klass]
            while not buckets[t]:  # some bucket holds this class's entries
                t += 1
            self._low[klass] = t
            for bucket in buckets[t:]:
                if not bucket:
                    continue
                unseen -= len(bucket)
                for entry in reversed(bucket.values()):
                    cost = entry.size + overhead
                    if cost <= left or not chosen:  # one larger than the budget goes alone
                        left -= cost
                        chosen.append(entry)
                        out.append(entry.update)
                    if left < 64:
                        break
                if left < 64 or not unseen:  # budget spent, or no entries in later buckets
                    break
            if left < 64:
                break
        return chosen, out

    def prune(self, keep: Callable[[object, Update], bool]) -> None:
        """Drop entries for which ``keep(key, update)`` is false."""
        for key, entry in list(self.pending.items()):
            if not keep(key, entry.update):
                self.drop(key)
