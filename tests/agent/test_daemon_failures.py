"""Real agent processes on loopback: drain, runner and owner crashes, restart from SQLite."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from tests.agent.agents import Mesh, spec, tick_spans

pytestmark = pytest.mark.slow

TICKER = """
import os, sys, time
path = sys.argv[1]
attempt = os.environ["SHOAL_ATTEMPT"]
for _ in range(600):
    with open(path, "a") as f:
        f.write(f"{attempt} {time.time()}\\n")
    print("tick", attempt, flush=True)
    time.sleep(0.05)
"""


def test_drain_moves_work_off_and_takes_no_new_work(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        job_id = new_job_id()
        assert (
            mesh.command(a, "submit", {"job_id": job_id, "spec": spec(["sleep", "60"])})[0] == 200
        )
        mesh.wait("running", lambda: mesh.job(a, job_id)["state"] == "running")
        source = mesh.job(a, job_id)["runner"]
        other = next(x for x in mesh.agents if x.node_id != source)
        status, answer = mesh.command(a, "drain", {"node": source, "grace_s": 0})
        assert status == 200 and answer == {"node": source, "drain": "draining"}
        mesh.wait(
            "the job to run elsewhere",
            lambda: (
                mesh.job(a, job_id)["runner"] == other.node_id
                and mesh.job(a, job_id)["state"] == "running"
            ),
        )
        assert mesh.job(a, job_id)["attempt"] == 2
        nodes = {n["node_id"]: n for n in mesh.get(other, "/v1/nodes")["nodes"]}
        mesh.wait(
            "drained",
            lambda: (
                {n["node_id"]: n for n in mesh.get(other, "/v1/nodes")["nodes"]}[source]["drain"]
                == "drained"
            ),
        )
        # The only free GPU is on the drained node: a new job waits instead of going there.
        second = new_job_id()
        assert mesh.command(a, "submit", {"job_id": second, "spec": spec(["true"])})[0] == 200
        mesh.wait(
            "a pending reason",
            lambda: "free GPU" in (mesh.job(a, second).get("reason") or ""),
        )
        assert mesh.job(a, second)["state"] == "pending"
        status, answer = mesh.command(other, "undrain", {"node": source})
        assert status == 200 and answer["drain"] == "schedulable"
        mesh.wait("placed after undrain", lambda: mesh.job(a, second)["state"] == "succeeded")
        assert mesh.job(a, second)["runner"] == source
        assert nodes[source]["role"] == "agent"
    finally:
        mesh.stop_all()


def test_kill_of_a_runner_requeues_elsewhere_never_twice_at_once(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        ticks = tmp_path / "ticks"
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec([sys.executable, "-c", TICKER, str(ticks)])}
        assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
        mesh.wait("running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
        # Running, and ticking: on a busy machine the job's interpreter takes a while to start.
        mesh.wait("attempt 1 ticking", lambda: 1 in tick_spans(ticks))
        first = mesh.job(mesh.agents[0], job_id)["runner"]
        mesh.kill(mesh.node_index(first))
        survivor = next(x for x in mesh.agents if x.running)
        # The next attempt (2, or later where a start was declined unconfirmed and offered
        # again under a new number) runs elsewhere.
        mesh.wait(
            "a next attempt running elsewhere",
            lambda: (
                (j := mesh.job(survivor, job_id))["state"] == "running"
                and j["attempt"] >= 2
                and j["runner"] != first
            ),
            deadline_s=40,
        )
        again = mesh.job(survivor, job_id)["attempt"]
        mesh.wait("the next attempt ticking", lambda: again in tick_spans(ticks))
        spans = tick_spans(ticks)
        assert set(spans) == {1, again}  # no other attempt ever ran
        assert spans[1][1] < spans[again][0]  # attempt 1 was gone before the next began
    finally:
        mesh.stop_all()


def test_kill_of_the_owner_right_after_the_ack_loses_nothing(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec(["sleep", "1"])}
        status, answer = mesh.command(mesh.agents[0], "submit", body)
        assert status == 200 and answer["replicas"] == 2
        owner = answer["owner"]
        mesh.kill(mesh.node_index(owner))
        survivor = next(x for x in mesh.agents if x.running)
        mesh.wait(
            "the job to succeed under a new owner",
            lambda: (
                (j := mesh.job(survivor, job_id))["state"] == "succeeded" and j["owner"] != owner
            ),
            deadline_s=40,
        )
    finally:
        mesh.stop_all()


def test_a_restarted_agent_reconciles_from_its_store(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        a, b = mesh.agents
        # A finished job on b, then one running on b when b is killed.
        done = new_job_id()
        body = {"job_id": done, "spec": spec(["echo", "kept"])}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.command(a, "drain", {"node": a.node_id, "grace_s": 0})
        mesh.wait("done", lambda: mesh.job(a, done)["state"] == "succeeded")
        # b, which may own the next job, must know a takes no work, or it may offer it there
        # first (declined: attempt 2 would then be b's).
        mesh.wait(
            "b to see a drained",
            lambda: (
                {n["node_id"]: n for n in mesh.get(b, "/v1/nodes")["nodes"]}[a.node_id]["drain"]
                == "drained"
            ),
        )
        pidfile = tmp_path / "pid"
        script = (
            f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(60)"
        )
        running = new_job_id()
        body = {"job_id": running, "spec": spec([sys.executable, "-c", script])}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("running on b", lambda: mesh.job(a, running)["runner"] == b.node_id)
        mesh.wait("pid written", lambda: pidfile.exists() and pidfile.read_text() != "")
        pid = int(pidfile.read_text())
        runner_index = mesh.node_index(b.node_id)
        mesh.kill(runner_index)
        # The job dies with its agent (PR_SET_PDEATHSIG); on other systems the restarted agent
        # kills what survived of the job's process group. Either way it must be gone.
        mesh.wait("the orphan gone", lambda: not _alive(pid))
        mesh.start(runner_index)
        mesh.command(a, "undrain", {"node": a.node_id})
        mesh.wait(
            "the lost job requeued and running again",
            lambda: (j := mesh.job(a, running))["state"] == "running" and j["attempt"] == 2,
            deadline_s=40,
        )
        # The finished result and its log survived the restart.
        mesh.wait(
            "the old log served by the restarted runner",
            lambda: b"kept" in mesh.request(b, "GET", f"/v1/jobs/{done}/logs?lines=20")[1],
        )
    finally:
        mesh.stop_all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours would still answer; the orphan's parent is init
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_replica_back_after_a_long_absence_takes_nothing_over_before_it_hears_the_mesh(
    tmp_path: Path,
) -> None:
    """Found by ``bench.chaos``: a replica killed while its job ran, restarted more than
    ``UNHEARD_OWNER_GRACE_S`` later, took its stored copy for one of a gone owner at its first
    sweep (its view still empty), found the runner not live either, and ran the job again
    beside the first attempt. The grace counts from the agent's own start too."""
    from agent.job.jobspec import Resources
    from agent.job.ownership import rank
    from agent.owning.owner import UNHEARD_OWNER_GRACE_S

    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "mi300x:1"])  # the job runs on cuda only
    mesh.start_all()
    try:
        ids = [a.node_id for a in mesh.agents]
        while True:  # the ROCm agent is its replica, so the kill leaves the job running
            job_id = new_job_id()
            if rank(job_id, ids)[1] == ids[2]:
                break
        ticks = tmp_path / "ticks"
        resources = Resources(gpus_per_node=1, backends=("cuda",))
        argv = [sys.executable, "-c", TICKER, str(ticks)]
        body = {"job_id": job_id, "spec": spec(argv, resources=resources)}
        assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
        mesh.wait("attempt 1 ticking", lambda: 1 in tick_spans(ticks))
        mesh.kill(2)
        time.sleep(UNHEARD_OWNER_GRACE_S + 1)  # its copy is now older than the grace
        others = [a.process for a in mesh.agents[:2] if a.process is not None]
        for p in others:  # it hears no one for a while, as on a busy machine
            p.send_signal(signal.SIGSTOP)
        try:
            mesh.start(2)
            time.sleep(4)
        finally:
            for p in others:
                p.send_signal(signal.SIGCONT)
        mesh.wait_converged()
        time.sleep(5)  # sweeps, a takeover if any, and a placement would all have run
        job = mesh.job(mesh.agents[2], job_id)
        assert (job["state"], job["attempt"]) == ("running", 1), job
        assert set(tick_spans(ticks)) == {1}
    finally:
        mesh.stop_all()
