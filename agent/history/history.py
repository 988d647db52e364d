"""A node's history, sans I/O: samples in, packed blocks out, roll-ups and trimming by time.

Three tiers (:data:`TIERS`), each a run of fixed-size *blocks*, one block per series per span:

=========  ======  ==================  ============  ================================
tier       step    block               kept          one slot holds
=========  ======  ==================  ============  ================================
``s``      1 s     1 minute (60)       24 hours      the sample
``m``      1 min   1 hour (60)         30 days       min, avg, max of that minute
``h``      1 h     1 day (24)          365 days      min, avg, max of that hour
=========  ======  ==================  ============  ================================

A slot is little-endian float32 (24-bit mantissa: a byte count is kept to within one part in 16
million); a slot with no sample is NaN and comes back as ``None`` (a gap: the agent was down, or
the reading failed). A series the device does not expose at all is *unsupported* (its
:class:`Series` says so): it is never stored as zeros or as a silent gap.

Roll-up: when a sample falls past its series' open ``s`` block, the block is closed, its min,
avg and max go into the ``m`` tier's slot for that minute; closing an ``m`` block (an hour
passed) rolls it into the ``h`` tier the same way. Every changed block is handed out by
:meth:`HistoryCore.take_dirty` for the adapter to write (whole blocks: a write replaces the
block). After a restart the adapter gives back the latest block of each tier
(:meth:`HistoryCore.restore`), so the minute and hour being filled carry on where they were.
Trimming is by time: :func:`trim_before` says, per tier, the block starts older than its keep.

Nothing here reads a clock or touches a file: ``now_s`` is always an argument.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

SLOT_FORMAT: Final = "<f"


@dataclass(frozen=True, slots=True)
class Tier:
    """One resolution of the history."""

    name: str
    step_s: int
    """Seconds one slot covers."""
    slots: int
    """Slots in one block (a block covers ``step_s * slots`` seconds)."""
    keep_s: int
    """How long blocks are kept (a block goes once all of it is older)."""
    values: int
    """Floats per slot: 1 (a sample) or 3 (min, avg, max)."""

    @property
    def span_s(self) -> int:
        return self.step_s * self.slots

    @property
    def block_bytes(self) -> int:
        return self.slots * self.values * 4

    def block_start(self, t_s: float) -> int:
        return int(t_s // self.span_s) * self.span_s


DAY_S: Final = 86_400
TIERS: Final[tuple[Tier, ...]] = (
    Tier("s", 1, 60, DAY_S, 1),
    Tier("m", 60, 60, 30 * DAY_S, 3),
    Tier("h", 3600, 24, 365 * DAY_S, 3),
)
TIER_BY_NAME: Final = {t.name: t for t in TIERS}
FORGET_AFTER_S: Final = DAY_S
"""A series with no reading for this long (a job that ended, a device that went) and no open
block is forgotten by the core (what is stored stays, until trimmed)."""


@dataclass(frozen=True, slots=True, order=True)
class SeriesKey:
    """One series: a measure (``gpu.util_pct``) of a subject (a device key, a job id, or ``""``
    for the host)."""

    name: str
    subject: str = ""


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A measure the device or host does not expose (never stored as a value)."""

    why: str = "not exposed by this device"


UNSUPPORTED: Final = Unsupported()
Reading = float | None | Unsupported
"""One sample of one series: a value, ``None`` (this reading failed: a gap), or unsupported."""


@dataclass(frozen=True, slots=True)
class BlockWrite:
    """A whole block to store (replacing any block of the same tier, series and start)."""

    tier: str
    key: SeriesKey
    start_s: int
    data: bytes


class Point(NamedTuple):
    """One step of a query's answer; ``None`` where no sample fell in the step (a named tuple:
    a day of seconds is 86,400 of them, made fast)."""

    t_s: int
    min: float | None
    avg: float | None
    max: float | None


