"""The CLI's tables and name resolution on their own: rows, widths, staleness, matches."""

from __future__ import annotations

import io
from typing import Any

import pytest

from agent.cli.tables import (
    event_header,
    event_row,
    job_detail,
    job_row,
    jobs_table,
    node_row,
    nodes_table,
)
from agent.common.errors import UserError
from agent.operator.resolve import check_migration_target, pick_job, pick_node
from agent.operator.terminal import one_line, relative

NOW = 1_800_000_000.0


def _render(table: Any, width: int = 80) -> list[str]:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, soft_wrap=False).print(table)
    return out.getvalue().splitlines()


def _job(job_id: str, state: str = "running", **extra: Any) -> dict[str, Any]:
    spec = {
        "command": extra.pop("command", ["sleep", "5"]),
        "resources": {"gpus_per_node": 1, "nodes": 1},
        "priority": extra.pop("priority", 0),
        "deadline": extra.pop("deadline", None),
    }
    return {"job_id": job_id, "state": state, "runner": "n" * 32, "spec": spec, **extra}


def _node(node_id: str, host: str, state: str = "alive", **extra: Any) -> dict[str, Any]:
    device = {"name": "NVIDIA H100", "util_pct": 73, "mem_used_bytes": 10, "mem_total_bytes": 80}
    return {
        "node_id": node_id,
        "host": {"hostname": host},
        "state": state,
        "role": "agent",
        "drain": "schedulable",
        "devices": [device],
        "running_jobs": ["x"],
        "telemetry_age_s": 2.0,
        **extra,
    }


def test_one_line_escapes_newlines_and_control_characters() -> None:
    assert one_line("a\nb\tc\x1b[0m") == "a\\nb\\tc\\x1b[0m"


@pytest.mark.parametrize(
    ("delta_s", "text"),
    [(7200, "in 2h"), (-180, "3m ago"), (45, "in 45s"), (0.2, "now"), (-3 * 86400, "3d ago")],
)
def test_relative_times(delta_s: float, text: str) -> None:
    assert relative(NOW + delta_s, NOW) == text


def test_a_job_is_one_row_that_fits_80_columns() -> None:
    script = "import time\nfor i in range(10):\n    time.sleep(1)\n    print(i)\n"
    jobs = [
        _job("a" * 32, command=["python", "-c", script], priority=5, deadline=NOW + 7200),
        _job("b" * 32, progress=0.5, eta_s=240.0),
        _job("c" * 32, "pending", reason="no schedulable node has 8 free GPUs\nat all"),
    ]
    lines = _render(jobs_table(jobs, {"n" * 32: "gpu-host-01"}, NOW, 80))
    assert len(lines) == 2 + len(jobs)  # header, rule, one line per job
    assert all(len(line) <= 80 for line in lines)
    first, second, third = lines[2:]
    assert first.startswith("aaaaaaaa") and "python -c" in first and "in 2h" in first
    assert " 5 " in first and "…" in first
    assert "50%" in second and "~4m" in second
    assert "no schedulable" in third


def test_a_gang_is_one_row_and_its_detail_lists_every_member() -> None:
    members = [
        {"rank": 0, "node": "n" * 32, "devices": ["sim:a:0", "sim:a:1"]},
        {"rank": 1, "node": "m" * 32, "devices": ["sim:b:0", "sim:b:1"]},
    ]
    gang = _job("g" * 32, members=members, attempt=2)
    gang["spec"]["resources"] = {"gpus_per_node": 2, "nodes": 2}
    names = {"n" * 32: "h100-00", "m" * 32: "h100-01"}
    row = job_row(gang, names, NOW)
    assert row[2:4] == ["2 nodes", "2x2"]
    detail = dict(job_detail(gang, names, NOW))
    assert detail["State"] == "running (attempt 2)"
    assert detail["Members"] == "rank 0  h100-00  sim:a:0,sim:a:1"
    assert detail[""] == "rank 1  h100-01  sim:b:0,sim:b:1"
    assert "Node" not in detail
    plain = dict(job_detail(_job("p" * 32), names, NOW))
    assert plain["Node"] == "h100-00" and "Members" not in plain


def test_a_dead_or_silent_node_shows_stale_readings() -> None:
    alive = node_row(_node("a" * 32, "h1"))
    dead = node_row(_node("b" * 32, "h2", state="dead"))
    silent = node_row(_node("c" * 32, "h3", telemetry_age_s=300.0))
    assert alive[4:7] == ["73%", "12%", "1"]
    assert dead[4:7] == ["stale", "-", "-"]
    assert silent[4:6] == ["stale", "-"]
    lines = _render(nodes_table([_node("d" * 32, "a-very-long-host-name.example.com")], 80))
    assert all(len(line) <= 80 for line in lines) and "…" in lines[2]


def test_telemetry_is_judged_by_the_heartbeat_its_node_keeps() -> None:
    """A node of a large mesh heartbeats every 480 s: 300 s old is current, 800 s stale."""
    quiet = node_row(_node("a" * 32, "h1", telemetry_age_s=300.0, telemetry_every_s=480.0))
    late = node_row(_node("b" * 32, "h2", telemetry_age_s=800.0, telemetry_every_s=480.0))
    assert quiet[4:7] == ["73%", "12%", "1"]
    assert late[4:6] == ["stale", "-"]


