"""Real agent processes on loopback: a fresh mesh, ``shoal logs -f``, and SIGTERM of an agent."""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from agent.job.ownership import owner_of
from agent.sandbox.localmesh import AgentProcess
from tests.agent.agents import DEADLINE_S, Mesh, spec, tick_spans

pytestmark = pytest.mark.slow

TICKER = """
import os, subprocess, sys, time
ticks, pids = sys.argv[1], sys.argv[2]
attempt = os.environ["SHOAL_ATTEMPT"]
child = subprocess.Popen(["sleep", "600"])  # a helper in the job's process group
with open(pids, "a") as f:
    f.write(f"{attempt} {os.getpgid(0)} {os.getpid()} {child.pid}\\n")
for _ in range(6000):
    with open(ticks, "a") as f:
        f.write(f"{attempt} {time.time()}\\n")
    time.sleep(0.05)
"""
"""Appends ``attempt time`` to ``ticks`` every 50 ms; writes ``attempt pgid pid child`` once."""


def _groups(path: Path) -> dict[int, list[int]]:
    """``attempt -> [pgid, pid, child pid]`` from the ticker's pid file."""
    out: dict[int, list[int]] = {}
    for line in path.read_text().splitlines():
        attempt, *ids = (int(x) for x in line.split())
        out[attempt] = ids
    return out


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(name))
    return members


def _resumed(a: AgentProcess) -> bool:
    """The agent has passed the point where it resumes the jobs of its store."""
    with a.log_path.open("rb") as log:
        log.seek(a.log_offset)
        return b"job(s) owned before this start" in log.read()


ONCE = """
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(os.environ["SHOAL_ATTEMPT"] + "\\n")
time.sleep(120)
"""
"""Appends its attempt number to a file, then sleeps."""


def test_jobs_submitted_as_the_mesh_starts_run_once_under_one_owner(tmp_path: Path) -> None:
    """No takeover without a loss, however early the jobs come.

    Jobs are submitted as soon as the agents listen, while they still learn of each other and
    before any has resumed the jobs of its store (a few seconds after its start). A job held by
    its owner must not be taken back from the store ("resumed after restart"), and a replica
    from an owner not heard of yet must not be taken over as if that owner were gone: either
    would place the job a second time.
    """
    mesh = Mesh(tmp_path, ["h100:2", "h100:2", "mi300x:2", "l4:2"])
    mesh.local.start()
    try:
        asyncio.run(mesh.local.wait_listening(timeout_s=DEADLINE_S))
        jobs = [new_job_id() for _ in range(6)]
        for i, job_id in enumerate(jobs):
            argv = [sys.executable, "-c", ONCE, str(tmp_path / f"runs-{i}")]
            a = mesh.agents[i % len(mesh.agents)]
            for _ in range(20):  # a 503 (no replica reached yet) is retried with the same id
                status, answer = mesh.command(a, "submit", {"job_id": job_id, "spec": spec(argv)})
                if status != 503:
                    break
                time.sleep(0.5)
            assert status == 200, answer
        if any(_resumed(a) for a in mesh.agents):
            pytest.skip("an agent resumed its store before the jobs came: too slow a machine")
        mesh.wait_converged()
        a = mesh.agents[0]
        mesh.wait("every agent past its resume", lambda: all(_resumed(x) for x in mesh.agents))
        mesh.wait(
            "every job running", lambda: all(mesh.job(a, j)["state"] == "running" for j in jobs)
        )
        for i in range(len(jobs)):
            mesh.wait(f"job {i} started", lambda i=i: (tmp_path / f"runs-{i}").exists())
        events = [e for x in mesh.agents for e in mesh.events(x) if e["node"] == x.node_id]
        # Ownership may move to the agent first in a job's order once all know each other (a
        # handover, the job untouched); never a takeover from the store or of an owner "gone".
        assert [e for e in events if e["kind"] in ("fencing", "requeued")] == []
        adopted = [e["message"] for e in events if e["kind"] == "adopted"]
        assert all(m.startswith("handed over by") for m in adopted), adopted
        for i, job_id in enumerate(jobs):
            # One attempt ran: the one placed (an offer a node declined is not a run).
            job = mesh.job(a, job_id)
            assert job["state"] == "running", job
            assert (tmp_path / f"runs-{i}").read_text().split() == [str(job["attempt"])]
    finally:
        mesh.stop_all()


