"""The agent's SQLite store: written, closed, reopened from a real file; reconcile after restart."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent.job.jobspec import JobSpec, new_job_id
from agent.job.jobstate import UNENDED_JOB_STATES, JobState
from agent.storage.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    JobRecord,
    ResultRecord,
    RunRecord,
    Store,
    StoreError,
    process_alive,
    reconcile,
)

NODE = "n-3f2a9c"
PEER = "n-77b0e1"
SPEC = JobSpec.from_toml(
    """
command = ["python", "train.py"]
kind = "training"
priority = 5
max_runtime_s = "2h"
[resources]
gpus_per_node = 2
min_mem_per_gpu_bytes = "40GiB"
backends = ["cuda", "rocm"]
"""
)


def job(job_id: str, state: JobState, owner: str = NODE, submitted_at: float = 100.0) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        spec=SPEC,
        state=state,
        attempt=1,
        owner=owner,
        runner=PEER,
        submitted_at=submitted_at,
        updated_at=submitted_at + 1,
    )


def test_write_close_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "agent.sqlite"
    a, b, c = new_job_id(), new_job_id(), new_job_id()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 4
        assert store.node_id() is None
        assert store.boot_count() == 0
        store.set_node_id(NODE)
        assert store.next_boot() == 1
        store.put_job(job(a, JobState.RUNNING, submitted_at=100.0))
        store.put_job(job(b, JobState.PENDING, owner=PEER, submitted_at=50.0))
        store.put_job(job(c, JobState.SUCCEEDED, submitted_at=200.0))
        store.record_run(RunRecord(a, 1, 4242, 4242, 101.5, "/data/jobs/a/output.log"))
        store.finish_run(ResultRecord(c, 1, 0, None, "exit", 150.0, 199.0))

    with Store(path) as store:
        assert store.node_id() == NODE
        assert store.boot_count() == 1
        assert store.next_boot() == 2
        got = store.get_job(a)
        assert got == job(a, JobState.RUNNING)
        assert got is not None and got.spec.resources.min_mem_per_gpu_bytes == 42_949_672_960
        assert [r.job_id for r in store.jobs()] == [b, a, c]  # by submission time
        assert [r.job_id for r in store.jobs(owner=NODE)] == [a, c]
        assert [r.job_id for r in store.jobs(states=[JobState.PENDING])] == [b]
        assert [r.job_id for r in store.jobs(owner=NODE, states=[JobState.PENDING])] == []
        assert store.running_jobs() == [
            RunRecord(a, 1, 4242, 4242, 101.5, "/data/jobs/a/output.log")
        ]
        assert store.results() == [ResultRecord(c, 1, 0, None, "exit", 150.0, 199.0)]
        assert store.results(c)[0].ok
        assert store.get_job(new_job_id()) is None
        store.delete_job(b)
        assert [r.job_id for r in store.jobs()] == [a, c]

    # WAL is a property of the file, seen by any connection.
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def test_the_jobs_not_ended_are_found_by_an_index_in_a_store_of_an_older_schema_too(
    tmp_path: Path,
) -> None:
    """The owner's sweep asks for the jobs not ended every second; the table keeps every job
    ended here, so a scan grew with the agent's history (50,000 jobs: 10 ms a sweep, 1% of a
    core while idle)."""
    path = tmp_path / "agent.sqlite"
    raw = sqlite3.connect(path)
    for statements in MIGRATIONS[:3]:
        for statement in statements:
            raw.execute(statement)
    raw.execute("PRAGMA user_version = 3")
    raw.commit()
    raw.close()
    running, ended = new_job_id(), new_job_id()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        store.put_job(job(running, JobState.RUNNING))
        store.put_job(job(ended, JobState.SUCCEEDED))
        assert [r.job_id for r in store.jobs(states=UNENDED_JOB_STATES)] == [running]
        states = ", ".join(f"'{s.value}'" for s in UNENDED_JOB_STATES)
        plan = store._db.execute(
            f"EXPLAIN QUERY PLAN SELECT job_id FROM jobs WHERE state IN ({states})"
        ).fetchall()
        assert any("USING INDEX jobs_by_state" in str(row) for row in plan), plan


def test_the_jobs_held_nothing_newer_of_than_a_time_and_forgetting_them(tmp_path: Path) -> None:
    def ended_at(job_id: str, finished_at: float, attempt: int = 1) -> ResultRecord:
        return ResultRecord(job_id, attempt, 0, None, "exit", finished_at - 5.0, finished_at)

    ids = [new_job_id() for _ in range(8)]
    old, new, unended, running, ran_here, ran_again, replica_live, old_first = ids
    with Store(tmp_path / "agent.sqlite") as store:
        store.put_job(job(old, JobState.SUCCEEDED, submitted_at=10.0))  # written at 11
        store.put_job(job(old_first, JobState.FAILED, submitted_at=1.0))  # written at 2
        store.put_job(job(new, JobState.SUCCEEDED, submitted_at=900.0))
        store.put_job(job(unended, JobState.PENDING, submitted_at=10.0))
        store.put_job(job(running, JobState.CANCELLED, submitted_at=10.0))
        store.record_run(RunRecord(running, 2, 4242, 4242, 12.0, "/log"))  # still runs here
        store.finish_run(ended_at(ran_here, 20.0))  # ran here, no record: owned elsewhere
        store.finish_run(ended_at(ran_again, 20.0))
        store.finish_run(ended_at(ran_again, 950.0, attempt=2))
        store.finish_run(ended_at(replica_live, 20.0))
        store.put_job(job(replica_live, JobState.RUNNING, owner=PEER, submitted_at=10.0))

        assert store.ended_before(500.0, limit=10) == [old_first, old, ran_here]
        assert store.ended_before(500.0, limit=1) == [old_first]
        assert store.ended_before(1.0, limit=10) == []

        store.forget_jobs([old, ran_here])
        assert store.get_job(old) is None and store.results(ran_here) == []
        assert store.ended_before(500.0, limit=10) == [old_first]
        assert store.get_job(new) is not None and len(store.results(ran_again)) == 2


def test_put_job_replaces_the_record(tmp_path: Path) -> None:
    a = new_job_id()
    with Store(tmp_path / "s.sqlite") as store:
        store.put_job(job(a, JobState.PENDING))
        store.put_job(job(a, JobState.PLACING))
        assert [(r.job_id, r.state) for r in store.jobs()] == [(a, JobState.PLACING)]


def test_a_job_row_that_does_not_decode_is_left_out_counted_and_replaceable(
    tmp_path: Path,
) -> None:
    """One row a spec this version cannot read (or garbage) spoils no read of the others."""
    path = tmp_path / "s.sqlite"
    bad, good = new_job_id(), new_job_id()
    with Store(path) as store:
        store.put_job(job(bad, JobState.RUNNING, submitted_at=1.0))  # read first
        store.put_job(job(good, JobState.RUNNING, submitted_at=2.0))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET spec = '{\"command\": 7}' WHERE job_id = ?", (bad,))
    db.close()
    with Store(path) as store:
        assert [r.job_id for r in store.jobs(states=UNENDED_JOB_STATES)] == [good]
        assert store.get_job(bad) is None
        assert store.unreadable_jobs == 2
        store.put_job(job(bad, JobState.PENDING))  # a copy received later replaces it
        assert store.get_job(bad) is not None and len(store.jobs()) == 2


def test_finish_run_moves_the_run_to_results(tmp_path: Path) -> None:
    a = new_job_id()
    with Store(tmp_path / "s.sqlite") as store:
        store.record_run(RunRecord(a, 2, 10, 10, 5.0, "log"))
        store.finish_run(ResultRecord(a, 2, None, "SIGKILL", "cancel", 5.0, 9.0))
        assert store.running_jobs() == []
        (result,) = store.results(a)
        assert (result.exit_code, result.signal, result.cause, result.ok) == (
            None,
            "SIGKILL",
            "cancel",
            False,
        )


def test_node_id_cannot_change(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        store.set_node_id(NODE)
        store.set_node_id(NODE)  # the same again is fine
        with pytest.raises(StoreError, match=f"belongs to node {NODE}, not {PEER}"):
            store.set_node_id(PEER)
        assert store.node_id() == NODE


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    Store(path).close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="written by a newer Shoal \\(schema 99; this one knows"):
        Store(path)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"this is not sqlite at all, not even a little" * 100)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        Store(path)


@pytest.mark.skipif(sys.platform == "win32", reason="uses the POSIX sleep command")
def test_reconcile_after_restart_with_a_live_and_a_dead_process(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite"
    live_job, dead_job, done_job = new_job_id(), new_job_id(), new_job_id()
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    dead = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with Store(path) as store:
            store.record_run(RunRecord(live_job, 1, live.pid, live.pid, 10.0, "a.log"))
            store.record_run(RunRecord(dead_job, 3, dead.pid, dead.pid, 11.0, "b.log"))
            store.finish_run(ResultRecord(done_job, 1, 0, None, "exit", 1.0, 2.0))
        dead.kill()
        dead.wait(5)

        with Store(path) as store:  # the agent restarted
            found = reconcile(store, process_alive, now=500.0)
            assert [r.job_id for r in found.alive] == [live_job]
            assert [(r.job_id, r.attempt, r.pid) for r in found.gone] == [(dead_job, 3, dead.pid)]
            assert [r.job_id for r in store.running_jobs()] == [live_job]
            assert store.results(dead_job) == [
                ResultRecord(dead_job, 3, None, None, "lost", 11.0, 500.0)
            ]
            assert store.results(done_job) == [ResultRecord(done_job, 1, 0, None, "exit", 1.0, 2.0)]
            # Reconciling again reports nothing new as gone.
            again = reconcile(store, process_alive, now=600.0)
            assert again.gone == ()
            assert [r.job_id for r in again.alive] == [live_job]
    finally:
        for proc in (live, dead):
            proc.kill()
            proc.wait(5)
    assert not process_alive(live.pid, live.pid)


def test_reconcile_uses_the_given_liveness_check(tmp_path: Path) -> None:
    a, b = new_job_id(), new_job_id()
    asked: list[tuple[int, int | None]] = []

    def alive(pid: int, pgid: int | None) -> bool:
        asked.append((pid, pgid))
        return pid == 1001

    with Store(tmp_path / "s.sqlite") as store:
        store.record_run(RunRecord(a, 1, 1001, 1001, 1.0, "a"))
        store.record_run(RunRecord(b, 1, 1002, None, 2.0, "b"))
        found = reconcile(store, alive, now=3.0)
    assert asked == [(1001, 1001), (1002, None)]
    assert [r.job_id for r in found.alive] == [a]
    assert [r.job_id for r in found.gone] == [b]
