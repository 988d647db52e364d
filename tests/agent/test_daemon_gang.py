"""Gangs on real agent processes (loopback, simulated GPUs): members meet where the variables say,
a lost member requeues the whole gang, two owners' gangs never deadlock, a hold runs out."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import owner_of
from gossip.identity import NodeIdentity, load_identity
from tests.agent.agents import Mesh, spec
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

MEET = """
import json, os, socket, sys, time, uuid
out = sys.argv[1]
ticks = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES",
         "MASTER_ADDR", "MASTER_PORT", "SHOAL_DEVICES", "SHOAL_ATTEMPT")
env = {k: os.environ.get(k) for k in names}
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(40)
    token = uuid.uuid4().hex
    peers = [server.accept()[0] for _ in range(world - 1)]
    got = sorted(int(c.makefile().readline()) for c in peers)
    value = f"{token}-{got}"
    for c in peers:
        c.sendall((value + "\\n").encode())
else:
    deadline = time.time() + 40
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.sendall(f"{rank}\\n".encode())
    value = c.makefile().readline().strip()
print(f"rank {rank} of {world} agreed on {value}", flush=True)
attempt = env["SHOAL_ATTEMPT"]
with open(f"{out}.{attempt}.{rank}.json", "w") as f:
    json.dump({"env": env, "value": value, "start": time.time()}, f)
end = time.time() + (ticks if attempt == "1" else min(ticks, 1.0))
while time.time() < end:
    with open(f"{out}.ticks", "a") as f:
        f.write(f"{attempt} {rank} {time.time()}\\n")
    time.sleep(0.05)
with open(f"{out}.{attempt}.{rank}.end", "w") as f:
    f.write(str(time.time()))
