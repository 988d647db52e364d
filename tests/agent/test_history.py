"""The history core and its file: roll-ups, trimming and restarts under a fake clock."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent.history.history import (
    TIER_BY_NAME,
    UNSUPPORTED,
    HistoryCore,
    SeriesKey,
    decode,
    pick_tier,
    points,
    trim_before,
)
from agent.history.history_store import History, HistoryStore, QueryError

UTIL = SeriesKey("gpu.util_pct", "GPU-0")
TEMP = SeriesKey("gpu.temp_c", "GPU-0")
BW = SeriesKey("gpu.mem_bw_pct", "GPU-0")
T0 = 1_800_000_000 - 1_800_000_000 % 86_400  # midnight: every tier's block starts here


def _blocks(core: HistoryCore) -> dict[tuple[str, int], list[float]]:
    return {(b.tier, b.start_s): decode(TIER_BY_NAME[b.tier], b.data) for b in core.take_dirty()}


def test_seconds_roll_up_into_minutes_and_hours() -> None:
    core = HistoryCore()
    for t in range(0, 2 * 3600 + 61):  # hour 1 rolls up once a minute of hour 2 ended
        core.add(T0 + t, {UTIL: float(t % 60)})  # 0..59 every minute
    written = _blocks(core)
    minute = written[("m", T0)]
    assert minute[0:3] == [0.0, 29.5, 59.0]  # min, avg, max of minute 0
    assert all(not math.isnan(x) for x in minute)  # all 60 minutes of hour 0 filled
    hour = written[("h", T0)]
    assert hour[0:3] == [0.0, 29.5, 59.0]  # hour 0 rolled up once hour 1 ended
    assert [math.isnan(x) for x in hour[3:6]] == [False] * 3  # and hour 1
    assert all(math.isnan(x) for x in hour[6:])


def test_a_failed_reading_is_a_gap_and_unsupported_is_never_a_value() -> None:
    core = HistoryCore()
    core.add(T0, {UTIL: 50.0, TEMP: None, BW: UNSUPPORTED})
    core.add(T0 + 1, {UTIL: math.inf, TEMP: 60.0, BW: UNSUPPORTED})
    written = {(b.key, b.tier): decode(TIER_BY_NAME[b.tier], b.data) for b in core.take_dirty()}
    assert written[(UTIL, "s")][0] == 50.0 and math.isnan(written[(UTIL, "s")][1])
    assert math.isnan(written[(TEMP, "s")][0]) and written[(TEMP, "s")][1] == 60.0
    assert not any(key == BW for key, _ in written)
    assert core.supported[BW] is not None and core.supported[UTIL] is None
    assert core.counts.bad_values == 1


def test_a_late_sample_is_counted_not_stored() -> None:
    core = HistoryCore()
    core.add(T0 + 120, {UTIL: 1.0})
    core.take_dirty()
    core.add(T0 + 5, {UTIL: 2.0})
    assert core.take_dirty() == [] and core.counts.late_samples == 1


def test_what_history_drops_is_counted_by_reason(tmp_path: Path) -> None:
    history = History(tmp_path)
    history.sample(T0 + 120, {UTIL: 1.0})
    history.sample(T0 + 5, {UTIL: math.inf})
    history.sample(T0 + 6, {UTIL: 1.0})
    assert history.dropped() == {"late": 2, "not_finite": 1, "write_failed": 0}


def test_idle_blocks_roll_up_without_a_later_sample() -> None:
    core = HistoryCore()
    core.add(T0 + 3, {UTIL: 7.0})
    core.close_idle(T0 + 61)
    assert _blocks(core)[("m", T0)][0:3] == [7.0, 7.0, 7.0]


def test_trimming_keeps_each_tier_for_its_time(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    core = HistoryCore()
    day = 86_400
    for t in range(0, 40 * day, 30):  # 40 days, a sample every 30 s (fast-forwarded)
        core.add(T0 + t, {UTIL: 1.0})
        if t % 3600 == 0:
            store.write(core)
    core.close_idle(T0 + 40 * day)
    store.write(core)
    now = T0 + 40 * day
    store.trim(now)
    for tier, keep_s in (("s", day), ("m", 30 * day), ("h", 365 * day)):
        starts = [s for s, _ in store.blocks(tier, UTIL, 0, now)]
        span = TIER_BY_NAME[tier].span_s
        assert starts, tier
        assert min(starts) + span > now - keep_s  # nothing wholly older than its keep
        assert min(starts) <= now - min(keep_s, 40 * day) + span  # and what is younger stays
    assert trim_before(now)["s"] == now - day - 60 + 1


def test_history_survives_a_restart(tmp_path: Path) -> None:
    history = History(tmp_path)
    for t in range(0, 90):
        history.sample(T0 + t, {UTIL: float(t), BW: UNSUPPORTED})
    history.close(T0 + 90)
    again = History(tmp_path)
    for t in range(95, 130):
        again.sample(T0 + t, {UTIL: float(t), BW: UNSUPPORTED})
    again.flush(T0 + 200)
    [util, bw] = again.query(T0 + 200, [UTIL, BW], T0, T0 + 180, 60)
    assert [p.avg for p in util.points] == pytest.approx(
        [29.5, (sum(range(60, 90)) + sum(range(95, 120))) / 55, 124.5]
    )
    assert bw.unsupported is not None and bw.points == ()
    seconds = again.query(T0 + 200, [UTIL], T0 + 85, T0 + 100, 1)[0].points
    assert [p.avg for p in seconds] == [
        85,
        86,
        87,
        88,
        89,
        None,
        None,
        None,
        None,
        None,
        95,
        96,
        97,
        98,
        99,
    ]


def test_queries_pick_the_tier_that_holds_them() -> None:
    now = T0 + 100 * 86_400
    assert pick_tier(now, now - 3600, 1).name == "s"
    assert pick_tier(now, now - 3600, 120).name == "m"
    assert pick_tier(now, now - 2 * 86_400, 1).name == "m"
    assert pick_tier(now, now - 60 * 86_400, 60).name == "h"


def test_points_downsample_min_avg_max() -> None:
    core = HistoryCore()
    for t in range(60):
        core.add(T0 + t, {UTIL: float(t)})
    [block] = core.take_dirty()
    [a, b] = points(TIER_BY_NAME["s"], [(block.start_s, block.data)], T0, T0 + 60, 30)
    assert (a.min, a.avg, a.max) == (0.0, 14.5, 29.0) and (b.min, b.max) == (30.0, 59.0)


def test_bad_queries_are_one_line_errors(tmp_path: Path) -> None:
    history = History(tmp_path)
    with pytest.raises(QueryError, match="before"):
        history.query(T0, [UTIL], T0, T0, 1)
    with pytest.raises(QueryError, match="larger step"):
        history.query(T0, [UTIL], T0 - 100 * 365 * 86_400, T0, 1)


def test_the_query_and_the_answer_on_the_wire(tmp_path: Path) -> None:
    from agent.wire.codec import WireError
    from agent.wire.history import HistoryDoc, HistoryQuery

    query = HistoryQuery.from_params({"series": "gpu,host.cpu_pct", "step": "5"}, T0)
    assert (query.series, query.from_s, query.to_s, query.step_s) == (
        ("gpu", "host.cpu_pct"),
        T0 - 3600,
        T0,
        5,
    )
    assert HistoryQuery.from_params(query.to_params(), T0 + 99) == query
    for bad, field in (
        ({"from": "abc"}, "from"),
        ({"from": "5", "to": "4"}, "from"),
        ({"step": "0"}, "step"),
        ({"to": "inf"}, "to"),
        ({"series": "gpu;drop"}, "series"),
    ):
        with pytest.raises(WireError, match=field):
            HistoryQuery.from_params(bad, T0)
    history = History(tmp_path)
    history.sample(T0 + 1, {UTIL: 5.0, BW: UNSUPPORTED})
    doc = history.answer(
        HistoryQuery.from_params({"from": str(T0), "to": str(T0 + 3), "step": "1"}, T0 + 3),
        "node-a",
        {0: "GPU-0"},
        T0 + 3,
    )
    assert HistoryDoc.from_wire(doc.to_wire()) == doc
    assert [s.name for s in doc.series] == ["gpu.mem_bw_pct", "gpu.util_pct"]
    assert doc.series[1].points[1] == (T0 + 1, 5.0, 5.0, 5.0)
    by_index = history.answer(
        HistoryQuery((), None, "0", None, T0, T0 + 3, 1), "node-a", {0: "GPU-0"}, T0 + 3
    )
    assert len(by_index.series) == 2
    with pytest.raises(QueryError, match="no device 7"):
        history.answer(HistoryQuery((), None, "7", None, T0, T0 + 3, 1), "n", {}, T0 + 3)
    with pytest.raises(QueryError, match="answers for itself"):
        history.answer(HistoryQuery((), "other", None, None, T0, T0 + 3, 1), "n", {}, T0 + 3)


def test_a_series_long_gone_is_forgotten_in_memory_then_on_disk(tmp_path: Path) -> None:
    job = SeriesKey("job.progress_pct", "f" * 32)
    history = History(tmp_path)
    history.sample(T0, {job: 10.0, UTIL: 1.0, BW: UNSUPPORTED})
    for t in range(1, 3 * 86_400, 600):  # the job ended; the GPU goes on
        history.sample(T0 + t, {UTIL: 1.0, BW: UNSUPPORTED})
    history.flush(T0 + 3 * 86_400)
    assert job not in history.core.supported and BW in history.core.supported
    history.store.trim(T0 + 400 * 86_400, history.core.supported.keys())
    assert job not in history.store.series()  # no block left, not sampled: gone
    assert BW in history.store.series()  # unsupported has no block, but is still sampled


def test_an_unusable_file_is_moved_aside_and_history_starts_afresh(tmp_path: Path) -> None:
    from agent.history.history_store import FILE_NAME, open_history

    (tmp_path / FILE_NAME).write_bytes(b"not a database at all" * 100)
    history = open_history(tmp_path, T0)
    history.sample(T0, {UTIL: 3.0})
    history.close(T0 + 1)
    assert (tmp_path / f"{FILE_NAME}.unusable-{T0}").read_bytes().startswith(b"not a database")
    assert History(tmp_path).query(T0 + 1, [UTIL], T0, T0 + 1, 1)[0].points[0].avg == 3.0


def test_the_answer_carries_each_gpus_hints_when_asked(tmp_path: Path) -> None:
    from agent.history.history_hints import GpuFacts
    from agent.wire.history import HistoryQuery

    history = History(tmp_path)
    cpu = SeriesKey("host.cpu_pct")
    for t in range(400):
        history.sample(T0 + t, {UTIL: 0.5, TEMP: 50.0, BW: UNSUPPORTED, cpu: 10.0})
    history.flush(T0 + 400)
    query = HistoryQuery((), None, None, None, T0, T0 + 400, 60, hints=True)
    held = history.answer(query, "n", {}, T0 + 400, {"GPU-0": GpuFacts(allocated=True)})
    assert [(h.device, h.rule, h.unjudged) for h in held.hints] == [
        ("GPU-0", "idle_allocated", False),
        ("GPU-0", "memory_bandwidth_bound", True),  # the GPU does not expose it
        ("GPU-0", "power_capped", True),
        ("GPU-0", "pcie_bound", True),
        ("host", "host_memory_pressure", True),  # nor memory, in this store
    ]
    free = history.answer(query, "n", {}, T0 + 400, {"GPU-0": GpuFacts(allocated=False)})
    assert "idle_allocated" not in {h.rule for h in free.hints}
    assert history.answer(query._replace(hints=False), "n", {}, T0 + 400).hints == ()
