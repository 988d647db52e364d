"""Letting ended jobs go from disk: long after it was retired, an ended job's rows and folders
leave every agent that held them, and so does an old folder no row names; a job still running
keeps everything."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from agent.job.jobstate import JobState
from agent.storage import purging
from agent.storage.store import ResultRecord, RunRecord, Store
from tests.agent.agents import Mesh, spec
from tests.agent.test_store import job
from tests.shoal_cli import one_line_error, shoal


def _held_until(path: Path) -> list[str]:
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.1)"
    return [sys.executable, "-c", code]


def _stored(directory: Path, job_id: str) -> bool:
    with Store(directory / "agent.sqlite") as store:
        return store.get_job(job_id) is not None or bool(store.results(job_id))


@pytest.mark.slow
def test_an_ended_job_leaves_every_disk_and_a_running_one_keeps_its_folder(tmp_path: Path) -> None:
    config = tmp_path / "purge.toml"
    config.write_text("ended_jobs_keep_s = 1\nended_jobs_disk_keep_s = 5\n")
    mesh = Mesh(tmp_path / "mesh", ["h100:1", "h100:1"], extra=("--config", str(config)))
    mesh.start_all()
    try:
        a = mesh.agents[0]
        # A folder no row names (a launch that failed before any result), long unchanged; and
        # a folder not named for a job.
        stray, other = a.directory / "jobs" / new_job_id(), a.directory / "jobs" / "not-a-job"
        for made in (stray, other):
            made.mkdir(parents=True)
            (made / "output.log").write_text("[shoal] attempt 1 cannot start\n")
            os.utime(made, (time.time() - 60, time.time() - 60))
        ended, running = new_job_id(), new_job_id()
        precious = tmp_path / "precious"  # outside every agent's data folder
        precious.mkdir()
        (precious / "keep").write_text("x")
        code = (
            "import os; open('made-by-the-job', 'w').write('x'); "
            f"os.symlink({str(precious)!r}, 'a-link-out'); print('hello')"
        )
        argv = [sys.executable, "-c", code]
        for job_id, command in ((ended, argv), (running, _held_until(tmp_path / "release"))):
            body = {"job_id": job_id, "spec": spec(command, gpus=1)}
            assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("the first job succeeded", lambda: mesh.job(a, ended)["state"] == "succeeded")
        runner = mesh.agents[mesh.node_index(mesh.job(a, ended)["runner"])]
        folder = runner.directory / "jobs" / ended
        assert (folder / "made-by-the-job").exists() and (folder / "output.log").exists()
        assert (folder / "a-link-out" / "keep").exists()
        assert all(_stored(x.directory, ended) for x in mesh.agents)  # owner and replica
        mesh.wait("the second job runs", lambda: mesh.job(a, running)["state"] == "running")

        mesh.wait("the ended job's folder is gone", lambda: not folder.exists(), 40.0)
        assert (precious / "keep").read_text() == "x"  # a link it left is not followed
        mesh.wait(
            "its rows are gone from every store",
            lambda: not any(_stored(x.directory, ended) for x in mesh.agents),
        )
        for x in mesh.agents:
            assert mesh.job(x, ended)["status"] == 404
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        for command in ("logs", "jobs"):
            assert ended[:8] in one_line_error(shoal(command, ended, *flags))

        mesh.wait("the stray folder is gone", lambda: not stray.exists(), 40.0)
        assert (other / "output.log").exists()

        live = mesh.agents[mesh.node_index(mesh.job(a, running)["runner"])]
        assert (live.directory / "jobs" / running / "output.log").exists()
        assert mesh.job(a, running)["state"] == "running"
        (tmp_path / "release").touch()
        mesh.wait("the running job ends well", lambda: mesh.job(a, running)["state"] == "succeeded")
    finally:
        mesh.stop_all()


def test_old_folders_are_real_folders_named_for_jobs_and_strays_are_named_by_nothing(
    tmp_path: Path,
) -> None:
    jobs = tmp_path / "jobs"
    old, new, recorded, ran, running, listed = (new_job_id() for _ in range(6))
    for job_id in (old, new, recorded, ran, running, listed, "not-a-job"):
        (jobs / job_id).mkdir(parents=True)
    (jobs / new_job_id()).write_text("a file")
    (jobs / new_job_id()).symlink_to(tmp_path)
    then = time.time() - 100
    for entry in jobs.iterdir():
        os.utime(entry, (then, then), follow_symlinks=False)
    os.utime(jobs / new)  # changed now
    found = purging.old_folders(jobs, time.time() - 50)
    assert sorted(found) == sorted([old, recorded, ran, running, listed])
    assert len(purging.old_folders(jobs, time.time() - 50, limit=2)) == 2

    with Store(tmp_path / "agent.sqlite") as store:
        store.put_job(job(recorded, JobState.SUCCEEDED))
        store.finish_run(ResultRecord(ran, 1, 0, None, "exit", 1.0, 2.0))
        store.record_run(RunRecord(running, 1, 4242, 4242, 1.0, "/log"))
        strays = purging.stray_folders(store, found, {listed: {}}, set())
    assert strays == [old]