"""


def gang_spec(out: Path, *, ticks_s: float = 0.0, gpus: int = 2) -> dict[str, Any]:
    argv = [sys.executable, "-c", MEET, str(out), str(ticks_s)]
    return spec(argv, resources=Resources(gpus_per_node=gpus, nodes=2), retries=1)


def submit(mesh: Mesh, job_id: str, body: dict[str, Any], at: int = 0) -> dict[str, Any]:
    status, answer = mesh.command(mesh.agents[at], "submit", {"job_id": job_id, "spec": body})
    assert status == 200, answer
    return answer


def meetings(out: Path, attempt: int) -> dict[int, dict[str, Any]]:
    found = {}
    for p in out.parent.glob(f"{out.name}.{attempt}.*.json"):
        doc = json.loads(p.read_text())
        found[int(doc["env"]["RANK"])] = doc
    return found


def test_a_two_node_gang_meets_at_rank_zero_and_succeeds(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:2", "h100:2"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        out = tmp_path / "meet"
        job_id = new_job_id()
        submit(mesh, job_id, gang_spec(out))
        mesh.wait("succeeded", lambda: mesh.job(a, job_id)["state"] == "succeeded", 45)
        job = mesh.job(a, job_id)
        members = job["members"]
        assert [m["rank"] for m in members] == [0, 1]
        assert {m["node"] for m in members} == {x.node_id for x in mesh.agents}
        assert all(len(m["devices"]) == 2 for m in members)
        assert job["runner"] == members[0]["node"] and job["attempt"] == 1
        met = meetings(out, 1)
        assert sorted(met) == [0, 1]
        assert met[0]["value"] == met[1]["value"] and met[0]["value"].endswith("-[1]")
        rank0 = mesh.agents[mesh.node_index(members[0]["node"])]
        for rank, doc in met.items():
            env = doc["env"]
            assert env["WORLD_SIZE"] == "2" and env["NNODES"] == "2"
            assert env["NODE_RANK"] == str(rank)
            assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
            assert env["MASTER_ADDR"] == rank0.address.rpartition(":")[0]
            assert env["MASTER_PORT"] == met[0]["env"]["MASTER_PORT"]
            member = members[rank]
            assert env["SHOAL_DEVICES"] == ",".join(sorted(member["devices"]))
        entries = [(e["attempt"], e["rank"], e["cause"], e["exit_code"]) for e in job["attempts"]]
        assert entries == [(1, 0, "exit", 0), (1, 1, "exit", 0)]
        # Each rank's log, from the node it ran on.
        for m in members:
            status, body = mesh.request(
                a, "GET", f"/v1/jobs/{job_id}/logs?lines=10&attempt=1&node={m['node']}"
            )
            assert status == 200, body
            assert f"rank {m['rank']} of 2 agreed on {met[0]['value']}" in body.decode()
        # The operator's view: one row, the members in the detail, a log header per rank.
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        done = shoal("logs", job_id[:8], *flags)
        assert done.returncode == 0, done.stderr
        headers = [line for line in done.stdout.splitlines() if line.startswith("=== attempt")]
        assert [h.split()[2:5] for h in headers] == [["1", "rank", "0"], ["1", "rank", "1"]]
        assert all(h.endswith("(exit 0) ===") for h in headers)
        below = done.stdout.split(headers[1])
        assert "rank 0 of 2 agreed" in below[0] and "rank 1 of 2 agreed" in below[1]
        followed = shoal("logs", "-f", job_id[:8], *flags)
        assert followed.returncode == 0, followed.stderr
        assert f"[rank 0] rank 0 of 2 agreed on {met[0]['value']}" in followed.stdout
        assert f"[rank 1] rank 1 of 2 agreed on {met[0]['value']}" in followed.stdout
        table = shoal("jobs", *flags)
        row = next(line for line in table.stdout.splitlines() if line.startswith(job_id[:8]))
        assert "2 nodes" in row and "2x2" in row
        detail = shoal("jobs", job_id[:8], *flags).stdout
        lines = [line for line in detail.splitlines() if line[10:15] == "rank "]
        assert lines[0].startswith("Members   rank 0  ")
        assert lines[1].startswith(" " * 10 + "rank 1  ")
        for line, m in zip(lines, members, strict=True):
            assert line.endswith(",".join(m["devices"]))
    finally:
        mesh.stop_all()


def test_a_killed_member_requeues_the_whole_gang_never_two_attempts_at_once(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, ["h100:2", "h100:2", "h100:2"])
    mesh.start_all()
    try:
        out = tmp_path / "meet"
        job_id = new_job_id()
        owner = submit(mesh, job_id, gang_spec(out, ticks_s=60.0))["owner"]
        watcher = mesh.agents[mesh.node_index(owner)]
        mesh.wait("running", lambda: mesh.job(watcher, job_id)["state"] == "running", 45)
        mesh.wait("both ranks met", lambda: sorted(meetings(out, 1)) == [0, 1], 45)
        first = mesh.job(watcher, job_id)["members"]
        victim = next(m for m in first if m["node"] != owner)
        survivor = next(m for m in first if m["node"] != victim["node"])
        mesh.kill(mesh.node_index(victim["node"]))
        # Attempt 2, or a later one when an offer of the next was declined before it started
        # (its runner could not yet reach the dead member as the job's other owner).
        mesh.wait(
            "the gang to succeed on a later attempt",
            lambda: (j := mesh.job(watcher, job_id))["state"] == "succeeded" and j["attempt"] >= 2,
            50,
        )
        job = mesh.job(watcher, job_id)
        final = job["attempt"]
        assert victim["node"] not in {m["node"] for m in job["members"]}
        assert sorted(meetings(out, final)) == [0, 1]
        assert all(not meetings(out, a) for a in range(2, final)), "a declined attempt ran"
        # The surviving member of attempt 1 was stopped (fenced), not left running...
        ended = {(e["attempt"], e["node"]): e["cause"] for e in job["attempts"]}
        assert ended[(1, victim["node"])] == "lost"
        assert ended[(1, survivor["node"])] == "fenced"
        # ... and before any member of the next attempt began.
        ticks = [line.split() for line in (tmp_path / "meet.ticks").read_text().splitlines()]
        last_of_1 = max(float(t) for a, _, t in ticks if a == "1")
        first_of_next = min(float(doc["start"]) for doc in meetings(out, final).values())
        assert last_of_1 < first_of_next
        assert not (tmp_path / f"meet.1.{first.index(survivor)}.end").exists()
    finally:
        mesh.stop_all()


def test_an_owner_that_takes_a_running_gang_over_checks_every_member(tmp_path: Path) -> None:
    # The owner has one small GPU: the gang (two GPUs on each of two nodes) runs elsewhere.
    mesh = Mesh(tmp_path, ["l4:1", "h100:2", "h100:2"])
    mesh.start_all()
    try:
        live = [a.node_id for a in mesh.agents]
        job_id = _job_owned_by(live, live[0])
        out = tmp_path / "meet"
        submit(mesh, job_id, gang_spec(out, ticks_s=15.0))
        watcher = mesh.agents[1]
        mesh.wait("both ranks met", lambda: sorted(meetings(out, 1)) == [0, 1], 45)
        mesh.kill(0)
        mesh.wait(
            "the gang to succeed under its new owner",
            lambda: (
                (j := mesh.job(watcher, job_id))["state"] == "succeeded" and j["owner"] != live[0]
            ),
            50,
        )
        job = mesh.job(watcher, job_id)
        assert job["attempt"] == 1  # the new owner found both members running, and kept them
        assert sorted(e["cause"] for e in job["attempts"]) == ["exit", "exit"]
        assert {m["node"] for m in job["members"]} == set(live[1:])
        adopted = [e for e in mesh.events(watcher) if e.get("job_id") == job_id]
        assert "adopted" in {e["kind"] for e in adopted}
    finally:
        mesh.stop_all()


FAIL_ONE = """
import os, sys, time
if os.environ["RANK"] == "1":
    print("rank 1 gives up", flush=True)
    sys.exit(3)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
