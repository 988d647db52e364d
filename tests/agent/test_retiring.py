"""Retiring ended jobs: every agent forgets a job long after it ended; its owner keeps it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.daemon.reads import STORED_ASKED_AT_MOST, Reads, newest_ended
from agent.job.jobspec import JobSpec, new_job_id
from agent.job.jobstate import JobState
from agent.job.ownership import rank
from agent.mesh.retiring import due
from agent.owning.ownedjob import OwnedJob
from tests.agent.agents import Mesh, spec
from tests.agent.authority_kit import Kit
from tests.shoal_cli import shoal


def _job(state: str, finished_at: float | None, submitted_at: float = 0.0) -> dict[str, object]:
    return {"state": state, "finished_at": finished_at, "submitted_at": submitted_at}


def test_an_ended_job_is_retired_once_it_ended_long_enough_ago() -> None:
    jobs = {
        "old": _job("succeeded", 100.0),
        "new": _job("failed", 950.0),
        "cancelled": _job("cancelled", None, submitted_at=10.0),  # never ran: its submission
        "running": _job("running", None),
        "pending": _job("pending", None),
    }
    assert sorted(due(jobs, now=1000.0, keep_s=600.0, kept=100)) == ["cancelled", "old"]
    assert due(jobs, now=1000.0, keep_s=5000.0, kept=100) == []


def test_no_more_ended_jobs_are_kept_than_the_bound_the_oldest_go_first() -> None:
    jobs = {f"j{i}": _job("succeeded", float(i)) for i in range(10)}
    jobs["running"] = _job("running", None)
    assert sorted(due(jobs, now=10.0, keep_s=3600.0, kept=7)) == ["j0", "j1", "j2"]
    assert sorted(due(jobs, now=10.0, keep_s=3600.0, kept=0)) == sorted(f"j{i}" for i in range(10))


def test_a_stored_copy_answers_for_an_ended_job_only_the_newest_generation() -> None:
    """Found by CI: an agent whose view had yet to hear of a pending job answered for it from
    its owner's store, so a test's "every agent knows it waits" held before one did."""
    old = {"state": "failed", "gen": 2}
    new = {"state": "succeeded", "gen": 5}
    assert newest_ended([None, old, new, {"state": "running", "gen": 9}, "junk"]) == new
    assert newest_ended([None, {"state": "pending", "gen": 1}]) is None
    assert newest_ended([]) is None


class _Holders:
    """Agents' stores as ``stored_job`` calls see them: who holds the ended copy."""

    def __init__(self, holders: set[str]) -> None:
        self.holders = holders
        self.asked: list[list[str]] = []

    async def call(self, addr: str, path: str, body: dict[str, str]) -> dict[str, Any]:
        assert path == "stored_job"
        self.asked[-1].append(addr)
        return {"job": {"state": "succeeded", "gen": 3} if addr in self.holders else None}


def _reads(nodes: list[str], holders: _Holders) -> Reads:
    store = SimpleNamespace(get_job=lambda job_id: None)  # not here, nor in the view
    ctx = SimpleNamespace(node_id="me", store=store, peers=holders, view=SimpleNamespace(jobs={}))
    mesh = SimpleNamespace(live_agents=lambda: ["me", *nodes], addr_of=lambda n: n)
    owner = SimpleNamespace(jobs={})
    return Reads(*cast(Any, (ctx, owner, None, None, mesh, None)))


async def _lookup(job_id: str, nodes: list[str], holders: _Holders) -> str | None:
    holders.asked.append([])
    found = await _reads(nodes, holders)._stored(job_id)
    return None if found is None else found["state"]


async def test_a_retired_jobs_copy_is_asked_of_its_ranked_agents_first_then_of_the_next() -> None:
    job_id = new_job_id()
    nodes = [f"n{i}" for i in range(12)]
    ranked = rank(job_id, nodes)
    with_replica = _Holders({ranked[1]})
    assert await _lookup(job_id, nodes, with_replica) == "succeeded"
    assert sorted(with_replica.asked[-1]) == sorted(ranked[:2])  # two calls, not twelve
    moved = _Holders({ranked[5]})  # agents joined ahead of its holders since: the next are asked
    assert await _lookup(job_id, nodes, moved) == "succeeded"
    assert sorted(moved.asked[-1]) == sorted(ranked[:STORED_ASKED_AT_MOST])
    nobody = _Holders(set())
    assert await _lookup(job_id, nodes, nobody) is None
    assert len(nobody.asked[-1]) == STORED_ASKED_AT_MOST  # not one call per agent
    too_far = _Holders({ranked[STORED_ASKED_AT_MOST]})
    assert await _lookup(job_id, nodes, too_far) is None
    nobody.asked.append([])
    with pytest.raises(ValueError, match="32 lowercase hex"):  # the API's 400
        await _reads(nodes, nobody).job("../" + job_id[3:])
    assert nobody.asked[-1] == []  # a malformed id: nobody asked