FOLLOWED = """
import os, sys, time
gate = sys.argv[1]
i = 0
while not os.path.exists(gate):
    print("line", i, flush=True)
    i += 1
    time.sleep(0.1)
print("the end", flush=True)
"""
"""Prints a numbered line every 100 ms until the file ``gate`` exists, then ends (exit 0)."""


def test_logs_follow_streams_a_running_job_until_it_ends(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "mi300x:1"])
    mesh.start_all()
    cli: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    try:
        gate = tmp_path / "gate"
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec([sys.executable, "-c", FOLLOWED, str(gate)])}
        assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
        a = mesh.agents[0]
        mesh.wait("running", lambda: mesh.job(a, job_id)["state"] == "running")
        runner = mesh.job(a, job_id)["runner"]
        # Ask the agent that does not run it: the stream is proxied from the runner.
        other = next(x for x in mesh.agents if x.node_id != runner)
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.cli",
                "logs",
                "-f",
                job_id,
                "--agent",
                other.address,
                "--identity",
                str(mesh.cluster_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(cli, lines), daemon=True)
        reader.start()
        seen: list[str] = []

        def numbered(n: int) -> bool:
            while True:
                try:
                    line = lines.get_nowait()
                except queue.Empty:
                    return sum(1 for s in seen if s.startswith("line ")) >= n
                assert line is not None, f"logs -f ended early: {seen} {cli.stderr.read()}"
                seen.append(line)

        # Lines keep arriving while the job runs (it cannot end before the gate exists).
        mesh.wait("5 lines streamed", lambda: numbered(5))
        first_batch = len([s for s in seen if s.startswith("line ")])
        assert mesh.job(a, job_id)["state"] == "running"
        mesh.wait("more lines streamed", lambda: numbered(first_batch + 3))
        assert not gate.exists() and cli.poll() is None
        gate.touch()
        mesh.wait("the job succeeded", lambda: mesh.job(a, job_id)["state"] == "succeeded")
        assert cli.wait(timeout=DEADLINE_S) == 0, cli.stderr.read()
        reader.join(timeout=DEADLINE_S)
        while (line := lines.get()) is not None:
            seen.append(line)
        numbers = [int(s.split()[1]) for s in seen if s.startswith("line ")]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # none lost
        assert "the end" in seen
    finally:
        if cli is not None:
            _ended(cli, reader)
        mesh.stop_all()


