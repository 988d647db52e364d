"""History on real agents: it survives a restart, and ``shoal history`` agrees with the API."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from tests.agent.agents import Mesh, spec, started
from tests.shoal_cli import one_line_error, shoal


def _history(mesh: Mesh, i: int, **params: Any) -> dict[str, Any]:
    query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    doc: dict[str, Any] = mesh.get(mesh.agents[i], "/v1/history?" + query)
    return doc


def _util(doc: dict[str, Any]) -> dict[int, float]:
    """t -> the GPU's utilization, where there is a sample."""
    [series] = [s for s in doc["series"] if s["name"] == "gpu.util_pct"]
    return {t: avg for t, _, avg, _ in series["points"] if avg is not None}


def test_history_survives_a_restart_and_the_cli_agrees(tmp_path: Path) -> None:
    with started(tmp_path, ["h100:1", "l4:1"]) as mesh:
        start = int(time.time()) - 1
        window = {"from": start, "to": start + 600, "step": 1}
        mesh.wait(
            "three seconds of history",
            lambda: len(_util(_history(mesh, 1, series="gpu.util_pct", **window))) >= 3,
        )
        before = _util(_history(mesh, 1, series="gpu.util_pct", **window))

        assert mesh.terminate(1) == 0
        mesh.start(1)
        mesh.wait(
            "history after the restart",
            lambda: max(_util(_history(mesh, 1, series="gpu.util_pct", **window))) > max(before),
        )
        after = _util(_history(mesh, 1, series="gpu.util_pct", **window))
        assert {t: after.get(t) for t in before} == before  # what was kept is still there

        doc = _history(mesh, 1, series="gpu", **window)
        unsupported = {s["name"] for s in doc["series"] if s["unsupported"]}
        assert "gpu.mem_bw_pct" in unsupported and "gpu.util_pct" not in unsupported
        hints = _history(mesh, 1, series="gpu.util_pct", hints=1)["hints"]
        assert {"rule": "memory_bandwidth_bound", "unjudged": True}.items() <= hints[0].items()

        node = mesh.agents[1].node_id
        flags = ["--agent", mesh.agents[0].address, "--identity", str(mesh.cluster_dir)]
        asked = shoal(
            "history", node[:10], "--series", "gpu.util_pct,host.cpu_pct", "--since", "10m",
            "--step", "1", "--json", *flags,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr
        cli = json.loads(asked.stdout)
        assert cli["node"] == node  # asked through agent 0, answered by node 1 itself
        api = _history(
            mesh,
            1,
            series="gpu.util_pct,host.cpu_pct",
            step=1,
            **{"from": cli["from"], "to": cli["to"]},
        )
        settled = time.time() - 3  # the last seconds may fill in between the two requests
        for c, a in zip(cli["series"], api["series"], strict=True):
            assert (c["name"], c["subject"]) == (a["name"], a["subject"])
            old = [p for p in c["points"] if p[0] < settled]
            assert old == a["points"][: len(old)]
        assert len(_util(cli)) >= len(after)

        table = shoal("history", node[:10], "--series", "gpu", "--since", "5m", *flags)
        assert table.returncode == 0, table.stderr
        assert "gpu.util_pct" in table.stdout and "gpu.mem_bw_pct" in table.stdout
        assert "unsupported" in table.stdout
        power = next(line for line in table.stdout.splitlines() if line.startswith("gpu.power_mw"))
        assert re.search(r"last \d+(\.\d)? W;", power), power  # watts, not milliwatts

        rows = list(csv.reader(io.StringIO(shoal("history", node, "--csv", *flags).stdout)))
        assert rows[0] == ["node", "series", "subject", "t", "min", "avg", "max"]
        assert {r[1] for r in rows[1:]} >= {"gpu.util_pct", "host.mem_used_bytes"}

        assert "no node is named" in one_line_error(shoal("history", "nosuchnode", *flags))
        status, body = mesh.request(mesh.agents[1], "GET", "/metrics")
        assert status == 200 and b'shoal_history_dropped_total{reason="late"} 0.0' in body
        status, body = mesh.request(mesh.agents[1], "GET", "/v1/history?from=abc")
        assert status == 400 and b"from" in body
        status, body = mesh.request(mesh.agents[0], "GET", f"/v1/history?node={node}")
        assert status == 400 and b"answers for itself" in body

        peer = mesh.agents[0].node_id

        def links() -> dict[str, list[float]]:
            doc = _history(mesh, 1, series="link", **window)
            return {
                s["name"]: [avg for _, _, avg, _ in s["points"] if avg is not None]
                for s in doc["series"]
                if s["subject"] == peer
            }

        # each link's round trips: the Vivaldi estimate and the measured probes, in ms
        mesh.wait("a link's round trips", lambda: all(links().get(n) for n in LINK_SERIES))
        assert all(0 < ms < 1000 for n in LINK_SERIES for ms in links()[n])


LINK_SERIES = ("link.rtt_ms", "link.probe_rtt_ms")
PROGRESS = "import time; print('SHOAL_PROGRESS 0.25', flush=True); time.sleep(600)"


def test_a_jobs_history_is_asked_of_the_node_that_runs_it(tmp_path: Path) -> None:
    from agent.job.jobspec import new_job_id

    with started(tmp_path, ["h100:1", "l4:1"]) as mesh:
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec([sys.executable, "-c", PROGRESS])}
        status, answer = mesh.command(mesh.agents[0], "submit", body)
        assert status == 200, answer
        mesh.wait("the job runs", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
        runner = mesh.node_index(mesh.job(mesh.agents[0], job_id)["runner"])
        mesh.wait(
            "its progress in its runner's history",
            lambda: any(
                p[2] == 25.0
                for s in _history(mesh, runner, job=job_id)["series"]
                if s["name"] == "job.progress_pct"
                for p in s["points"]
            ),
        )
        flags = ["--agent", mesh.agents[1 - runner].address, "--identity", str(mesh.cluster_dir)]
        asked = shoal("history", job_id[:10], "--since", "5m", "--step", "1", "--json", *flags)
        assert asked.returncode == 0, asked.stderr
        doc = json.loads(asked.stdout)
        assert doc["node"] == mesh.agents[runner].node_id and doc["hints"] == []
        series = {s["name"]: s for s in doc["series"]}
        assert set(series) == {"job.progress_pct", "job.cpu_pct", "job.mem_bytes"}
        assert all(s["subject"] == job_id for s in series.values())
        assert 25.0 in [p[2] for p in series["job.progress_pct"]["points"]]