def test_an_event_row_fits_the_width() -> None:
    event = {
        "at": NOW,
        "node": "n" * 32,
        "job_id": "f" * 32,
        "kind": "started",
        "message": "x" * 99,
    }
    row = event_row(event, {"n" * 32: "gpu-host-01"}, 80)
    assert len(row) <= 80 and "gpu-host-01" in row and "ffffffff" in row and row.endswith("…")
    assert event_header(80).split() == ["TIME", "NODE", "JOB", "KIND", "MESSAGE"]


def test_a_job_is_found_by_a_unique_prefix_and_refused_when_ambiguous() -> None:
    jobs = [_job("abc1" + "0" * 28), _job("abc2" + "0" * 28), _job("def" + "0" * 29)]
    assert pick_job(jobs, "abc1")["job_id"] == "abc1" + "0" * 28
    assert pick_job(jobs, "DEF")["job_id"] == "def" + "0" * 29
    with pytest.raises(UserError, match="matches 2 jobs") as ambiguous:
        pick_job(jobs, "abc")
    assert str(ambiguous.value).count("\n") == 2  # the two matches, listed
    with pytest.raises(UserError, match="no job matches"):
        pick_job(jobs, "0123")
    with pytest.raises(UserError, match="not a job id"):
        pick_job(jobs, "xyz")


def test_a_node_is_found_by_id_prefix_or_host_name() -> None:
    nodes = [_node("aaaa" + "2" * 28, "gpu1"), _node("aabb" + "2" * 28, "gpu2")]
    assert pick_node(nodes, "gpu2")["node_id"].startswith("aabb")
    assert pick_node(nodes, "aaaa")["host"]["hostname"] == "gpu1"
    with pytest.raises(UserError, match="names 2 nodes"):
        pick_node(nodes, "aa")
    with pytest.raises(UserError, match="no node is named"):
        pick_node(nodes, "gpu3")


def test_a_shared_host_name_means_its_one_live_node() -> None:
    old = _node("cccc" + "2" * 28, "gpu1", state="dead")
    new = _node("dddd" + "2" * 28, "gpu1")
    assert pick_node([old, new], "gpu1") is new
    with pytest.raises(UserError, match="names 2 nodes"):
        pick_node([old, _node("eeee" + "2" * 28, "gpu1", state="dead")], "gpu1")


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (_node("b" * 32, "h2", state="dead"), "is dead, not alive"),
        (_node("b" * 32, "h2", role="operator"), "not an agent"),
        (_node("b" * 32, "h2", drain="cordoned"), "takes no new work"),
        (_node("n" * 32, "h1"), "already runs there"),
    ],
)
def test_a_migration_target_is_refused_unless_live_schedulable_and_elsewhere(
    node: dict[str, Any], why: str
) -> None:
    with pytest.raises(UserError, match=why):
        check_migration_target(node, _job("a" * 32), {})


def test_a_job_whose_data_stages_says_how_far_in_its_row() -> None:
    line = "staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)"
    row = job_row(_job("s" * 32, "placing", reason=line), {}, NOW)
    assert row[1] == "placing" and row[-1] == line
    assert job_row(_job("t" * 32, "placing"), {}, NOW)[-1] == "sleep 5"


def test_an_ended_job_says_when_how_and_after_how_long_and_lists_its_attempts() -> None:
    names = {"n" * 32: "h100-00", "m" * 32: "h100-01"}
    attempts = [
        {"attempt": 1, "node": "n" * 32, "cause": "migrate", "exit_code": None, "signal": None,
         "started_at": NOW - 600, "finished_at": NOW - 480},
        {"attempt": 2, "node": "m" * 32, "cause": "exit", "exit_code": 3, "signal": None,
         "started_at": NOW - 470, "finished_at": NOW - 180},
    ]  # fmt: skip
    job = _job("e" * 32, "failed", attempt=2, runner="m" * 32, devices=["sim:b:0"])
    job.update(started_at=NOW - 470, finished_at=NOW - 180, exit_code=3, attempts=attempts)
    detail = job_detail(job, names, NOW)
    rows = dict(detail)
    assert rows["Node"] == "h100-01" and rows["GPUs"] == "sim:b:0"
    assert rows["Ended"] == "3m ago, exit code 3, after 5m"
    assert [value for label, value in detail if label in ("Attempts", "")] == [
        "1  h100-00  migrate  2m",
        "2  h100-01  exit code 3  5m",
    ]
    killed = _job("k" * 32, "failed", started_at=NOW - 30, finished_at=NOW - 10, signal="SIGKILL")
    assert dict(job_detail(killed, names, NOW))["Ended"] == "10s ago, signal SIGKILL, after 20s"
    running = dict(job_detail(_job("r" * 32), names, NOW))
    assert "Ended" not in running and "Attempts" not in running
