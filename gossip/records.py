"""The record store: the newest accepted :class:`Record` per (origin, kind), and when it arrived.

The store only merges by version; signature, size and origin checks are the core's job before
:meth:`RecordStore.offer`. ``received_at`` makes staleness visible to the application.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from gossip.messages import Record, RecordDigest


class Offer(Enum):
    NEWER = "newer"
    DUPLICATE = "duplicate"
    STALE = "stale"  # older version, or the same version with other content: a replay


@dataclass(frozen=True, slots=True)
class StoredRecord:
    record: Record
    received_at: float
    """The caller's clock when this version was accepted (or published)."""

    def age_s(self, now: float) -> float:
        return now - self.received_at


class RecordStore:
    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], StoredRecord] = {}
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
        held = self._by_key.get((record.origin, record.kind))
        if held is None:
            return Offer.NEWER
        h = held.record
        if record.version > h.version:
            return Offer.NEWER
        if record.version == h.version and record == h:
            return Offer.DUPLICATE
        return Offer.STALE

    def put(self, record: Record, now: float) -> None:
        key = (record.origin, record.kind)
        self._by_key[key] = StoredRecord(record, now)
        row = RecordDigest(record.origin, record.kind, record.incarnation, record.counter)
        if len(_ROWS) >= 1 << 16:
            _ROWS.clear()
        self._rows[key] = _ROWS.setdefault(row, row)

    def drop_origin(self, origin: str) -> None:
        for key in [k for k in self._by_key if k[0] == origin]:
            del self._by_key[key], self._rows[key]

    def digest(self) -> list[RecordDigest]:
        return list(self._rows.values())


_ROWS: dict[RecordDigest, RecordDigest] = {}
"""Digest lines shared by every store in the process (the simulator runs a thousand): equal
lines are then one object, and comparing two digests that agree is a row of identity checks."""
