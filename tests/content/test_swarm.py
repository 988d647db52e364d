"""The swarm planner with a fake clock: rarest first, several holders, caps, a corrupt holder
dropped, a failing one backing off, and the progress a waiting job shows."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.content.manifest import ChunkAt
from agent.content.swarm import Ask, Progress, Swarm, SwarmLimits

CHUNK = 1000


def _chunks(n: int, last: int = CHUNK) -> list[ChunkAt]:
    return [ChunkAt(f"{i:064x}", 0, i * CHUNK, last if i == n - 1 else CHUNK) for i in range(n)]


def _swarm(n: int, limits: SwarmLimits | None = None) -> Swarm:
    chunks = _chunks(n)
    return Swarm(
        chunks, total_bytes=sum(c.length_bytes for c in chunks), held_bytes=0, limits=limits
    )


def _drain(swarm: Swarm, now: float = 0.0) -> list[Ask]:
    """Answer every ask at once until done; every ask made, in order."""
    made: list[Ask] = []
    for _ in range(10_000):
        asks = swarm.next_asks(now)
        if not asks:
            break
        made.extend(asks)
        for a in asks:
            swarm.got(a, now)
    return made


def test_rarest_chunk_goes_first() -> None:
    chunks = _chunks(4)
    swarm = Swarm(chunks, total_bytes=4 * CHUNK, held_bytes=0, limits=SwarmLimits(max_in_flight=1))
    swarm.add_holder("a", whole=True, now=0)
    swarm.add_holder("b", whole=False, chunks=[c.digest for c in chunks[:3]], now=0)
    swarm.add_holder("c", whole=False, chunks=[chunks[0].digest, chunks[1].digest], now=0)
    order = [a.chunk.digest for a in _drain(swarm)]
    # chunk 3: only a has it; chunk 2: a and b; chunks 0 and 1: all three, in manifest order.
    assert order == [chunks[3].digest, chunks[2].digest, chunks[0].digest, chunks[1].digest]
    assert swarm.done and swarm.held_bytes == 4 * CHUNK


def test_the_work_is_spread_over_every_holder_within_the_caps() -> None:
    swarm = _swarm(30, SwarmLimits(max_in_flight=6, max_in_flight_per_holder=2))
    for h in "abc":
        swarm.add_holder(h, whole=True, now=0)
    first = swarm.next_asks(0)
    assert len(first) == 6
    assert Counter(a.holder for a in first) == {"a": 2, "b": 2, "c": 2}
    assert swarm.next_asks(0) == []  # the caps hold until an ask ends
    for a in first:
        swarm.got(a, 0)
    served = Counter(a.holder for a in first + _drain(swarm))
    assert served == {"a": 10, "b": 10, "c": 10}
    assert len({a.chunk.digest for a in first}) == 6


def test_a_link_is_capped_by_its_token_bucket() -> None:
    swarm = _swarm(
        10, SwarmLimits(link_bytes_per_s=2 * CHUNK, max_in_flight=16, max_in_flight_per_holder=16)
    )
    swarm.add_holder("a", whole=True, now=0)
    got = swarm.next_asks(0)
    assert len(got) == 1  # the bucket holds one chunk
    for a in got:
        swarm.got(a, 0)
    assert swarm.next_asks(0.1) == []
    wake = swarm.wake_at(0.1)
    assert wake == pytest.approx(0.5)
    asks = swarm.next_asks(wake or 0)
    assert len(asks) == 1
    # Over 4 s at 2 chunks/s, about 8 chunks and never more than the bucket allows.
    now, n = 0.5, 2
    swarm.got(asks[0], now)
    while now < 4.0:
        now += 0.05
        for a in swarm.next_asks(now):
            n += 1
            swarm.got(a, now)
    assert 8 <= n <= 9


def test_a_corrupt_holder_is_dropped_and_its_chunk_fetched_elsewhere() -> None:
    swarm = _swarm(4, SwarmLimits(max_in_flight=2, max_in_flight_per_holder=1))
    swarm.add_holder("bad", whole=True, now=0)
    swarm.add_holder("good", whole=True, now=0)
    asks = swarm.next_asks(0)
    bad = next(a for a in asks if a.holder == "bad")
    swarm.corrupt(bad)
    assert swarm.holders() == ["good"]
    assert swarm.counts.holders_dropped == 1 and swarm.counts.chunks_refused == 1
    for a in asks:
        if a.holder == "good":
            swarm.got(a, 0)
    rest = _drain(swarm)
    assert {a.holder for a in rest} == {"good"}
    assert bad.chunk.digest in {a.chunk.digest for a in rest}
    assert swarm.done
    swarm.add_holder("bad", whole=True, now=1)  # told again: still dropped
    assert swarm.holders() == ["good"]


def test_a_failing_holder_backs_off_then_is_given_up() -> None:
    limits = SwarmLimits(max_in_flight=1, backoff_s=1.0, max_failures=3)
    swarm = _swarm(2, limits)
    swarm.add_holder("gone", whole=True, now=0)
    (a,) = swarm.next_asks(0)
    swarm.failed(a, 0)
    assert swarm.next_asks(0.5) == []
    assert swarm.wake_at(0.5) == pytest.approx(1.0)
    (a,) = swarm.next_asks(1.0)
    swarm.failed(a, 1.0)
    assert swarm.wake_at(1.0) == pytest.approx(3.0)  # doubled
    (a,) = swarm.next_asks(3.0)
    swarm.failed(a, 3.0)
    assert swarm.holders() == [] and swarm.counts.holders_given_up == 1
    assert swarm.stuck and not swarm.done


def test_a_chunk_no_holder_has_leaves_the_swarm_stuck_not_spinning() -> None:
    chunks = _chunks(2)
    swarm = Swarm(chunks, total_bytes=2 * CHUNK, held_bytes=0)
    swarm.add_holder("p", whole=False, chunks=[chunks[0].digest], now=0)
    _drain(swarm)
    assert swarm.pending() == 1 and swarm.stuck
    assert swarm.wake_at(0) is None


def test_progress_says_rate_holders_and_eta() -> None:
    swarm = _swarm(100)
    for h in "abc":
        swarm.add_holder(h, whole=True, now=0)
    now = 0.0
    while swarm.held_bytes < 43 * CHUNK:
        now += 0.1
        for a in swarm.next_asks(now)[:3]:
            swarm.got(a, now)
    p = swarm.progress(now)
    assert isinstance(p, Progress)
    assert p.held_bytes >= 43 * CHUNK and p.total_bytes == 100 * CHUNK
    assert p.holders_in_use == 3
    assert p.rate_bytes_per_s == pytest.approx(30 * CHUNK, rel=0.1)
    assert p.eta_s == pytest.approx((100 * CHUNK - p.held_bytes) / p.rate_bytes_per_s)
    line = p.line("imagenet")
    assert line.startswith("staging imagenet 4") and "kB/s from 3 holders, ~" in line


def test_progress_line_units() -> None:
    p = Progress(43, 100, 1.2e9, 3, 40.2)
    assert p.line("imagenet") == "staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)"
    assert Progress(0, 10, 0.0, 1, None).line("x") == "staging x 0% (0 B/s from 1 holder)"


def test_resumed_swarm_asks_only_what_is_missing() -> None:
    chunks = _chunks(10)
    swarm = Swarm(chunks[6:], total_bytes=10 * CHUNK, held_bytes=6 * CHUNK)
    swarm.add_holder("a", whole=True, now=0)
    asked = {a.chunk.digest for a in _drain(swarm)}
    assert asked == {c.digest for c in chunks[6:]}
    assert swarm.progress(0).held_bytes == 10 * CHUNK


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="in flight"):
        SwarmLimits(max_in_flight=0)


def test_with_a_slot_small_chunks_go_many_at_a_time_and_big_ones_one_slot_each() -> None:
    """A working folder's thousand small files would otherwise be fetched four at a time."""
    limits = SwarmLimits(max_in_flight=2, max_in_flight_per_holder=1, slot_bytes=64 * CHUNK)
    small = _swarm(100, limits)
    small.add_holder("a", whole=True, now=0)
    first = small.next_asks(0)
    assert len(first) == 64  # each 1/64 of a slot: a slot's worth from the one holder
    assert small.next_asks(0) == []
    small.returned(first[0])  # went back with a request of others that failed: asked again
    assert [a.chunk for a in small.next_asks(0)] == [first[0].chunk]
    big = Swarm(
        [ChunkAt(f"{i:064x}", 0, 0, 64 * CHUNK) for i in range(4)],
        total_bytes=4 * 64 * CHUNK,
        held_bytes=0,
        limits=limits,
    )
    big.add_holder("a", whole=True, now=0)
    big.add_holder("b", whole=True, now=0)
    assert sorted(a.holder for a in big.next_asks(0)) == ["a", "b"]  # one slot each, as before
