"""Every attempt of a job, on real agents: where each ran and how it ended, and its own log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import metric
from tests.shoal_cli import one_line_error, shoal

pytestmark = pytest.mark.slow

FLAKY = """
import os, sys
attempt = os.environ["SHOAL_ATTEMPT"]
print("hello from attempt", attempt, flush=True)
sys.exit(1 if attempt == "1" else 0)
"""


def test_each_attempt_is_on_record_with_its_own_log(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec([sys.executable, "-c", FLAKY], gpus=0, retries=1)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("succeeded", lambda: mesh.job(a, job_id)["state"] == "succeeded")
        attempts = mesh.job(a, job_id)["attempts"]
        assert [(x["attempt"], x["cause"], x["exit_code"]) for x in attempts] == [
            (1, "exit", 1),
            (2, "exit", 0),
        ]
        assert {x["node"] for x in attempts} <= {m.node_id for m in mesh.agents}
        # Each started on the word of the job's other owner too; that attempt 1 had ended when
        # attempt 2 was confirmed left nothing to fence.
        counts = {
            outcome: sum(
                metric(mesh, m, "shoal_start_confirmations_total", outcome=outcome)
                for m in mesh.agents
            )
            for outcome in ("confirmed", "given", "refused", "fenced")
        }
        assert counts["confirmed"] == counts["given"] >= 2 and counts["refused"] == 0, counts
        assert counts["fenced"] == 0, counts
        for n, other in ((1, 2), (2, 1)):
            status, text = mesh.request(a, "GET", f"/v1/jobs/{job_id}/logs?attempt={n}")
            assert status == 200
            assert f"hello from attempt {n}" in text.decode()
            assert f"hello from attempt {other}" not in text.decode()
        status, _ = mesh.request(a, "GET", f"/v1/jobs/{job_id}/logs?attempt=3")
        assert status == 404
        # The operator's view: every attempt under a header naming its node and its end.
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        done = shoal("logs", job_id[:8], *flags)
        assert done.returncode == 0, done.stderr
        headers = [line for line in done.stdout.splitlines() if line.startswith("=== attempt")]
        assert [h.split()[2] for h in headers] == ["1", "2"]
        assert "(exit 1)" in headers[0] and "(exit 0)" in headers[1]
        assert done.stdout.index("hello from attempt 1") < done.stdout.index(headers[1])
        only = shoal("logs", job_id[:8], "--attempt", "2", *flags).stdout
        assert "hello from attempt 2" in only and "hello from attempt 1" not in only
        assert "no attempt 7" in one_line_error(shoal("logs", job_id[:8], "--attempt", "7", *flags))
    finally:
        mesh.stop_all()


def test_a_migration_to_no_live_agent_is_refused_before_anything_stops(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec(["sleep", "60"], gpus=0)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("running", lambda: mesh.job(a, job_id)["state"] == "running")
        before = mesh.job(a, job_id)
        status, answer = mesh.command(a, "migrate", {"job_id": job_id, "target": "n" * 32})
        assert status == 400 and "no live agent" in answer["error"], answer
        after = mesh.job(a, job_id)
        assert (after["state"], after["attempt"]) == ("running", before["attempt"])
    finally:
        mesh.stop_all()