def test_own_jobs_are_listed_before_their_records_go_out_and_not_after_retiring() -> None:
    """Found by CI: a job just submitted to an agent was missing from that agent's list until
    its record had gone out (``shoal submit`` then ``shoal jobs`` could miss it)."""
    new, running, retired = new_job_id(), new_job_id(), new_job_id()

    def owned(job_id: str, state: JobState, at: float) -> OwnedJob:
        return OwnedJob(job_id, JobSpec(("true",)), state, 1, "me", None, submitted_at=at, gen=2)

    mine = {
        new: owned(new, JobState.PENDING, 3.0),  # no record out yet
        running: owned(running, JobState.RUNNING, 2.0),  # its record out, an older state
        retired: owned(retired, JobState.SUCCEEDED, 1.0),  # every agent retired it
    }
    ctx = SimpleNamespace(
        node_id="me", view=SimpleNamespace(jobs={running: mine[running].to_json()})
    )
    ctx.view.jobs[running]["state"] = "placing"  # what its record said at gen 2: listed as is
    reads = Reads(*cast(Any, (ctx, SimpleNamespace(jobs=mine), None, None, None, None)))

    def listed() -> list[tuple[str, str]]:
        return [(d.status.job_id, d.status.state) for d in reads.jobs()]

    assert listed() == [(running, "placing"), (new, "pending")]
    ctx.view.jobs[running]["gen"] = 1  # the owner has saved it since (gen 2): its own copy
    assert listed() == [(running, "running"), (new, "pending")]


@pytest.mark.slow
def test_agents_retire_an_ended_job_and_its_owner_still_answers_for_it(tmp_path: Path) -> None:
    config = tmp_path / "retire.toml"
    config.write_text("ended_jobs_keep_s = 2\n")
    mesh = Mesh(tmp_path / "mesh", ["h100:1", "h100:1", "h100:1"], extra=("--config", str(config)))
    mesh.start_all()
    try:
        a = mesh.agents[0]
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec([sys.executable, "-c", "pass"], gpus=0)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("succeeded", lambda: mesh.job(a, job_id)["state"] == "succeeded")
        owner = mesh.job(a, job_id)["owner"]

        def listed(agent_index: int) -> bool:
            jobs = mesh.get(mesh.agents[agent_index], "/v1/jobs")["jobs"]
            return any(j["job_id"] == job_id for j in jobs)

        mesh.wait("retired everywhere", lambda: not any(listed(i) for i in range(3)))
        # its owner's store keeps it: any agent finds it there, with its log on its runner
        assert mesh.job(mesh.agents[mesh.node_index(owner)], job_id)["state"] == "succeeded"
        for x in mesh.agents:
            assert mesh.job(x, job_id)["state"] == "succeeded"
            assert mesh.request(x, "GET", f"/v1/jobs/{job_id}/logs")[0] == 200
        assert mesh.job(a, new_job_id())["status"] == 404  # never was
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        done = shoal("jobs", job_id, *flags)
        assert done.returncode == 0 and "succeeded" in done.stdout, done.stderr
        assert shoal("logs", job_id, *flags).returncode == 0
        metrics = "\n".join(mesh.request(x, "GET", "/metrics")[1].decode() for x in mesh.agents)
        retired = [
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("shoal_gossip_records_retired_total")
        ]
        assert len(retired) == 3 and all(n >= 2 for n in retired)  # its sub/ and job/ records
        tombstones = [
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("shoal_gossip_records_tombstones ")
        ]
        assert len(tombstones) == 3 and all(n >= 2 for n in tombstones)
        # a job submitted after it is unaffected
        later = new_job_id()
        body = {"job_id": later, "spec": spec([sys.executable, "-c", "pass"], gpus=0)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("the next job succeeded", lambda: mesh.job(a, later)["state"] == "succeeded")
    finally:
        mesh.stop_all()


def test_the_authority_forgets_the_verified_submissions_of_retired_jobs(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    me = kit.agent("a")
    authority = kit.authority(me.node_id, lambda: [me.node_id], me)
    job_id = new_job_id()
    sealed = kit.submission(job_id, JobSpec(command=("true",)))
    first = authority.submission(sealed, job_id)
    assert authority.submission(sealed, job_id) is first  # verified once, then remembered
    authority.forget([job_id])
    again = authority.submission(sealed, job_id)
    assert again is not first and again.job_id == job_id  # verified anew
