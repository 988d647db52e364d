"""Accounting without processes: the book a runner keeps (energy from measured power, shared
devices divided, open rows across a restart) and the sums ``shoal usage`` makes of many
agents' rows (deduplicated, cut to the window, split at UTC midnight)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.history.usage_book import UsageBook
from agent.operator.usage import grand_total, since_s, totals
from agent.wire.codec import WireError
from agent.wire.usage import UsageDoc, UsageRow

MIDNIGHT = datetime(2026, 12, 6, tzinfo=UTC).timestamp()


def row(job: str, start: float, end: float | None, **kw: object) -> UsageRow:
    base = UsageRow(job, 1, "n1", "p1", "alice", "vision", "H100", 1.0, start, end, None)
    return base._replace(**kw)  # type: ignore[arg-type]


def test_rows_are_split_at_midnight_cut_to_the_window_and_counted_once() -> None:
    rows = [
        row("a", MIDNIGHT - 600, MIDNIGHT + 1200, gpus=2.0, energy_j=3600.0),
        row("a", MIDNIGHT - 600, None, gpus=2.0),  # the same attempt, an open copy: counted once
        row("b", MIDNIGHT + 100, None, name="bob", team="nlp"),  # still running: up to now
        row("c", MIDNIGHT - 9000, MIDNIGHT - 8000),  # ended before the window
    ]
    now = MIDNIGHT + 400
    found = totals(rows, "user", MIDNIGHT - 3600, now)
    assert [(t.day, t.key, t.gpu_s, t.attempts) for t in found] == [
        ("2026-12-05", "alice", 1200.0, 1),
        ("2026-12-06", "alice", 800.0, 1),  # cut at now
        ("2026-12-06", "bob", 300.0, 1),
    ]
    assert found[0].energy_j == pytest.approx(3600.0 * 600 / 1800)
    assert found[2].energy_j is None
    total = grand_total(found)
    assert total.gpu_s == 2300.0 and total.attempts == 3
    assert {t.key for t in totals(rows, "team", 0, now)} == {"vision", "nlp"}
    assert {t.key for t in totals(rows, None, 0, now)} == {"all"}


def test_since() -> None:
    assert since_s("30d", 1e9) == 1e9 - 30 * 86400
    assert since_s("12h", 1e9) == 1e9 - 12 * 3600
    assert since_s("2026-12-06", 0) == MIDNIGHT
    with pytest.raises(ValueError, match="a duration"):
        since_s("last week", 0)


def test_a_usage_answer_decodes_only_through_bounded_readers() -> None:
    doc = UsageDoc("n1", 5.0, (row("a", 1.0, 2.0),)).to_wire()
    assert UsageDoc.decode(doc).rows[0] == row("a", 1.0, 2.0)
    doc["rows"][0]["gpus"] = -1
    with pytest.raises(WireError, match="negative"):
        UsageDoc.decode(doc)
    doc["rows"][0]["attempt"] = 2**60
    with pytest.raises(WireError, match="out of range"):
        UsageDoc.decode(doc)


def test_the_book_measures_energy_and_keeps_open_rows_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite"
    book = UsageBook(path, "n1", lambda p: ("alice", "vision") if p == "p1" else (None, None))
    book.opened("a", 1, "p1", "H100", 1.0, ("gpu0",), 100.0)
    book.opened("b", 1, "p2", "H100", 0.5, ("gpu0",), 100.0)  # a share of the same GPU
    book.opened("c", 1, None, "L4", 1.0, ("gpu1",), 100.0)
    book.opened("d", 1, None, "H100", 1.0, ("gpu2",), 105.0)
    book.sample(100.0, {"gpu0": 300_000, "gpu1": None, "gpu2": 200_000})
    # 300 W for 10 s, shared by two jobs; d: 200 W from its start
    book.sample(110.0, {"gpu0": 300_000, "gpu1": None, "gpu2": 200_000})
    book.closed("a", 1, 100.5, 110.0)
    book.closed("d", 1, 105.0, 112.0)  # and on to its end at the last power measured
    book.closed("zz", 1, 0.0, 1.0)  # never opened here: not counted
    rows, truncated = book.rows(0.0)
    assert not truncated
    a, b, c, d = sorted(rows)
    assert d.energy_j == pytest.approx(200.0 * 7)
    assert (a.started_at, a.finished_at, a.energy_j) == (100.5, 110.0, 1500.0)
    assert (a.name, a.team) == ("alice", "vision") and b.name is None
    assert b.finished_at is None and b.energy_j == 1500.0
    assert c.energy_j is None  # no power measured
    book.close()
    again = UsageBook(path, "n1")
    again.closed("b", 1, 100.0, 120.0)  # the open row outlived the restart
    rows, _ = again.rows(0.0)
    assert {r.job_id: r.finished_at for r in rows} == {
        "a": 110.0,
        "b": 120.0,
        "c": None,
        "d": 112.0,
    }
    assert again.rows(115.0)[0] and {r.job_id for r in again.rows(115.0)[0]} == {"b", "c"}
    again.purge(112.0 + 400 * 86400 + 1)
    assert {r.job_id for r in again.rows(0.0)[0]} == {"b", "c"}
    again.close()