open(sys.argv[1] + ".end", "w").write("ran on")
"""


def test_a_failing_member_stops_the_others_and_fails_the_gang(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        job_id = new_job_id()
        pidfile = tmp_path / "rank0"
        argv = [sys.executable, "-c", FAIL_ONE, str(pidfile)]
        submit(mesh, job_id, spec(argv, resources=Resources(gpus_per_node=1, nodes=2)))
        mesh.wait("failed", lambda: mesh.job(a, job_id)["state"] == "failed", 45)
        job = mesh.job(a, job_id)
        assert job["reason"] == "exited with 3" and job["exit_code"] == 3
        ends = {e["rank"]: (e["cause"], e["exit_code"]) for e in job["attempts"]}
        assert ends[1] == ("exit", 3)
        assert ends[0][0] == "fenced"  # stopped for it
        assert not (tmp_path / "rank0.end").exists()
        written = pidfile.read_text().strip() if pidfile.exists() else ""
        if written:  # rank 0 had started and said so: it is gone, not left running
            with pytest.raises(ProcessLookupError):
                os.kill(int(written), 0)
    finally:
        mesh.stop_all()


def _job_owned_by(live: list[str], node: str) -> str:
    while True:
        job_id = new_job_id()
        if owner_of(job_id, live) == node:
            return job_id


def test_two_owners_gangs_on_overlapping_capacity_both_run_in_turn(tmp_path: Path) -> None:
    # Three nodes of two GPUs; each gang needs two whole nodes: only one fits at a time, and
    # any two sets of two nodes overlap. Two owners place them at once.
    mesh = Mesh(tmp_path, ["h100:2", "h100:2", "h100:2"])
    mesh.start_all()
    try:
        live = [a.node_id for a in mesh.agents]
        jobs = [_job_owned_by(live, live[0]), _job_owned_by(live, live[1])]
        for i, job_id in enumerate(jobs):
            submit(mesh, job_id, gang_spec(tmp_path / f"g{i}", ticks_s=3.0), at=i)
        a = mesh.agents[2]
        mesh.wait(
            "both gangs succeeded",
            lambda: all(mesh.job(a, j)["state"] == "succeeded" for j in jobs),
            55,
        )
        owners = {mesh.job(a, j)["owner"] for j in jobs}
        assert owners == {live[0], live[1]}
        spans = []
        for i, job_id in enumerate(jobs):
            job = mesh.job(a, job_id)
            met = meetings(tmp_path / f"g{i}", job["attempt"])
            start = min(float(doc["start"]) for doc in met.values())
            ends = tmp_path.glob(f"g{i}.{job['attempt']}.*.end")
            spans.append((start, max(float(p.read_text()) for p in ends)))
        spans.sort()
        assert spans[0][1] <= spans[1][0]  # never both at once: they would need four nodes
    finally:
        mesh.stop_all()


def _agent_identity(mesh: Mesh, i: int) -> NodeIdentity:
    return load_identity(mesh.agents[i].directory / "identity")


def test_a_prepare_never_committed_runs_out_and_frees_the_devices(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:2", "h100:2"])
    mesh.start_all()
    try:
        holder, other = mesh.agents
        me = _agent_identity(mesh, 1)  # an agent that may own every job of a 2-agent mesh
        gang_id = new_job_id()
        gang = gang_spec(tmp_path / "never")
        members = [
            {"rank": 0, "node": holder.node_id, "devices": []},
            {"rank": 1, "node": other.node_id, "devices": []},
        ]
        keys = [d["key"] for d in _devices(mesh, holder)]
        members[0]["devices"] = keys
        sealed = base64.b64encode(mesh.seal("submit", {"job_id": gang_id, "spec": gang}))
        prepare = {
            "job_id": gang_id,
            "attempt": 1,
            "owner": me.node_id,
            "members": members,
            "submission": sealed.decode(),
            "ttl_s": 6.0,
        }

        def call(op: str, body: dict[str, Any], as_: NodeIdentity = me) -> tuple[int, Any]:
            data = json.dumps(body).encode()
            status, raw = mesh.request(holder, "POST", f"/v1/internal/{op}", data, identity=as_)
            return status, json.loads(raw)

        # A submission the agent signed itself carries no authority.
        forged = dict(prepare, submission=base64.b64encode(b"not an operator's").decode())
        assert call("gang_prepare", forged)[0] == 403
        # A hold longer than the docs' 30 s is refused, saying so, and counted; none is taken.
        refused = _refused_400(mesh, holder)
        for ttl_s in (600.0, 30.5):
            status, answer = call("gang_prepare", dict(prepare, ttl_s=ttl_s))
            assert status == 400, answer
            assert f"a hold lasts more than 0 and at most 30 s, not {ttl_s:g} s" in answer["error"]
        assert _refused_400(mesh, holder) == refused + 2
        # Written ahead to the job's other owner (the holder itself), as an owner does.
        assert mesh.write_ahead(
            1, gang_id, base64.b64decode(sealed), 1, holder.node_id, members=members
        )
        held_at = time.time()
        status, answer = call("gang_prepare", prepare)
        assert status == 200 and answer["held"] is True, answer
        assert answer["master_addr"] == holder.address.rpartition(":")[0]
        assert 0 < answer["master_port"] < 65536
        # Held: a one-node job that needs both GPUs cannot run on the holder meanwhile, and
        # the other node's are taken by a job that runs until the end of the test.
        blocker = new_job_id()
        submit(mesh, blocker, spec(["sleep", "120"], gpus=2))
        mesh.wait("the blocker running", lambda: mesh.job(holder, blocker)["state"] == "running")
        assert mesh.job(holder, blocker)["runner"] == other.node_id
        waiter = new_job_id()
        submit(mesh, waiter, spec(["true"], gpus=2))
        mesh.wait("the waiter succeeded", lambda: mesh.job(holder, waiter)["state"] == "succeeded")
        job = mesh.job(holder, waiter)
        assert job["runner"] == holder.node_id
        assert job["started_at"] >= held_at + 6.0 - 0.5  # not before the hold ran out
        events = [e for e in mesh.events(holder) if e.get("job_id") == gang_id]
        assert [e["kind"] for e in events] == ["held", "released"]
        assert "held too long" in events[-1]["message"]
        # A commit after it ran out starts nothing.
        commit = {"job_id": gang_id, "attempt": 1, "master_addr": "127.0.0.1", "master_port": 1}
        status, answer = call("gang_commit", commit)
        assert status == 409 and "holds nothing here" in answer["error"]
        assert not list(tmp_path.glob("never*"))
    finally:
        mesh.stop_all()


def _refused_400(mesh: Mesh, a: Any) -> float:
    """Agent ``a``'s count of agent calls answered 400 (``shoal_api_refused_total``)."""
    status, body = mesh.request(a, "GET", "/metrics")
    assert status == 200
    sample = 'shoal_api_refused_total{route="/v1/internal/{op}",status="400"} '
    found = [line for line in body.decode().splitlines() if line.startswith(sample)]
    return float(found[0].split()[-1]) if found else 0.0


def _devices(mesh: Mesh, a: Any) -> list[dict[str, Any]]:
    nodes = {n["node_id"]: n for n in mesh.get(a, "/v1/nodes")["nodes"]}
    return list(nodes[a.node_id]["devices"])
