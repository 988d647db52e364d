"""Accounting on real agents: each runner keeps a row per attempt, durably, and ``shoal usage``
sums every agent's rows to the jobs' own records, to the second, by user, team and model."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from agent.wire.policy import Person
from tests.agent.agents import Mesh, spec
from tests.agent.people_kit import PersonAt, body, policy_command, signed_by
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

SHORT = [sys.executable, "-c", "import time; time.sleep(1.5)"]


def _usage(mesh: Mesh, *extra: str) -> str:
    done = shoal(
        "usage",
        "--since",
        "1d",
        "--identity",
        str(mesh.cluster_dir),
        "--agent",
        mesh.agents[0].address,
        *extra,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stderr == "", done.stderr  # every agent answered
    return done.stdout


def gpu_s_of(mesh: Mesh, job_ids: list[str]) -> float:
    """GPU-seconds by the jobs' own records: every attempt's run time times its GPUs (1)."""
    total = 0.0
    for job_id in job_ids:
        doc = mesh.job(mesh.agents[0], job_id)
        for attempt in doc["attempts"]:
            total += attempt["finished_at"] - attempt["started_at"]
    return total


def test_usage_adds_up_to_the_jobs_own_records(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        alice, bob = PersonAt(mesh, "alice"), PersonAt(mesh, "bob")
        people = (
            Person("root", "ops", "admin", mesh.operator.node_id),
            Person("alice", "vision", "user", alice.node_id),
            Person("bob", "nlp", "user", bob.node_id),
        )
        status, answer = mesh.command(
            mesh.agents[0], "policy", policy_command(signed_by(mesh.operator, body(1, *people)))
        )
        assert status == 200, answer
        mesh.wait(
            "policy everywhere",
            lambda: all(mesh.get(a, "/v1/policy")["version"] == 1 for a in mesh.agents),
        )
        jobs: dict[str, list[str]] = {"alice": [], "bob": []}
        for who, person in (("alice", alice), ("bob", bob), ("alice", alice)):
            job_id = new_job_id()
            status, error = person.command(
                mesh.agents[1], "submit", {"job_id": job_id, "spec": spec(SHORT, gpus=1)}
            )
            assert status == 200, error
            jobs[who].append(job_id)
        every = jobs["alice"] + jobs["bob"]
        mesh.wait(
            "every job succeeded",
            lambda: all(mesh.job(mesh.agents[0], j)["state"] == "succeeded" for j in every),
            60,
        )
        want = {who: gpu_s_of(mesh, ids) for who, ids in jobs.items()}
        assert want["alice"] > 2.5 and want["bob"] > 1.0
        doc = json.loads(_usage(mesh, "--json"))
        # The runner keeps the very times it reported to the owner: equal, well within a second.
        assert abs(doc["total"]["gpu_s"] - sum(want.values())) < 0.01
        assert doc["total"]["attempts"] == 3
        assert doc["total"]["energy_kwh"] > 0  # the simulated GPUs report their power
        by_user = json.loads(_usage(mesh, "--json", "--by", "user"))
        got: dict[str, float] = {}
        for row in by_user["rows"]:
            got[row["key"]] = got.get(row["key"], 0.0) + row["gpu_s"]
        assert got.keys() == {"alice", "bob"}
        for who in want:
            assert abs(got[who] - want[who]) < 0.01, (who, got, want)
        by_team = json.loads(_usage(mesh, "--json", "--by", "team"))
        assert {r["key"] for r in by_team["rows"]} == {"vision", "nlp"}
        by_model = json.loads(_usage(mesh, "--json", "--by", "model"))
        assert all("H100" in r["key"] for r in by_model["rows"]), by_model
        lines = list(csv.reader(io.StringIO(_usage(mesh, "--csv", "--by", "user"))))
        assert lines[0] == ["day", "user", "gpu_hours", "energy_kwh", "attempts"]
        assert abs(sum(float(r[2]) for r in lines[1:]) * 3600 - sum(want.values())) < 1.0
        # Kept durably: restarting every runner loses nothing.
        for i in range(len(mesh.agents)):
            assert mesh.terminate(i) == 0
            mesh.start(i)
        mesh.wait_converged()
        again = json.loads(_usage(mesh, "--json"))
        assert abs(again["total"]["gpu_s"] - doc["total"]["gpu_s"]) < 1e-3
        assert again["total"]["energy_kwh"] == doc["total"]["energy_kwh"]
        table = _usage(mesh, "--by", "team")
        assert table.splitlines()[0].split() == [
            "DAY",
            "TEAM",
            "GPU-HOURS",
            "ENERGY",
            "kWh",
            "ATTEMPTS",
        ]
        assert table.splitlines()[-1].split()[0] == "total"
        ungrouped = _usage(mesh).splitlines()  # no --by: no key column
        assert ungrouped[0].split() == ["DAY", "GPU-HOURS", "ENERGY", "kWh", "ATTEMPTS"]
        assert ungrouped[-1].split()[0] == "total"
    finally:
        mesh.stop_all()
