"""The retransmit-limited broadcast queue: what it picks, in which order, and when it forgets."""

from __future__ import annotations

from gossip.broadcast import BroadcastQueue
from tests.gossip.helpers import alive, dead, suspect


def test_class_first_then_fewest_transmissions_then_newest() -> None:
    q = BroadcastQueue(3)
    q.push("d", dead("d", 1, "x"), 100, 2)
    q.push("s", suspect("s", 1, "x"), 100, 1)
    q.push("a1", alive("a1", 1), 100, 0)
    q.push("a2", alive("a2", 1), 100, 0)
    first = q.take(budget=210, limit=5)  # room for two: the alives, newest first
    assert [u.node for u in first] == ["a2", "a1"]  # type: ignore[union-attr]
    # they stay first, being of the first class, however often they were sent
    again = q.take(budget=210, limit=5)
    assert sorted(u.node for u in again) == ["a1", "a2"]  # type: ignore[union-attr]
    q.push("a3", alive("a3", 1), 100, 0)  # never sent: ahead of a1 and a2 now
    assert [u.node for u in q.take(budget=210, limit=5)] == ["a3", "a2"]  # type: ignore[union-attr]
    for key in ("a1", "a2", "a3"):
        q.drop(key)
    assert [u.node for u in q.take(budget=210, limit=5)] == ["s", "d"]  # type: ignore[union-attr]


def test_each_update_is_sent_limit_times_then_dropped() -> None:
    q = BroadcastQueue(1)
    q.push("a", alive("a", 1), 50, 0)
    sent = [q.take(budget=1024, limit=3) for _ in range(5)]
    assert [len(s) for s in sent] == [1, 1, 1, 0, 0]
    assert len(q) == 0


def test_a_newer_update_replaces_the_queued_one_and_starts_over() -> None:
    q = BroadcastQueue(3)
    q.push("n", alive("n", 1), 50, 0)
    q.take(budget=1024, limit=2)
    newer = suspect("n", 1, "x")
    q.push("n", newer, 50, 1)
    assert len(q) == 1
    assert q.take(budget=1024, limit=2) == [newer]
    assert q.take(budget=1024, limit=2) == [newer]
    assert q.take(budget=1024, limit=2) == []


def test_the_budget_bounds_the_bytes_and_skips_what_does_not_fit() -> None:
    q = BroadcastQueue(1)
    q.push("big", alive("big", 1), 900, 0)
    q.push("small", alive("small", 1), 100, 0)
    got = q.take(budget=500, limit=5)
    assert [u.node for u in got] == ["small"]  # type: ignore[union-attr]
    # first in line now, the big one goes even though it exceeds the budget: alone
    assert [u.node for u in q.take(budget=500, limit=5)] == ["big"]  # type: ignore[union-attr]
    # both sent once now: the newer one first, and both fit a bigger budget
    assert [u.node for u in q.take(budget=1024, limit=5)] == ["big", "small"]  # type: ignore[union-attr]


def test_an_update_larger_than_the_budget_is_sent_alone_and_drains() -> None:
    q = BroadcastQueue(1)
    q.push("inv", alive("inv", 1), 3000, 0)
    for _ in range(3):
        assert [u.node for u in q.take(budget=1024, limit=3)] == ["inv"]  # type: ignore[union-attr]
    assert len(q) == 0


def test_entries_spread_over_many_transmit_counts_are_all_found() -> None:
    q = BroadcastQueue(1)
    for i in range(6):
        q.push(f"n{i}", alive(f"n{i}", 1), 10, 0)
        q.take(budget=10 + 2, limit=20)  # send only the newest, once
    # now each entry sits at a different transmit count; a big budget takes every one
    assert sorted(u.node for u in q.take(budget=4096, limit=20)) == [  # type: ignore[union-attr]
        f"n{i}" for i in range(6)
    ]
    q.prune(lambda key, u: key != "n3")
    assert len(q) == 5