def _ended(process: subprocess.Popen[str], reader: threading.Thread | None) -> None:
    """The process ended (killed if it still runs), its reader done, its pipes closed."""
    if process.poll() is None:
        process.kill()
    process.wait()
    if reader is not None:
        reader.join(timeout=10)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _read_lines(process: subprocess.Popen[str], out: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        out.put(line.rstrip("\n"))
    out.put(None)


def test_sigterm_stops_the_agent_cleanly_and_its_jobs_run_elsewhere(tmp_path: Path) -> None:
    """SIGTERM: the agent stops its jobs (cause ``shutdown``), reports them, leaves, exits 0.

    One job is owned by the stopping agent itself, one by another agent; both ran there and
    both run again elsewhere, never two attempts at once.
    """
    mesh = Mesh(tmp_path, ["h100:2", "h100:2", "h100:2"])
    mesh.start_all()
    try:
        leaving, *others = mesh.agents
        ids = [x.node_id for x in mesh.agents]
        # Only the leaving agent takes work until both jobs run there.
        for x in others:
            assert mesh.command(leaving, "cordon", {"node": x.node_id})[0] == 200
        mesh.wait(
            "the cordons seen everywhere",
            lambda: all(
                {n["node_id"]: n["drain"] for n in mesh.get(x, "/v1/nodes")["nodes"]}
                == {i: "schedulable" if i == leaving.node_id else "cordoned" for i in ids}
                for x in mesh.agents
            ),
        )
        own = _job_owned_by(leaving.node_id, ids, want=True)
        foreign = _job_owned_by(leaving.node_id, ids, want=False)
        for n, job_id in enumerate((own, foreign)):
            argv = [
                sys.executable,
                "-c",
                TICKER,
                str(tmp_path / f"ticks-{n}"),
                str(tmp_path / f"pids-{n}"),
            ]
            assert (
                mesh.command(others[0], "submit", {"job_id": job_id, "spec": spec(argv)})[0] == 200
            )
        mesh.wait(
            "both running on the leaving agent",
            lambda: all(
                (j := mesh.job(leaving, job_id))["state"] == "running"
                and j["runner"] == leaving.node_id
                for job_id in (own, foreign)
            ),
        )
        assert mesh.job(leaving, own)["owner"] == leaving.node_id
        assert mesh.job(leaving, foreign)["owner"] != leaving.node_id
        for n in range(2):
            mesh.wait(
                f"job {n} started its helper", lambda n=n: 1 in _groups(tmp_path / f"pids-{n}")
            )
        for x in others:
            assert mesh.command(leaving, "undrain", {"node": x.node_id})[0] == 200
        mesh.wait(
            "the undrains seen by the leaving agent",
            lambda: all(
                n["drain"] == "schedulable" for n in mesh.get(leaving, "/v1/nodes")["nodes"]
            ),
        )

        assert mesh.terminate(leaving.index) == 0, mesh.logs()
        with leaving.log_path.open("rb") as log:
            log.seek(leaving.log_offset)
            text = log.read().decode()
        assert "Traceback" not in text and "ERROR" not in text, text
        assert "agent_stopping" in text
        # Both jobs' process groups are gone, helpers included.
        for n in range(2):
            pgid, pid, _helper = _groups(tmp_path / f"pids-{n}")[1]
            assert pgid == pid
            mesh.wait(f"job {n}'s group gone", lambda pgid=pgid: _group_members(pgid) == [])
        # Both run again on the agents that stay, under an owner that stays.
        survivor = others[0]
        for n, job_id in enumerate((own, foreign)):
            mesh.wait(
                f"job {n} running again elsewhere",
                lambda job_id=job_id: (
                    (j := mesh.job(survivor, job_id))["state"] == "running"
                    and j["runner"] in {x.node_id for x in others}
                    and j["owner"] in {x.node_id for x in others}
                    and j["attempt"] >= 2
                ),
                deadline_s=45,
            )
            mesh.wait(
                f"job {n}'s next attempt ticking",
                lambda n=n: len(tick_spans(tmp_path / f"ticks-{n}")) >= 2,
            )
            spans = tick_spans(tmp_path / f"ticks-{n}")
            order = sorted(spans)
            for earlier, later in itertools.pairwise(order):
                assert spans[earlier][1] < spans[later][0], spans  # never two at once
        # The foreign job's owner requeued it on the shutdown report, not on a death.
        owner = mesh.agents[mesh.node_index(mesh.job(survivor, foreign)["owner"])]
        requeues = [
            e["message"]
            for e in mesh.events(owner)
            if e["job_id"] == foreign and e["kind"] == "requeued" and e["node"] == owner.node_id
        ]
        assert any("(shutdown)" in m for m in requeues), requeues
    finally:
        mesh.stop_all()


def _job_owned_by(node_id: str, nodes: list[str], *, want: bool) -> str:
    """A fresh job id whose rendezvous owner over ``nodes`` is (or is not) ``node_id``."""
    while True:
        job_id = new_job_id()
        if (owner_of(job_id, nodes) == node_id) == want:
            return job_id
