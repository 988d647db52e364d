"""The cache rules, pure: watermarks, least recently used weighted by uses, and what is never
evicted; and the agent's config refusing a bad budget in one line."""

from __future__ import annotations

import pytest

from agent.common.errors import UserError
from agent.content.cache import CacheEntry, CacheRules, budget_from_share, plan_eviction
from agent.daemon.config import config_from_mapping

GIB = 1 << 30


def _entry(d: str, gib: int, last_use_s: float, uses: int = 0, **kw: bool) -> CacheEntry:
    return CacheEntry(d, gib * GIB, last_use_s, uses, **kw)


def test_nothing_goes_until_the_high_watermark_then_down_to_the_low_one() -> None:
    rules = CacheRules(100 * GIB)
    entries = [_entry(f"d{i}", 10, float(i)) for i in range(10)]
    assert plan_eviction(entries, 90 * GIB, rules, now=100.0) == ()
    # 95 held: over 90, so evict down to 70: the three least recently used
    assert plan_eviction(entries, 95 * GIB, rules, now=100.0) == ("d0", "d1", "d2")
    assert plan_eviction(entries, 50 * GIB, rules, now=100.0, force=True) == ()


def test_popularity_keeps_a_dataset_used_often_over_one_used_once_more_recently() -> None:
    rules = CacheRules(100 * GIB)
    popular = _entry("popular", 30, last_use_s=0.0, uses=100)
    once = _entry("once", 30, last_use_s=50.0, uses=1)
    recent = _entry("recent", 35, last_use_s=99.0, uses=0)
    assert plan_eviction([popular, once, recent], 95 * GIB, rules, now=100.0) == ("once",)


def test_pinned_protected_and_local_origin_are_never_evicted() -> None:
    rules = CacheRules(100 * GIB)
    entries = [
        _entry("pinned", 40, 0.0, pinned=True),
        _entry("local", 40, 0.0, local=True),
        _entry("needed", 10, 0.0),
        _entry("free", 10, 1.0),
    ]
    assert plan_eviction(entries, 100 * GIB, rules, now=10.0, protected={"needed"}) == ("free",)


@pytest.mark.parametrize(
    ("budget", "high", "low", "why"),
    [(0, 0.9, 0.7, "positive"), (GIB, 0.7, 0.9, "low < high"), (GIB, 1.5, 0.7, "low < high")],
)
def test_bad_rules_are_refused(budget: int, high: float, low: float, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        CacheRules(budget, high, low)


def test_a_share_of_the_disk_is_a_budget() -> None:
    assert budget_from_share(0.5, 1000 * GIB) == 500 * GIB
    with pytest.raises(ValueError, match="above 0 and at most 1"):
        budget_from_share(0.0, GIB)


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"store_budget_bytes": 0}, "store_budget_bytes must be a whole number of bytes above 0"),
        ({"store_budget_bytes": "10G"}, "store_budget_bytes must be a whole number"),
        ({"store_budget_share": 1.5}, "store_budget_share must be a number above 0"),
        ({"store_high": 0.5, "store_low": 0.6}, "store_low must be less than store_high"),
    ],
)
def test_the_agent_config_refuses_a_bad_budget_in_one_line(
    doc: dict[str, object], said: str
) -> None:
    with pytest.raises(UserError, match=said) as caught:
        config_from_mapping(doc)
    assert "\n" not in str(caught.value)
    ok = config_from_mapping({"store_budget_bytes": 10 * GIB, "store_high": 0.8})
    assert ok.store_budget_bytes == 10 * GIB and ok.store_high == 0.8
