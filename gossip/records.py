"""The record store: the newest accepted :class:`Record` per (origin, kind), and when it arrived.

The store only merges by version; signature, size and origin checks are the core's job before
:meth:`RecordStore.offer`. ``received_at`` makes staleness visible to the application.

**Retired records.** The application may retire a kind it no longer needs (an ended job's
records, long after it ended): every origin's record of that kind leaves the store and its
digest, and the store keeps only its version (a tombstone, the newest ``max_retired``), so a copy
a lagging member still gossips is refused as :attr:`Offer.RETIRED` instead of coming back. A
newer version (the origin wrote the kind again) is taken in as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from gossip.codec import remembered_updates
from gossip.messages import Record, RecordDigest


class Offer(Enum):
    NEWER = "newer"
    DUPLICATE = "duplicate"
    STALE = "stale"  # older version, or the same version with other content: a replay
    RETIRED = "retired"  # a version of a record this store retired, or an older one


@dataclass(frozen=True, slots=True)
class StoredRecord:
    record: Record
    received_at: float
    """The caller's clock when this version was accepted (or published)."""

    def age_s(self, now: float) -> float:
        return now - self.received_at


MAX_RETIRED = 4096
"""Tombstones of retired records a store keeps, the oldest going first: ~400 bytes each with
their keys. A copy of a record retired longer ago is taken in again, and the application
retires it again (an ended job's stays ended)."""


class RecordStore:
    def __init__(self, max_retired: int = MAX_RETIRED) -> None:
        self._by_key: dict[tuple[str, str], StoredRecord] = {}
        self._retired: dict[tuple[str, str], tuple[int, int]] = {}
        """The version of each retired record, oldest retirement first."""
        self._max_retired = max_retired
        self._rows: dict[tuple[str, str], RecordDigest] = {}
        """The digest line of each record, made when it is stored (a digest is asked for at
        every push-pull; a record changes far less often)."""

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[StoredRecord]:
        return iter(list(self._by_key.values()))

    def get(self, origin: str, kind: str) -> StoredRecord | None:
        return self._by_key.get((origin, kind))

    def classify(self, record: Record) -> Offer:
        """How ``record`` compares with what we hold (no change made)."""
        key = (record.origin, record.kind)
        held = self._by_key.get(key)
        if held is None:
            retired = self._retired.get(key)
            if retired is not None and record.version <= retired:
                return Offer.RETIRED
            return Offer.NEWER
        h = held.record
        if record.version > h.version:
            return Offer.NEWER
        if record.version == h.version and record == h:
            return Offer.DUPLICATE
        return Offer.STALE

    def put(self, record: Record, now: float) -> None:
        key = (record.origin, record.kind)
        self._retired.pop(key, None)
        self._by_key[key] = StoredRecord(record, now)
        row = RecordDigest(record.origin, record.kind, record.incarnation, record.counter)
        if len(_ROWS) >= remembered_updates():
            _ROWS.clear()
        self._rows[key] = _ROWS.setdefault(row, row)

    def retire(self, kinds: set[str]) -> int:
        """Retire every origin's record of each of ``kinds``; how many records left."""
        keys = [k for k in self._by_key if k[1] in kinds]
        for key in keys:
            self._retired.pop(key, None)  # re-inserted: the newest retirement last
            self._retired[key] = self._by_key[key].record.version
            del self._by_key[key], self._rows[key]
        while len(self._retired) > self._max_retired:
            del self._retired[next(iter(self._retired))]
        return len(keys)

    @property
    def retired(self) -> int:
        """Tombstones held."""
        return len(self._retired)

    def drop_origin(self, origin: str) -> None:
        for key in [k for k in self._by_key if k[0] == origin]:
            del self._by_key[key], self._rows[key]

    def digest(self) -> list[RecordDigest]:
        return list(self._rows.values())


_ROWS: dict[RecordDigest, RecordDigest] = {}
"""Digest lines shared by every store in the process (the simulator runs a thousand): equal
lines are then one object, and comparing two digests that agree is a row of identity checks.
Every version of every record makes a line: a live member (one store) keeps a few hundred, the
simulator many more (:func:`gossip.codec.remember_updates`)."""
