"""The chaos benchmark's checks on ledgers and records written by hand: each one finds what it
looks for."""

from __future__ import annotations

import json
from pathlib import Path

from bench.chaosledger import (
    Ledger,
    checkpoint_disorders,
    finished,
    overlaps,
    reruns_after_success,
)
from bench.chaosverdict import attempt_ended_after


def _ledger(tmp_path: Path, lines: list[dict[str, object]]) -> Ledger:
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ledger = Ledger(path)
    ledger.read_new()
    return ledger


def _line(kind: str, attempt: int, pid: int, t: float, **more: object) -> dict[str, object]:
    return {"job": "j1", "attempt": attempt, "pid": pid, "kind": kind, "t": t, **more}


def test_a_restart_after_the_first_run_died_is_no_overlap(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 1, 10, 100.0, resumed_from=None, cwd="/a/agent-00/jobs/j1"),
            _line("step", 1, 10, 101.0, step=1),
            _line("start", 2, 20, 105.0, resumed_from=1, cwd="/a/agent-01/jobs/j1"),
            _line("end", 2, 20, 108.0, how="done", step=4),
        ],
    )
    run1 = ledger.runs[("j1", 1, 10)]
    ledger.seen(run1, alive=True, now=102.0)
    ledger.seen(run1, alive=False, now=102.2)
    assert overlaps(ledger.runs.values()) == []
    assert checkpoint_disorders(ledger.runs.values()) == []
    assert run1.gone_t == 102.2 and run1.ended


def test_a_run_seen_alive_after_the_next_one_started_is_an_overlap(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 1, 10, 100.0, resumed_from=None),
            _line("start", 2, 20, 105.0, resumed_from=None),
        ],
    )
    ledger.seen(ledger.runs[("j1", 1, 10)], alive=True, now=106.5)  # no line since 100.0
    found = overlaps(ledger.runs.values())
    assert len(found) == 1
    assert found[0].first == (1, 10) and found[0].second == (2, 20)
    assert found[0].overlap_s == 1.5


def test_two_processes_of_one_attempt_at_once_are_an_overlap(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 3, 10, 100.0),
            _line("start", 3, 11, 100.5),
            _line("step", 3, 10, 101.0, step=1),
        ],
    )
    assert [(o.first, o.second) for o in overlaps(ledger.runs.values())] == [((3, 10), (3, 11))]


def test_a_resume_below_an_earlier_resume_point_is_out_of_order(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 1, 10, 100.0, resumed_from=None),
            _line("start", 2, 20, 110.0, resumed_from=5),
            _line("start", 3, 30, 120.0, resumed_from=3),
        ],
    )
    found = checkpoint_disorders(ledger.runs.values())
    assert len(found) == 1 and "below attempt 2's resume point 5" in found[0].line
    assert found[0].start_t == 120.0  # the resume that went back, for the partition's window


def test_an_older_attempt_resuming_behind_a_newer_one_is_out_of_order(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 3, 30, 100.0, resumed_from=None),
            _line("step", 3, 30, 101.0, step=1),
            _line("step", 3, 30, 102.0, step=2),
            _line("start", 2, 20, 103.0, resumed_from=1),
        ],
    )
    found = checkpoint_disorders(ledger.runs.values())
    assert len(found) == 1 and "later attempt 3 had written step 2" in found[0].line


def test_told_to_resume_without_a_checkpoint_is_out_of_order(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, [_line("start", 2, 20, 100.0, resumed_from=-1)])
    assert "found no checkpoint" in checkpoint_disorders(ledger.runs.values())[0].line


def test_lines_are_read_as_they_are_appended_and_garbage_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    first = json.dumps(_line("start", 1, 10, 100.0))
    path.write_text(first[:20])
    ledger = Ledger(path)
    assert ledger.read_new() == [] and ledger.runs == {}
    with path.open("a") as f:
        f.write(first[20:] + "\nnot json\n")
    assert [r.pid for r in ledger.read_new()] == [10]
    assert ledger.malformed == 1


def test_a_run_after_the_job_finished_is_a_rerun(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 1, 10, 100.0, resumed_from=None),
            _line("end", 1, 10, 107.0, how="done", step=14),
            _line("start", 2, 20, 110.0, resumed_from=None),
        ],
    )
    found = [r.line for r in reruns_after_success(ledger.runs.values())]
    assert found == ["j1 attempt 2 started 3.0 s after attempt 1 finished"]
    assert overlaps(ledger.runs.values()) == []  # not at once: only the rerun check sees it


def test_the_members_of_a_gang_run_at_once_and_are_no_overlap(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 1, 10, 100.0, rank=0),
            _line("start", 1, 11, 100.1, rank=1),
            _line("end", 1, 11, 104.0, how="done", step=8, rank=1),
            _line("end", 1, 10, 104.2, how="done", step=8, rank=0),
            _line("start", 2, 12, 103.0, rank=1),  # a second copy of rank 1 while it ran
        ],
    )
    found = overlaps(ledger.runs.values())
    assert [(o.first, o.second) for o in found] == [((1, 11), (2, 12))]
    assert reruns_after_success(ledger.runs.values()) == []


def test_a_gang_has_finished_only_once_every_member_did(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        [
            _line("start", 1, 10, 100.0, rank=0, world=2),
            _line("start", 1, 11, 100.1, rank=1, world=2),
            _line("end", 1, 11, 104.0, how="done", step=8, rank=1),  # rank 0 is killed
            _line("start", 2, 12, 106.0, rank=0, world=2),
            _line("start", 2, 13, 106.0, rank=1, world=2),
            _line("end", 2, 12, 110.0, how="done", step=8, rank=0),
            _line("end", 2, 13, 110.5, how="done", step=8, rank=1),
            _line("start", 3, 14, 111.0, rank=0, world=2),
        ],
    )
    ledger.seen(ledger.runs[("j1", 1, 10)], alive=False, now=104.5)
    assert finished(ledger.runs.values()) == (2, 110.5)
    assert [r.line for r in reruns_after_success(ledger.runs.values())] == [
        "j1 attempt 3 started 0.5 s after attempt 2 finished"
    ]


def test_the_requeue_is_read_from_the_end_of_the_attempt_on_the_killed_node() -> None:
    record = {
        "attempts": [
            {"attempt": 1, "node": "a", "started_at": 90.0, "finished_at": 95.0, "cause": "exit"},
            {"attempt": 2, "node": "k", "started_at": 96.0, "finished_at": 104.5, "cause": "lost"},
            {"attempt": 3, "node": "b", "started_at": 104.6, "finished_at": None, "cause": None},
        ]
    }
    assert attempt_ended_after(record, "k", 100.0) == 4.5
    assert attempt_ended_after(record, "a", 100.0) == 0.0  # it had ended before the kill
    assert attempt_ended_after(record, "b", 100.0) is None  # began after the kill
    assert attempt_ended_after(record, "b", 105.0) is None  # not ended
    assert attempt_ended_after({}, "k", 100.0) is None
