"""The history panel's padding: samples stay where they are in time within the window."""

from __future__ import annotations

from agent.cli.history_cmd import chart_lines
from agent.wire.history import HistoryDoc, HistorySeries
from tui.history import padded


def test_a_young_nodes_minute_is_drawn_at_the_right_end_of_the_hour() -> None:
    points = tuple((3540 + 6 * i, 1.0, float(i), 9.0) for i in range(10))  # the last minute
    doc = HistoryDoc("n", 0, 3600, (HistorySeries("gpu.util_pct", "k", None, "raw", 6, points),))
    full = padded(doc).series[0].points
    assert len(full) == 600 and full[-10:] == points
    assert all(p[1:] == (None, None, None) for p in full[:-10])
    spark = chart_lines(padded(doc), 62)[1]  # 60 cells of 10 steps: the minute is the last
    assert len(spark) == 62 and spark[:-1].strip() == "" and spark[-1] != " "
    # unpadded, the same minute is drawn from the left edge, as if it were the hour
    assert chart_lines(doc, 62)[1][2:12].strip() != ""
