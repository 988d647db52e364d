"""The chaos benchmark, small: real agents, a kill -9 and a partition; its invariants hold."""

from __future__ import annotations

import json

import pytest

from bench.chaos import main
from bench.chaosverdict import traceback_line


@pytest.mark.slow
def test_chaos_keeps_its_invariants(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--nodes", "4", "--jobs", "10", "--kill", "1", "--partition-s", "5", "--seed", "2"]
    code = main([*args, "--settle-s", "120", "--json"])
    out = json.loads(capsys.readouterr().out)
    for key in (
        "jobs_submitted", "jobs_succeeded", "jobs_lost", "jobs_run_twice_concurrently",
        "max_recovery_s", "max_requeue_s", "checkpoints_out_of_order", "faults", "invariants",
    ):  # fmt: skip
        assert key in out
    assert out["jobs_submitted"] >= 5, out["details"]["submit_failures"]
    assert out["runs"] >= out["jobs_submitted"]  # every job's process wrote to the ledger
    assert out["jobs_lost"] == 0, out["details"]
    # A partition may run a job on each side (at-least-once): outside one, never twice at once.
    assert out["jobs_run_twice_concurrently_outside_partition"] == 0, out["details"]["run_twice"]
    assert out["jobs_run_again_after_success_outside_partition"] == 0, out["details"]
    assert out["checkpoints_out_of_order_outside_partition"] == 0, out["details"]
    assert out["invariants"]["checkpoints_in_order_outside_partition"]
    assert out["report_not_owned_lines"] == 0
    kills = [f for f in out["faults"] if f["fault"] == "kill"]
    partitions = [f for f in out["faults"] if f["fault"] == "partition"]
    assert len(kills) == 1 and "skipped" not in kills[0], kills
    assert kills[0]["rejoin_s"] is not None
    if kills[0]["jobs_running_there"]:
        back = kills[0]["jobs_back"]  # each job's own time; the slowest is the fault's
        for job in back:
            # A live owner ends the attempt before it runs the job again. An owner killed with
            # its runner may not: the owner taking over holds a copy from before that attempt
            # (a kill in its first instants), and the killed one writes its end once back. A job
            # whose record names no ended attempt there (``requeue_s`` None) has nothing to check.
            if job["requeue_s"] is not None and not job["owned_there"]:
                assert job["requeue_s"] <= job["recovery_s"] + 0.5, json.dumps(kills)
        assert {b["job"] for b in back} <= set(kills[0]["jobs_running_there"]), back
        assert back and back[0]["recovery_s"] == kills[0]["recovery_s"], back
    assert len(partitions) == 1 and partitions[0]["heal_converged_s"] is not None
    assert out["max_recovery_s"] is not None
    assert out["invariants"] == dict.fromkeys(out["invariants"], True), out["details"]
    assert code == 0


def test_an_agents_traceback_is_counted_by_where_it_was_raised_and_what() -> None:
    log = [
        "2026-12-04 21:48:06,281 shoal.owner ERROR a step of a job's work failed",
        "Traceback (most recent call last):",
        '  File "/x/agent/owner.py", line 10, in step',
        "    await go()",
        '  File "/x/agent/placing.py", line 20, in go',
        "    raise KeyError(job)",
        "KeyError: 'ff2f365f388442429cda96c6a2b8d1f1'",
        "2026-12-04 21:48:07,000 shoal.events INFO next",
    ]
    assert traceback_line(log, 1) == (
        'Traceback: File "/x/agent/placing.py", line 20, in go: '
        "KeyError: 'ff2f365f388442429cda96c6a2b8d1f1'"
    )
