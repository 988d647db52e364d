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
    update: Update
    size: int
    klass: int
    transmits: int


class BroadcastQueue:
    def __init__(self, n_classes: int) -> None:
        self._n_classes = n_classes
        self._buckets: list[list[dict[object, _Entry]]] = [[] for _ in range(n_classes)]
        self._index: dict[object, _Entry] = {}
        self._per_class = [0] * n_classes

    def __len__(self) -> int:
        return len(self._index)

    def push(self, key: object, update: Update, size: int, klass: int) -> None:
        """Queue ``update`` (encoded size ``size``) in priority class ``klass`` (0 = first)."""
        old = self._index.pop(key, None)
        if old is not None:
            del self._buckets[old.klass][old.transmits][key]
            self._per_class[old.klass] -= 1
        self._per_class[klass] += 1
        entry = _Entry(update, size, klass, 0)
        self._index[key] = entry
        buckets = self._buckets[klass]
        if not buckets:
            buckets.append({})
        buckets[0][key] = entry

    def drop(self, key: object) -> None:
        old = self._index.pop(key, None)
        if old is not None:
            del self._buckets[old.klass][old.transmits][key]
            self._per_class[old.klass] -= 1

    def take(self, budget: int, limit: int, overhead: int = 2) -> list[Message]:
        """Up to ``budget`` bytes of updates (``overhead`` counted per item), each counted sent.
        An update larger than the whole budget is sent alone when it is first in line, so a big
        record (an inventory of eight GPUs) is disseminated too, not queued forever."""
        if not self._index:
            return []
        out: list[Message] = []
        chosen: list[tuple[object, _Entry]] = []
        left = budget
        for klass in range(self._n_classes):
            unseen = self._per_class[klass]
            if not unseen:
                continue
            for bucket in self._buckets[klass]:
                if not bucket:
                    continue
                unseen -= len(bucket)
                for key in reversed(bucket):
                    entry = bucket[key]
                    cost = entry.size + overhead
                    if cost <= left or not chosen:  # one larger than the budget goes alone
                        left -= cost
                        chosen.append((key, entry))
                        out.append(entry.update)
                    if left < 64:
                        break
                if left < 64 or not unseen:  # budget spent, or no entries in later buckets
                    break
            if left < 64:
                break
        for key, entry in chosen:
            buckets = self._buckets[entry.klass]
            del buckets[entry.transmits][key]
            entry.transmits += 1
            if entry.transmits >= limit:
                del self._index[key]
                self._per_class[entry.klass] -= 1
                continue
            while len(buckets) <= entry.transmits:
                buckets.append({})
            buckets[entry.transmits][key] = entry
        return out

    def prune(self, keep: Callable[[object, Update], bool]) -> None:
        """Drop entries for which ``keep(key, update)`` is false."""
        for key, entry in list(self._index.items()):
            if not keep(key, entry.update):
                self.drop(key)