@dataclass(slots=True)
class _Block:
    tier: Tier
    start_s: int
    slots: list[float] = field(default_factory=list)

    @classmethod
    def empty(cls, tier: Tier, start_s: int) -> _Block:
        return cls(tier, start_s, [math.nan] * (tier.slots * tier.values))

    def encode(self) -> bytes:
        return struct.pack(f"<{len(self.slots)}f", *self.slots)

    def summary(self) -> tuple[float, float, float] | None:
        """min, avg, max of the block's slots (of the slots' own min, avg, max for an
        aggregate tier); ``None`` if every slot is empty."""
        v = self.tier.values
        lows = [x for x in self.slots[0::v] if not math.isnan(x)]
        if not lows:
            return None
        avgs = [x for x in self.slots[(v // 2) :: v] if not math.isnan(x)]
        highs = [x for x in self.slots[(v - 1) :: v] if not math.isnan(x)]
        return min(lows), sum(avgs) / len(avgs), max(highs)


def decode(tier: Tier, data: bytes) -> list[float]:
    """A stored block's slots (NaN where empty); ``ValueError`` for a block of the wrong size."""
    if len(data) != tier.block_bytes:
        raise ValueError(f"a {tier.name} block holds {tier.block_bytes} bytes, not {len(data)}")
    return list(struct.unpack(f"<{tier.slots * tier.values}f", data))


@dataclass(slots=True)
class CoreCounts:
    """What the core refused or let go of (each also a reason an operator can read)."""

    late_samples: int = 0
    """Samples older than their series' open block (a clock stepped back)."""
    bad_values: int = 0
    """Readings that were not finite numbers (infinities; NaN is taken as a failed reading)."""


class HistoryCore:
    """The open blocks of every series, the roll-ups, and the blocks waiting to be written."""

    def __init__(self, tiers: Sequence[Tier] = TIERS) -> None:
        self.tiers = tuple(tiers)
        self._open: list[dict[SeriesKey, _Block]] = [{} for _ in self.tiers]
        self._dirty: dict[tuple[int, SeriesKey, int], _Block] = {}
        self.supported: dict[SeriesKey, str | None] = {}
        """Every series seen: ``None`` if supported, else why not."""
        self._recorded: dict[SeriesKey, str | None] = {}
        self._seen_s: dict[SeriesKey, float] = {}
        self.counts = CoreCounts()

    # -- input -------------------------------------------------------------------------------------

    def add(self, now_s: float, readings: Mapping[SeriesKey, Reading]) -> None:
        """One sample of every series at ``now_s`` (seconds since the epoch)."""
        for key, reading in readings.items():
            self._seen_s[key] = now_s
            if isinstance(reading, Unsupported):
                self.supported[key] = reading.why
                continue
            self.supported[key] = None
            if reading is None or math.isnan(reading):
                value = math.nan
            elif math.isinf(reading):
                self.counts.bad_values += 1
                value = math.nan
            else:
                value = float(reading)
            self._put(0, key, now_s, (value,))

    def restore(self, tier: str, key: SeriesKey, start_s: int, data: bytes) -> None:
        """A block read back from the store: it becomes the series' open block of its tier if it
        is the latest one seen (not marked to be written again)."""
        index = next(i for i, t in enumerate(self.tiers) if t.name == tier)
        held = self._open[index].get(key)
        if held is None or held.start_s < start_s:
            tier_ = self.tiers[index]
            self._open[index][key] = _Block(tier_, start_s, decode(tier_, data))
        self.supported.setdefault(key, None)

    def _put(self, index: int, key: SeriesKey, t_s: float, value: tuple[float, ...]) -> None:
        tier = self.tiers[index]
        start = tier.block_start(t_s)
        block = self._open[index].get(key)
        if block is None or block.start_s < start:
            if block is not None:
                self._close(index, key, block)
            block = self._open[index][key] = _Block.empty(tier, start)
        elif block.start_s > start:
            self.counts.late_samples += 1
            return
        slot = int((t_s - start) // tier.step_s) * tier.values
        if tier.values == 1:
            block.slots[slot] = value[0]
        elif len(value) == 1:
            block.slots[slot : slot + 3] = [value[0]] * 3
        else:
            block.slots[slot : slot + 3] = list(value)
        self._dirty[(index, key, block.start_s)] = block

    def _close(self, index: int, key: SeriesKey, block: _Block) -> None:
        """A block is over: roll its summary into the next tier."""
        if index + 1 >= len(self.tiers):
            return
        summary = block.summary()
        if summary is not None:
            self._put(index + 1, key, block.start_s, summary)

    def close_idle(self, now_s: float) -> None:
        """Roll up the blocks whose span is over though no sample came after them (a job that
        ended, a device that went): their minute and hour are not lost."""
        for index, tier in enumerate(self.tiers):
            start = tier.block_start(now_s)
            for key, block in list(self._open[index].items()):
                if block.start_s < start:
                    self._close(index, key, block)
                    del self._open[index][key]
        for key, seen_s in list(self._seen_s.items()):  # a job long ended: let it go
            if now_s - seen_s > FORGET_AFTER_S and not any(key in o for o in self._open):
                del self._seen_s[key]
                self.supported.pop(key, None)
                self._recorded.pop(key, None)

    # -- output ------------------------------------------------------------------------------------

    def take_dirty(self) -> list[BlockWrite]:
        """Every block changed since the last call, to be written (each once)."""
        out = [
            BlockWrite(self.tiers[i].name, key, start, block.encode())
            for (i, key, start), block in self._dirty.items()
        ]
        self._dirty.clear()
        return out

    def support_changes(self) -> list[tuple[SeriesKey, str | None]]:
        """Series first seen, or whose support changed, since the last call (``None``: supported;
        else why not), for the adapter to record."""
        out = [(k, why) for k, why in self.supported.items() if self._recorded.get(k, "") != why]
        self._recorded.update(out)
        return out

    def series(self) -> list[SeriesKey]:
        return sorted(self.supported)


def trim_before(now_s: float, tiers: Iterable[Tier] = TIERS) -> dict[str, int]:
    """Per tier, the block start before which every block is past its keep (delete those with
    ``start_s < value``)."""
    return {t.name: int(now_s - t.keep_s - t.span_s) + 1 for t in tiers}


# -- queries ------------------------------------------------------------------------------------


def pick_tier(now_s: float, from_s: float, step_s: int, tiers: Sequence[Tier] = TIERS) -> Tier:
    """The tier a query reads: the coarsest one no coarser than ``step_s`` that still holds
    ``from_s``; else the finest that holds it; else the longest kept."""
    holding = [t for t in tiers if now_s - from_s <= t.keep_s]
    fitting = [t for t in holding if t.step_s <= step_s]
    if fitting:
        return max(fitting, key=lambda t: t.step_s)
    if holding:
        return min(holding, key=lambda t: t.step_s)
    return max(tiers, key=lambda t: t.keep_s)


def points(
    tier: Tier,
    blocks: Iterable[tuple[int, bytes]],
    from_s: int,
    to_s: int,
    step_s: int,
) -> list[Point]:
    """Blocks of one series in one tier (start, data) as points every ``step_s`` from
    ``from_s`` (aligned down to ``step_s``) to before ``to_s``: the min, avg and max of the slots
    that fall in each step."""
    first = (from_s // step_s) * step_s
    count = max(0, -(-(to_s - first) // step_s))
    lows: list[float] = [math.inf] * count
    highs: list[float] = [-math.inf] * count
    sums: list[float] = [0.0] * count
    ns: list[int] = [0] * count
    v = tier.values
    if step_s == tier.step_s and first % tier.step_s == 0:
        return _one_slot_a_point(tier, blocks, first, count)
    for start, data in blocks:
        slots = decode(tier, data)
        for i in range(tier.slots):
            low = slots[i * v]
            if math.isnan(low):
                continue
            t = start + i * tier.step_s
            if t < first or t >= to_s:
                continue
            j = (t - first) // step_s
            avg, high = slots[i * v + v // 2], slots[i * v + v - 1]
            lows[j] = min(lows[j], low)
            highs[j] = max(highs[j], high)
            sums[j] += avg
            ns[j] += 1
    return [
        Point(first + j * step_s, lows[j], sums[j] / ns[j], highs[j])
        if ns[j]
        else Point(first + j * step_s, None, None, None)
        for j in range(count)
    ]


def _one_slot_a_point(
    tier: Tier, blocks: Iterable[tuple[int, bytes]], first: int, count: int
) -> list[Point]:
    """:func:`points` at the tier's own step: each slot is a point (no arithmetic per slot)."""
    v, step = tier.values, tier.step_s
    out = [Point(first + j * step, None, None, None) for j in range(count)]
    for start, data in blocks:
        slots = decode(tier, data)
        base = (start - first) // step
        lows, avgs, highs = slots[0::v], slots[v // 2 :: v], slots[v - 1 :: v]
        for i, low in enumerate(lows):
            j = base + i
            if low == low and 0 <= j < count:  # not NaN
                out[j] = Point(first + j * step, low, avgs[i], highs[i])
    return out
