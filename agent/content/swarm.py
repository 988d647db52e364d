"""Which chunk to ask of which holder next, sans I/O: the planner of one manifest's fetch.

A :class:`Swarm` is told the chunks still missing here (``ContentStore.missing``) and what each
holder says it has (a whole copy, or a partial one with its set of chunk digests). It hands out
:class:`Ask` values, rarest chunk first (the chunk the fewest usable holders have goes first, so
that a holder about to vanish has given what only it had), spread over several holders at once,
within a cap of asks in flight (in all and per holder; a small chunk counts its share of a slot,
``SwarmLimits.slot_bytes``) and of bytes per second per link (a token bucket per holder, refilled
from the ``now`` passed in). Each ask ends in one of three ways:

- :meth:`Swarm.got`: the chunk is held; it is never asked again;
- :meth:`Swarm.corrupt`: the holder served bytes that do not match the chunk's digest: the holder
  is dropped for this manifest (counted in ``holders_dropped``), the chunk goes back to be fetched
  from another;
- :meth:`Swarm.failed`: the holder did not answer: it backs off (doubling, capped) and, after
  ``max_failures`` failures in a row, is given up; the chunk goes back.

:meth:`Swarm.progress` is a typed :class:`Progress` (bytes held of the total, the rate over the
last seconds, the holders in use, an ETA) that a waiting job's reason can show.

Nothing here touches a file, a socket or a clock: ``now`` (seconds, monotonic) is passed in.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from agent.content.manifest import ChunkAt

RATE_WINDOW_S: Final = 5.0
"""The rate is what arrived over this last span."""
SLOT_PARTS: Final = 64
"""The parts of a slot (``SwarmLimits.slot_bytes``): the smallest share an ask counts."""


@dataclass(frozen=True, slots=True)
class SwarmLimits:
    max_in_flight: int = 16
    """Asks outstanding at once, over all holders."""
    max_in_flight_per_holder: int = 4
    link_bytes_per_s: int = 0
    """The cap of each link (0: none)."""
    burst_bytes: int = 0
    """What a link's bucket holds at most (never less than one chunk)."""
    backoff_s: float = 0.5
    """The wait after a holder's first failure; it doubles with each further one in a row."""
    max_backoff_s: float = 30.0
    max_failures: int = 6
    """Failures in a row after which a holder is given up for this manifest."""
    slot_bytes: int = 0
    """With it, an ask counts against the caps above as its chunk's share of a slot (at least
    1/:data:`SLOT_PARTS` of one, at most one): a working folder's thousand small files go many
    at a time, and the fetcher sends those asked of one holder together as one request. 0:
    every ask counts one."""

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_in_flight_per_holder < 1:
            raise ValueError("swarm limits: at least one ask must be allowed in flight")
        if self.link_bytes_per_s < 0 or self.burst_bytes < 0 or self.max_failures < 1:
            raise ValueError("swarm limits: negative rate, burst or no failure allowed")
        if self.slot_bytes < 0:
            raise ValueError("swarm limits: a negative slot")

    def parts(self, chunk: ChunkAt) -> int:
        """What an ask of ``chunk`` counts, in parts of a slot (:data:`SLOT_PARTS` a slot)."""
        if not self.slot_bytes:
            return SLOT_PARTS
        share = -(-chunk.length_bytes * SLOT_PARTS // self.slot_bytes)  # rounded up
        return max(1, min(SLOT_PARTS, share))


@dataclass(frozen=True, slots=True)
class Ask:
    """Fetch ``chunk`` from ``holder``."""

    holder: str
    chunk: ChunkAt


@dataclass(frozen=True, slots=True)
class Progress:
    held_bytes: int
    total_bytes: int
    rate_bytes_per_s: float
    holders_in_use: int
    eta_s: float | None
    """``None`` while nothing arrives (or nothing is left: then 0)."""

    @property
    def fraction(self) -> float:
        return 1.0 if self.total_bytes == 0 else self.held_bytes / self.total_bytes

    def line(self, name: str) -> str:
        """``staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)``."""
        pct = int(self.fraction * 100)
        holders = f"{self.holders_in_use} holder{'' if self.holders_in_use == 1 else 's'}"
        eta = "" if self.eta_s is None else f", ~{_duration(self.eta_s)}"
        return f"staging {name} {pct}% ({_rate(self.rate_bytes_per_s)} from {holders}{eta})"


def _rate(bytes_per_s: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(slots=True)
class _Holder:
    name: str
    whole: bool
    chunks: frozenset[str]
    tokens: float = 0.0
    refilled_at: float = 0.0
    in_flight: int = 0
    """In parts of a slot (``SwarmLimits.parts``)."""
    failures: int = 0
    until: float = 0.0
    """Backing off until then."""
    out: bool = False
    """Dropped (corrupt) or given up (failing)."""
    served_bytes: int = 0

    def has(self, digest: str) -> bool:
        return self.whole or digest in self.chunks


@dataclass(slots=True)
class _Counts:
    holders_dropped: int = 0
    holders_given_up: int = 0
    chunks_refused: int = 0
    failures: int = 0
    by_holder: Counter[str] = field(default_factory=Counter)


class Swarm:
    """The plan of one manifest's fetch (see the module docstring)."""

    def __init__(
        self,
        missing: Sequence[ChunkAt],
        *,
        total_bytes: int,
        held_bytes: int,
        limits: SwarmLimits | None = None,
    ) -> None:
        """``missing``: one per distinct chunk digest still to fetch, in manifest order."""
        self.limits = limits or SwarmLimits()
        self.total_bytes = total_bytes
        self.held_bytes = held_bytes
        self._order = {c.digest: n for n, c in enumerate(missing)}
        self._pending: dict[str, ChunkAt] = {c.digest: c for c in missing}
        self._in_flight: dict[str, Ask] = {}
        self._flying = 0
        """The parts of a slot the asks in flight count (``SwarmLimits.parts``)."""
        self._holders: dict[str, _Holder] = {}
        self._arrived: deque[tuple[float, int, str]] = deque()
        self._max_chunk = max((c.length_bytes for c in missing), default=0)
        self._ranked: list[str] | None = None
        self._head = 0
        """Every chunk of ``_ranked`` before it is held."""
        self.counts = _Counts()

    # -- holders ---------------------------------------------------------------------------------

    def add_holder(self, name: str, *, whole: bool, chunks: Iterable[str] = (), now: float) -> None:
        """What ``name`` says it has (told again: replaced; a holder dropped stays dropped)."""
        old = self._holders.get(name)
        if old is not None and old.out:
            return
        holder = _Holder(name, whole, frozenset(chunks))
        holder.tokens = float(self._burst())
        holder.refilled_at = now
        if old is not None:
            holder.tokens, holder.refilled_at = old.tokens, old.refilled_at
            holder.in_flight, holder.failures, holder.until = (
                old.in_flight,
                old.failures,
                old.until,
            )
            holder.served_bytes = old.served_bytes
        self._holders[name] = holder
        self._ranked = None

    def give_up(self, name: str) -> bool:
        """``name`` is gone from the mesh: it is given up for this manifest at once rather than
        backed off from in turn. True the first time (its asks in flight are the caller's to
        take back with :meth:`returned`)."""
        holder = self._holders.get(name)
        if holder is None or holder.out:
            return False
        holder.out = True
        self.counts.holders_given_up += 1
        self._ranked = None
        return True

    def holders(self) -> list[str]:
        """The holders still usable (neither dropped nor given up)."""
        return [h.name for h in self._holders.values() if not h.out]

    # -- asking ----------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return not self._pending and not self._in_flight

    @property
    def stuck(self) -> bool:
        """Nothing in flight, and some chunk no usable holder has: waiting will not help."""
        if self._in_flight or not self._pending:
            return False
        live = [h for h in self._holders.values() if not h.out]
        return any(not any(h.has(d) for h in live) for d in self._pending)

    def pending(self) -> int:
        return len(self._pending)

    def next_asks(self, now: float) -> list[Ask]:
        """The asks to send now (possibly none), each marked in flight until it ends."""
        asks: list[Ask] = []
        if self._flying >= self._cap:
            return asks
        ready = [h for h in self._holders.values() if self._ready(h, now)]
        if not ready:
            return asks
        ranked = self._rank()
        while self._head < len(ranked) and ranked[self._head] not in self._pending:
            self._head += 1  # held since: never pending again
        for i in range(self._head, len(ranked)):
            digest = ranked[i]
            chunk = self._pending.get(digest)
            if chunk is None or digest in self._in_flight:
                continue
            if self._flying and self._flying + self.limits.parts(chunk) > self._cap:
                break
            choices = [h for h in ready if h.has(digest) and self._may_take(h, chunk, now)]
            if not choices:
                continue
            holder = min(choices, key=lambda h: (h.in_flight, h.served_bytes, h.name))
            self._take(holder, chunk, now)
            ask = Ask(holder.name, chunk)
            self._in_flight[digest] = ask
            asks.append(ask)
            if self._flying >= self._cap:
                break
            ready = [h for h in ready if self._ready(h, now)]
            if not ready:
                break
        return asks

    def wake_at(self, now: float) -> float | None:
        """When asking again may give something (a bucket refilled, a back-off over): ``None``
        when only an ask ending can."""
        if not self._pending or self._flying >= self._cap:
            return None
        times: list[float] = []
        for h in self._holders.values():
            if h.out or h.in_flight >= self._holder_cap:
                continue
            if not self._has_work(h):
                continue
            at = max(now, h.until)
            rate = self.limits.link_bytes_per_s
            if rate:
                need = max(1, self._max_chunk)
                self._refill(h, now)
                if h.tokens < need:
                    at = max(at, now + (need - h.tokens) / rate)
            times.append(at)
        return min(times) if times else None

    # -- answers ---------------------------------------------------------------------------------

    def got(self, ask: Ask, now: float) -> None:
        """The chunk arrived and is held."""
        self._end(ask)
        holder = self._holders.get(ask.holder)
        if holder is not None:
            holder.failures = 0
            holder.served_bytes += ask.chunk.length_bytes
        if self._pending.pop(ask.chunk.digest, None) is not None:
            self.held_bytes += ask.chunk.length_bytes
        self._arrived.append((now, ask.chunk.length_bytes, ask.holder))
        self.counts.by_holder[ask.holder] += ask.chunk.length_bytes

    def corrupt(self, ask: Ask) -> None:
        """The holder served bytes that are not the chunk: it is dropped for this manifest."""
        self._end(ask)
        self.counts.chunks_refused += 1
        holder = self._holders.get(ask.holder)
        if holder is not None and not holder.out:
            holder.out = True
            self.counts.holders_dropped += 1
            self._ranked = None

    def failed(self, ask: Ask, now: float) -> None:
        """The holder did not answer: it backs off, or is given up after too many in a row."""
        self._end(ask)
        self.counts.failures += 1
        holder = self._holders.get(ask.holder)
        if holder is None or holder.out:
            return
        holder.failures += 1
        if holder.failures >= self.limits.max_failures:
            holder.out = True
            self.counts.holders_given_up += 1
            self._ranked = None
            return
        wait = self.limits.backoff_s * 2 ** (holder.failures - 1)
        holder.until = max(holder.until, now + min(wait, self.limits.max_backoff_s))

    def returned(self, ask: Ask) -> None:
        """The ask went in one request with others that failed (the holder is charged once,
        with :meth:`failed`): the chunk goes back, nothing counted."""
        self._end(ask)

    def held_elsewhere(self, digest: str) -> None:
        """The chunk turned out to be held already (another fetch put it): nothing to ask."""
        chunk = self._pending.pop(digest, None)
        if chunk is not None:
            self.held_bytes += chunk.length_bytes

    # -- progress --------------------------------------------------------------------------------

    def progress(self, now: float) -> Progress:
        while self._arrived and self._arrived[0][0] < now - RATE_WINDOW_S:
            self._arrived.popleft()
        rate = 0.0
        if self._arrived:
            span = min(RATE_WINDOW_S, max(1.0, now - self._arrived[0][0]))
            rate = sum(n for _, n, _ in self._arrived) / span
        left = max(0, self.total_bytes - self.held_bytes)
        eta = 0.0 if left == 0 else (left / rate if rate > 0 else None)
        in_use = {a.holder for a in self._in_flight.values()} | {h for _, _, h in self._arrived}
        return Progress(self.held_bytes, self.total_bytes, rate, len(in_use), eta)

    # -- inside ----------------------------------------------------------------------------------

    @property
    def _cap(self) -> int:
        return self.limits.max_in_flight * SLOT_PARTS

    @property
    def _holder_cap(self) -> int:
        return self.limits.max_in_flight_per_holder * SLOT_PARTS

    def _end(self, ask: Ask) -> None:
        if self._in_flight.get(ask.chunk.digest) == ask:
            del self._in_flight[ask.chunk.digest]
            parts = self.limits.parts(ask.chunk)
            self._flying -= parts
            holder = self._holders.get(ask.holder)
            if holder is not None:
                holder.in_flight -= parts

    def _rank(self) -> list[str]:
        """Pending chunks, rarest first (then in manifest order); recomputed when holders
        change, pruned of the chunks held since."""
        if self._ranked is None:
            live = [h for h in self._holders.values() if not h.out]
            wholes = sum(1 for h in live if h.whole)
            partial: Counter[str] = Counter()
            for h in live:
                if not h.whole:
                    partial.update(d for d in h.chunks if d in self._pending)
            self._ranked = sorted(
                self._pending, key=lambda d: (wholes + partial[d], self._order[d])
            )
            self._head = 0
        return self._ranked

    def _burst(self) -> int:
        return max(self.limits.burst_bytes, self._max_chunk, 1)

    def _refill(self, h: _Holder, now: float) -> None:
        rate = self.limits.link_bytes_per_s
        if rate and now > h.refilled_at:
            h.tokens = min(float(self._burst()), h.tokens + (now - h.refilled_at) * rate)
        h.refilled_at = max(h.refilled_at, now)

    def _ready(self, h: _Holder, now: float) -> bool:
        """May ``h`` be asked now: usable, not backing off, under its cap, and (with a rate
        cap) its bucket holds a whole chunk, so that a ready holder never makes the asking
        scan every pending chunk for nothing."""
        if h.out or now < h.until or h.in_flight >= self._holder_cap:
            return False
        if not self.limits.link_bytes_per_s:
            return True
        self._refill(h, now)
        return h.tokens >= self._max_chunk

    def _may_take(self, h: _Holder, chunk: ChunkAt, now: float) -> bool:
        if h.in_flight and h.in_flight + self.limits.parts(chunk) > self._holder_cap:
            return False
        if not self.limits.link_bytes_per_s:
            return True
        self._refill(h, now)
        return h.tokens >= chunk.length_bytes

    def _take(self, h: _Holder, chunk: ChunkAt, now: float) -> None:
        parts = self.limits.parts(chunk)
        h.in_flight += parts
        self._flying += parts
        if self.limits.link_bytes_per_s:
            h.tokens -= chunk.length_bytes

    def _has_work(self, h: _Holder) -> bool:
        if h.whole:
            return len(self._pending) > len(self._in_flight)
        return any(d in self._pending and d not in self._in_flight for d in h.chunks)
