"""ReplayGuard: one acceptance per command id, a skew window, and bounded memory."""

from __future__ import annotations

import pytest

from gossip.replay import DEFAULT_WINDOW_S, ReplayGuard, Verdict


def test_default_window_is_two_minutes() -> None:
    assert DEFAULT_WINDOW_S == 120.0
    assert ReplayGuard().window_s == 120.0


def test_accepts_once_then_rejects_the_replay() -> None:
    guard = ReplayGuard()
    assert guard.check("c1", 1000.0, 1000.0) is Verdict.ACCEPTED
    assert guard.check("c1", 1000.0, 1001.0) is Verdict.REPLAYED
    assert guard.check("c2", 1000.0, 1001.0) is Verdict.ACCEPTED
    assert len(guard) == 2


def test_skew_window_edges() -> None:
    guard = ReplayGuard(window_s=120.0)
    now = 10_000.0
    assert guard.check("old", now - 120.5, now) is Verdict.STALE
    assert guard.check("ahead", now + 120.5, now) is Verdict.FUTURE
    assert guard.check("edge-old", now - 120.0, now) is Verdict.ACCEPTED
    assert guard.check("edge-new", now + 120.0, now) is Verdict.ACCEPTED
    assert len(guard) == 2  # refusals are not remembered


def test_judge_remembers_nothing() -> None:
    guard = ReplayGuard()
    assert guard.judge("c", 5.0, 5.0) is Verdict.ACCEPTED
    assert guard.check("c", 5.0, 5.0) is Verdict.ACCEPTED


def test_ids_are_forgotten_once_stale_and_a_replay_is_still_refused() -> None:
    guard = ReplayGuard(window_s=120.0)
    for i in range(50):
        assert guard.check(f"c{i}", 1000.0 + i, 1000.0 + i) is Verdict.ACCEPTED
    assert len(guard) == 50
    # 121 s after c0 was issued, c0 is forgotten, and its replay is stale, not accepted.
    assert guard.check("c0", 1000.0, 1121.0) is Verdict.STALE
    assert len(guard) == 49
    assert guard.check("late", 2000.0, 2000.0) is Verdict.ACCEPTED
    assert len(guard) == 1


def test_hard_cap_evicts_oldest_and_never_accepts_a_replay() -> None:
    guard = ReplayGuard(window_s=120.0, max_entries=3)
    now = 500.0
    for i, t in enumerate([401.0, 402.0, 403.0]):
        assert guard.check(f"c{i}", t, now) is Verdict.ACCEPTED
    assert guard.check("c3", 404.0, now) is Verdict.ACCEPTED  # evicts c0 (issued 401)
    assert len(guard) == 3
    assert guard.check("c0", 401.0, now) is Verdict.STALE  # forgotten, yet not accepted
    assert guard.check("c1", 402.0, now) is Verdict.REPLAYED
    assert guard.check("older", 400.5, now) is Verdict.STALE  # below the floor
    assert len(guard) == 3


def test_flood_stays_bounded() -> None:
    guard = ReplayGuard(window_s=120.0, max_entries=100)
    now = 1_000_000.0
    for i in range(5_000):
        verdict = guard.check(f"id{i}", now - 60.0 + i * 0.01, now)
        assert verdict is Verdict.ACCEPTED
        assert len(guard) <= 100
    for i in range(5_000):
        assert guard.check(f"id{i}", now - 60.0 + i * 0.01, now) is not Verdict.ACCEPTED


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        ReplayGuard(window_s=0)
    with pytest.raises(ValueError):
        ReplayGuard(max_entries=0)
