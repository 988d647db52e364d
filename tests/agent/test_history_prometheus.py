"""Prometheus and Grafana reach a node: a real Prometheus scrapes an agent's ``/metrics`` over
its mutual TLS, and the agent answers a subset of Prometheus's ``query_range`` from its history
in Prometheus's own JSON shape."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent.wire.prom_range import PromError, history_name, parse, parse_selector, parse_step
from tests.agent.agents import Mesh, started


def test_the_subset_takes_a_selector_and_refuses_the_rest() -> None:
    assert parse_selector('gpu_util_pct{subject="GPU-0"}') == ("gpu_util_pct", {"subject": "GPU-0"})
    assert parse_selector("host_cpu_pct") == ("host_cpu_pct", {})
    assert history_name("gpu_util_pct") == "gpu.util_pct"
    assert history_name("link_probe_rtt_ms") == "link.probe_rtt_ms"
    assert parse_step("15") == 15 and parse_step("1m") == 60
    q = parse({"query": "gpu_mem_bw_pct", "start": "2026-12-06T00:00:00Z", "end": "1796601600",
               "step": "30s"})  # fmt: skip
    assert q.name == "gpu.mem_bw_pct" and q.start_s == 1796515200.0 and q.step_s == 30
    for bad, why in (
        ({"query": "rate(gpu_util_pct[5m])"}, "selector"),
        ({"query": 'gpu_util_pct{subject=~"G.*"}'}, "label"),
        ({"query": 'gpu_util_pct{job="x"}'}, "subject and node"),
        ({"query": "gpu_util_pct", "step": "0.5"}, "at least one second"),
        ({"query": "gpu_util_pct", "end": "100"}, "before start"),
        ({"query": "gpu_util_pct", "step": "1", "end": "1796601600"}, "11,000 points"),
        ({"query": "nounderscore"}, "not a history series"),
    ):
        params = {"start": "1796515200", "end": "1796515800", "step": "15", **bad}
        with pytest.raises(PromError, match=why):
            parse(params)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prom_get(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _range(mesh: Mesh, **params: Any) -> tuple[int, Any]:
    query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    status, body = mesh.request(mesh.agents[0], "GET", "/api/v1/query_range?" + query)
    return status, json.loads(body)


def test_query_range_answers_in_prometheus_shape_and_prometheus_scrapes(tmp_path: Path) -> None:
    with started(tmp_path / "mesh", ["h100:1"]) as mesh:
        agent = mesh.agents[0]
        start = int(time.time())
        window = {"query": "gpu_util_pct", "start": start - 5, "end": start + 120, "step": 1}

        def points() -> list[list[Any]]:
            status, doc = _range(mesh, **window)
            assert status == 200, doc
            return list(doc["data"]["result"][0]["values"]) if doc["data"]["result"] else []

        mesh.wait("three seconds of history", lambda: len(points()) >= 3)
        status, doc = _range(mesh, **window)
        assert doc["status"] == "success" and doc["data"]["resultType"] == "matrix"
        [series] = doc["data"]["result"]
        assert series["metric"]["__name__"] == "gpu_util_pct"
        assert series["metric"]["node"] == agent.node_id and series["metric"]["subject"]
        for t, value in series["values"]:
            assert isinstance(t, int) and isinstance(value, str) and float(value) >= 0
        subject = series["metric"]["subject"]
        narrowed = _range(mesh, **{**window, "query": f'gpu_util_pct{{subject="{subject}"}}'})
        assert [r["metric"]["subject"] for r in narrowed[1]["data"]["result"]] == [subject]
        none = _range(mesh, **{**window, "query": 'gpu_util_pct{subject="GPU-none"}'})
        assert none[1]["data"]["result"] == []
        status, doc = _range(mesh, **{**window, "query": "sum(gpu_util_pct)"})
        assert status == 400 and doc["status"] == "error" and doc["errorType"] == "bad_data"
        status, doc = _range(mesh, **{**window, "query": 'gpu_util_pct{node="other"}'})
        assert status == 400 and "ask other's" in doc["error"]

        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("Debian's prometheus package is not installed here")
        # Prometheus scrapes the agent itself over its mutual TLS, with the operator's
        # certificate: Go's x509 must load Shoal's certificates (their role is a SAN URI).
        ident = mesh.cluster_dir
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: shoal\n"
            "    scheme: https\n"
            f"    tls_config: {{ca_file: '{ident / 'ca.crt'}', cert_file: '{ident / 'node.crt'}',"
            f" key_file: '{ident / 'node.key'}'}}\n"
            f"    static_configs: [{{targets: ['{agent.address}']}}]\n"
        )
        port = _free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        prom = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            def scraped() -> bool:
                doc = _prom_get(port, "/api/v1/query", query='up{job="shoal"}')
                result = doc["data"]["result"]
                return bool(result) and result[0]["value"][1] == "1"

            try:
                mesh.wait("Prometheus to scrape the agent", scraped, deadline_s=60)
            except AssertionError:
                targets = _prom_get(port, "/api/v1/targets")
                raise AssertionError(json.dumps(targets)[:2000]) from None
            doc = _prom_get(port, "/api/v1/query", query="shoal_history_dropped_total")
            assert doc["status"] == "success" and doc["data"]["result"]
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            log.close()
