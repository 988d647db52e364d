"""``bench.tui`` runs at a tiny size and reports every field the benchmark table needs."""

from __future__ import annotations

from bench.tui import run


async def test_bench_tui_reports_render_and_keystroke_percentiles() -> None:
    result = await run(hosts=3, rounds=2, seed=1, size=(100, 30))
    assert result["hosts"] == 3 and result["gpus"] == 24  # BENCH_PROFILES: 8 GPUs per host
    for field in ("render_ms", "keystroke_ms", "snapshot_build_ms", "data_to_screen_ms"):
        stats = result[field]
        assert 0 < stats["p50"] <= stats["p99"] <= stats["max"]
    assert result["render_ms"]["n"] == 8  # 2 rounds x 4 views
    assert (
        result["keystroke_ms"]["n"] == 4 * 9 + 6 + 7
    )  # 9 per view, then ":gpus" + enter and ":hosts" + enter
    assert set(result["render_ms_by_view"]) == {"topology", "hosts", "gpus", "jobs"}
    assert result["bars"] == {"render_ms_p99": 50.0, "keystroke_ms_p99": 100.0}
    assert isinstance(result["render_ok"], bool) and isinstance(result["keystroke_ok"], bool)
    # Every refresh is also reported with the build of the snapshot it shows.
    assert result["data_to_screen_ms"]["n"] == 8
    assert result["data_to_screen_ms"]["p50"] > result["render_ms"]["p50"]
    assert result["full_gc_ms"] > 0
    assert len(result["gc_in_steps"]["collections_by_generation"]) == 3
