"""The operator CLI against real agents: jobs and nodes named as ``shoal jobs`` and ``shoal
nodes`` show them, the tables, ``shoal events``, ``--json`` and a closed pipe. Every command is the
real ``shoal`` in a subprocess; the mesh is real agent processes on loopback."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox.localmesh import AgentProcess
from tests.agent.agents import DEADLINE_S, Mesh, spec
from tests.shoal_cli import SHOAL, into_closed_pipe, one_line_error, shoal

pytestmark = pytest.mark.slow

TICKER = """import sys, time
for i in range(3000):
    print("tick", i, flush=True)
    print("SHOAL_PROGRESS", i / 3000, flush=True)
    time.sleep(0.2)
"""
"""A multi-line program: prints a numbered tick and its progress five times a second."""


def _id(prefix: str) -> str:
    """A job id that starts with ``prefix``, so the test knows which prefixes are shared."""
    return prefix + uuid.uuid4().hex[len(prefix) :]


class Operator:
    """``shoal`` pointed at one agent of ``mesh`` with the mesh's operator identity."""

    def __init__(self, mesh: Mesh, agent: AgentProcess) -> None:
        self.mesh = mesh
        self.agent = agent

    @property
    def flags(self) -> list[str]:
        return ["--agent", self.agent.address, "--identity", str(self.mesh.cluster_dir)]

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return shoal(*args, *self.flags)

    def ok(self, *args: str) -> str:
        done = self(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout

    def submit(self, job_id: str, argv: list[str], **extra: Any) -> None:
        body = {"job_id": job_id, "spec": spec(argv, **extra)}
        status, answer = self.mesh.command(self.agent, "submit", body)
        assert status == 200, answer

    def job(self, job_id: str) -> dict[str, Any]:
        return self.mesh.job(self.agent, job_id)

    def node(self, node_id: str) -> dict[str, Any]:
        nodes = self.mesh.get(self.agent, "/v1/nodes")["nodes"]
        return next(n for n in nodes if n["node_id"] == node_id)


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, ["h100:2", "mi300x:2", "a100-80gb:2"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def _hostname(agent: AgentProcess) -> str:
    """The name ``shoal nodes`` shows for a LocalMesh agent (``--name MODEL-NN``)."""
    return f"{agent.profile.split(':')[0]}-{agent.index:02d}"


def _lines_of(process: subprocess.Popen[str], into: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        into.put(line.rstrip("\n"))
    into.put(None)


def test_jobs_are_named_by_prefix_listed_one_row_each_and_logged_as_json(mesh: Mesh) -> None:
    op = Operator(mesh, mesh.agents[0])
    ticker, sleeper = _id("abc1"), _id("abc2")
    op.submit(ticker, [sys.executable, "-c", TICKER], priority=5, deadline=time.time() + 7200)
    op.submit(sleeper, [sys.executable, "-c", "import time; time.sleep(600)"])
    mesh.wait(
        "both running", lambda: all(op.job(j)["state"] == "running" for j in (ticker, sleeper))
    )
    mesh.wait("an ETA for the ticker", lambda: op.job(ticker).get("eta_s") is not None)

    # shoal jobs: one row per job (the multi-line program included), 80 columns when piped
    listing = op.ok("jobs").splitlines()
    rows = {line[:8]: line for line in listing[2:]}
    assert len(listing) == 4 and set(rows) == {ticker[:8], sleeper[:8]}, listing
    assert all(len(line) <= 80 for line in listing), listing
    ticker_row = rows[ticker[:8]].split()
    assert ticker_row[1] == "running" and "5" in ticker_row and "in 2h" in rows[ticker[:8]]
    assert any(cell.startswith("~") for cell in ticker_row), ticker_row  # predicted completion
    assert rows[ticker[:8]].rstrip().endswith("…")  # the command, cut to fit 80 columns

    # logs by a unique prefix, as text and as JSON lines
    text = op.ok("logs", ticker[:6], "-n", "5")
    assert any(line.startswith("tick ") for line in text.splitlines()), text
    lines = [json.loads(line) for line in op.ok("logs", ticker[:6], "--json").splitlines()]
    assert lines and all(set(doc) == {"attempt", "line"} for doc in lines)
    assert any(doc["line"].startswith("tick ") for doc in lines)

    # an ambiguous prefix lists its matches, an unknown one is one line; both exit 2
    ambiguous = op("logs", "abc")
    assert ambiguous.returncode == 2 and "Traceback" not in ambiguous.stderr
    assert "matches 2 jobs" in ambiguous.stderr
    assert ticker in ambiguous.stderr and sleeper in ambiguous.stderr
    assert "no job matches" in one_line_error(op("cancel", "0000"))
    assert "matches 2 jobs" in op("migrate", "abc").stderr
    assert op.job(sleeper)["state"] == "running"

    assert op.ok("cancel", sleeper[:5]).strip() == f"{sleeper}: cancelled"
    mesh.wait("cancelled", lambda: op.job(sleeper)["state"] == "cancelled")

    # a closed pipe ends every kind of output quietly, with status 0
    for argv in (["nodes", "--json"], ["jobs"], ["logs", "-f", ticker[:8]], ["events"]):
        done = into_closed_pipe(*argv, *op.flags)
        assert (done.returncode, done.stderr) == (0, ""), argv


def _exit_code(process: subprocess.Popen[str]) -> int:
    """Its exit code; if it has not exited within the deadline, a failure that says where it
    hung (the traceback of every thread, which ``PYTHONFAULTHANDLER`` prints on SIGABRT)."""
    try:
        return process.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=DEADLINE_S)
        stderr = process.stderr.read() if process.stderr is not None else ""
        raise AssertionError(f"still running {DEADLINE_S:.0f} s after SIGINT:\n{stderr}") from None


def test_events_as_a_table_as_json_lines_and_followed(mesh: Mesh) -> None:
    op = Operator(mesh, mesh.agents[1])
    first = _id("e1")
    op.submit(first, ["true"], gpus=0)
    mesh.wait(
        "the first job's end in the event log",
        lambda: any(
            e["job_id"] == first and e["kind"] == "succeeded" for e in mesh.events(op.agent)
        ),
    )

    table = op.ok("events").splitlines()
    assert table[0].split() == ["TIME", "NODE", "JOB", "KIND", "MESSAGE"]
    assert all(len(line) <= 80 for line in table)
    names = {_hostname(a) for a in mesh.agents}
    assert any(line.split()[1] in names and first[:8] in line for line in table[1:]), table
    events = [json.loads(line) for line in op.ok("events", "--json").splitlines()]
    assert {"seq", "at", "kind", "node", "job_id", "message"} <= set(events[-1])
    assert any(e["job_id"] == first and e["kind"] == "submitted" for e in events)

    follower = subprocess.Popen(
        [*SHOAL, "events", "-f", "--json", *op.flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints where it is
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_lines_of, args=(follower, lines), daemon=True)
    try:
        reader.start()
        seen: list[dict[str, Any]] = []

        def saw(job_id: str, kind: str) -> bool:
            while not lines.empty():
                line = lines.get()
                assert line is not None, f"events -f ended: {follower.stderr}"
                seen.append(json.loads(line))
            return any(e["job_id"] == job_id and e["kind"] == kind for e in seen)

        mesh.wait("the old events", lambda: saw(first, "submitted"))
        second = _id("e2")
        op.submit(second, ["true"], gpus=0)
        mesh.wait("the new job's events, followed", lambda: saw(second, "succeeded"))
        follower.send_signal(signal.SIGINT)
        assert _exit_code(follower) == 0
        assert follower.stderr is not None and "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
        follower.wait()
        if reader.is_alive():
            reader.join(timeout=10)
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()


def test_node_commands_take_a_host_name_or_a_prefix(mesh: Mesh) -> None:
    op = Operator(mesh, mesh.agents[0])
    target = mesh.agents[2]
    assert op.ok("cordon", _hostname(target)).strip() == f"{target.node_id[:8]}: cordoned"
    mesh.wait("cordoned", lambda: op.node(target.node_id)["drain"] == "cordoned")
    answer = json.loads(op.ok("undrain", target.node_id[:5], "--json"))
    assert answer["node"] == target.node_id
    mesh.wait("schedulable", lambda: op.node(target.node_id)["drain"] == "schedulable")
    assert "drain" in op.ok("drain", target.node_id[:10], "--grace", "1")
    mesh.wait("drained", lambda: op.node(target.node_id)["drain"] in ("draining", "drained"))
    ambiguous = op("cordon", "")
    assert ambiguous.returncode == 2 and "names 3 nodes" in ambiguous.stderr
    assert all(a.node_id in ambiguous.stderr for a in mesh.agents)
    assert "no node is named" in one_line_error(op("undrain", "gpu-that-is-not-there"))


def test_migrate_checks_its_target_before_anything_is_sent(mesh: Mesh) -> None:
    op = Operator(mesh, mesh.agents[0])
    job_id = _id("f00d")
    op.submit(job_id, [sys.executable, "-c", "import time; time.sleep(600)"])
    mesh.wait("running", lambda: op.job(job_id)["state"] == "running")
    runner_id, attempt = op.job(job_id)["runner"], op.job(job_id)["attempt"]
    runner = mesh.agents[mesh.node_index(runner_id)]
    op = Operator(mesh, runner)  # talk to the runner: the node killed below is another one
    others = [a for a in mesh.agents if a is not runner]

    for to, why in (
        (_hostname(runner), "already runs there"),
        (runner_id[:6], "already runs there"),
        ("no-such-host", "no node is named"),
        ("zzzz", "no node is named"),
    ):
        assert why in one_line_error(op("migrate", job_id[:6], "--to", to)), to
    assert "names 3 nodes" in op("migrate", job_id[:6], "--to", "").stderr
    job = op.job(job_id)
    assert (job["state"], job["runner"], job["attempt"]) == ("running", runner_id, attempt)

    # a dead node: refused as a target, and its readings are shown stale, not as current
    dead, alive = others
    mesh.kill(dead.index)
    mesh.wait("the killed node dead", lambda: op.node(dead.node_id)["state"] == "dead", 60)
    rows = {line.split()[0]: line.split() for line in op.ok("nodes").splitlines()[2:]}
    assert rows[_hostname(dead)][2] == "dead" and rows[_hostname(dead)][4:6] == ["stale", "-"]
    assert rows[_hostname(alive)][4].endswith("%")
    assert "is dead, not alive" in one_line_error(
        op("migrate", job_id[:6], "--to", _hostname(dead))
    )
    job = op.job(job_id)
    assert (job["state"], job["runner"], job["attempt"]) == ("running", runner_id, attempt)

    out = op.ok("migrate", job_id[:6], "--to", _hostname(alive))
    assert out.strip() == f"{job_id}: migrating to {_hostname(alive)}"
    mesh.wait(
        "running on the target",
        lambda: op.job(job_id)["runner"] == alive.node_id and op.job(job_id)["state"] == "running",
    )
