"""The pieces of "the CLI remembers the fleet" and "a job that can never fit", without agents:
the fleet file, fail-over's order and failures, connection errors in words, the submit check."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.cli.tables import node_row
from agent.common.errors import UserError
from agent.job.jobspec import JobSpec, Resources
from agent.operator.failover import NoAgentAnswered, first_answering
from agent.operator.fit import asks, fit
from agent.operator.fleet import Fleet, FleetAgent, fleet_path, load_fleet, save_fleet
from agent.operator.netwhy import short_why, why
from gossip.identity import init_cluster


def test_the_fleet_file_round_trips_merges_and_forgets(tmp_path: Path) -> None:
    assert load_fleet(tmp_path) == Fleet()
    a = FleetAgent("10.0.0.1:7946", "n1", "root@gpu1")
    b = FleetAgent("10.0.0.2:7946", "n2", "root@gpu2")
    save_fleet(tmp_path, Fleet((a, b)))
    assert load_fleet(tmp_path) == Fleet((a, b))
    assert fleet_path(tmp_path).read_text().startswith("# Written by shoal bootstrap")
    moved = FleetAgent("10.0.0.9:7946", "n1", "root@gpu1")  # the same node, a new address
    assert Fleet((a, b)).merged([moved]).agents == (b, moved)
    assert Fleet((a, b)).without([FleetAgent("", "n2", "root@gpu2")]).agents == (a,)
    assert Fleet((FleetAgent("h:1"),)).merged([FleetAgent("h:1", "n3")]).addresses == ["h:1"]


def test_a_broken_fleet_file_is_one_line(tmp_path: Path) -> None:
    fleet_path(tmp_path).write_text("[[agent]]\nnode = 'x'\n")
    with pytest.raises(UserError, match=r'each \[\[agent\]\] needs address = "HOST:PORT"'):
        load_fleet(tmp_path)
    fleet_path(tmp_path).write_text("[[agent]]\naddress = 'h:1'\nport = 3\n")
    with pytest.raises(UserError, match="unknown key 'port'"):
        load_fleet(tmp_path)
    fleet_path(tmp_path).write_text("agent = [")
    with pytest.raises(UserError, match="not valid TOML"):
        load_fleet(tmp_path)


def test_connection_failures_in_words() -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert (why(refused), short_why(refused)) == (
        "connection refused: nothing listens there",
        "refused",
    )
    wrapped = OSError("Cannot connect to host x:1 [Connect call failed]")
    wrapped.__cause__ = refused
    assert short_why(wrapped) == "refused"
    assert short_why(TimeoutError()) == "timeout"
    assert short_why(socket.gaierror(-2, "Name or service not known")) == "unknown host"
    assert short_why(OSError(errno.EHOSTUNREACH, "No route to host")) == "unreachable"
    assert why(ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")).startswith(
        "TLS handshake failed"
    )
    assert why(OSError(errno.EPERM, "Operation not permitted")) == "operation not permitted"
    assert "Errno" not in why(OSError(errno.EPERM, "Operation not permitted"))


def _refused() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_fail_over_names_every_agent_and_why_and_does_not_wait_on_a_refusal(
    tmp_path: Path,
) -> None:
    operator = init_cluster(tmp_path / "c", "lab", "op", datetime.now(UTC)).operator
    silent = socket.socket()  # accepts TCP, never speaks TLS: a hung agent
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    hung = f"127.0.0.1:{silent.getsockname()[1]}"
    refused = [_refused(), _refused()]

    async def attempt(addresses: list[str]) -> tuple[NoAgentAnswered, float]:
        started = time.monotonic()
        with pytest.raises(NoAgentAnswered) as info:
            await first_answering(operator, addresses)
        return info.value, time.monotonic() - started

    try:
        error, took = asyncio.run(attempt(refused))
        assert str(error) == (
            f"no agent of the fleet answered: {refused[0]} (refused), {refused[1]} (refused)"
        )
        assert took < 2.0
        error, _ = asyncio.run(attempt([hung, refused[0]]))
        assert error.failures == [(hung, "timeout"), (refused[0], "refused")]
    finally:
        silent.close()


def _node(name: str, devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "node_id": f"{name}-id",
        "state": "alive",
        "role": "agent",
        "drain": "schedulable",
        "host": {"hostname": name},
        "devices": devices,
        **extra,
    }


def _gpu(key: str, name: str, backend: str = "cuda", gib: int = 80) -> dict[str, Any]:
    vendor = {"cuda": "nvidia", "rocm": "amd", "cpu": "cpu"}[backend]
    return {
        "key": key,
        "vendor": vendor,
        "backend": backend,
        "name": name,
        "mem_total_bytes": gib * 1024**3,
    }


CPU = _gpu("cpu", "AMD EPYC 7B13", "cpu", 256)


def test_fit_tells_never_from_not_now() -> None:
    nodes = [
        _node("cpu1", [CPU]),
        _node("h100", [_gpu("g0", "H100"), _gpu("g1", "H100"), CPU]),
        _node("mi", [_gpu("m0", "MI300X", "rocm", 192)], drain="cordoned"),
        _node("gone", [_gpu("x0", "H100")] * 8, state="left"),
    ]
    anywhere = JobSpec(command=("x",))
    assert fit(anywhere, nodes, []).ever == ("cpu1", "h100", "mi")
    assert fit(anywhere, nodes, []).now == ("cpu1", "h100")  # mi takes no new work
    # a CPU is no GPU, and a node that left is not counted
    three = JobSpec(command=("x",), resources=Resources(gpus_per_node=3))
    where = fit(three, nodes, [])
    assert where.never and where.best == "2x H100 on h100" and where.nodes == 3
    two = JobSpec(command=("x",), resources=Resources(gpus_per_node=2))
    busy = [{"state": "running", "runner": "h100-id", "devices": ["g0"]}]
    assert fit(two, nodes, []).now == ("h100",)
    where = fit(two, nodes, busy)
    assert where.ever == ("h100",) and where.now == ()
    rocm = JobSpec(command=("x",), resources=Resources(gpus_per_node=1, backends=("rocm",)))
    assert fit(rocm, nodes, []).ever == ("mi",) and fit(rocm, nodes, []).now == ()  # cordoned
    big = JobSpec(command=("x",), resources=Resources(1, min_mem_per_gpu_bytes=100 * 1024**3))
    assert fit(big, nodes, []).ever == ("mi",)
    gang = JobSpec(command=("x",), resources=Resources(gpus_per_node=1, nodes=2))
    assert fit(gang, nodes, []).ever == ("h100", "mi")
    cpus = fit(JobSpec(command=("x",), resources=Resources(1)), [_node("c", [CPU])], [])
    assert cpus.never and cpus.best == ""  # no GPU anywhere: nothing to name


def test_asks_says_it_in_words() -> None:
    assert asks(JobSpec(command=("x",))) == "no GPU (runs on any host)"
    r = Resources(2, 3, min_mem_per_gpu_bytes=40 * 1024**3, backends=("cuda", "rocm"))
    assert asks(JobSpec(command=("x",), resources=r)) == (
        "2 GPUs of one vendor (cuda/rocm, >= 40 GiB each) on each of 3 nodes"
    )


def test_a_cpu_only_node_lists_no_gpu_and_a_node_that_left_no_readings() -> None:
    cpu = dict(CPU, util_pct=12.0, mem_used_bytes=64 * 1024**3)
    row = node_row(_node("cpu1", [cpu], telemetry_age_s=1.0))
    assert row[4:] == ["12%", "25%", "0", "CPU only"]
    mixed = node_row(_node("h", [dict(_gpu("g", "NVIDIA L4"), util_pct=50.0), cpu]))
    assert mixed[4] == "50%" and mixed[7] == "1x NVIDIA L4"
    boxed = node_row(_node("h", [_gpu("g", "NVIDIA L4")], container_runtime="podman"))
    assert boxed[7] == "1x NVIDIA L4; podman"  # its agent runs jobs with an image through podman
    left = node_row(_node("old", [cpu], state="left"))
    assert left[2:7] == ["left", "schedulable", "-", "-", "-"]
