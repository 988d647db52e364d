"""Real agents on loopback: a job moves with its checkpoint (migrate, drain, a dead runner) through
the content store, never resumes a stale one, and only those with a say over the job may read it."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from agent.job.ownership import rank
from agent.sandbox.localmesh import AgentProcess
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import metric
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

TRAINER = """
import os, signal, sys, time
ck = os.environ["SHOAL_CHECKPOINT_DIR"]
resume = os.environ.get("SHOAL_RESUME")
step = int(open(os.path.join(ck, "step")).read()) if resume == "1" else 0
with open(sys.argv[1], "a") as f:
    f.write(f"{os.environ['SHOAL_ATTEMPT']} {resume} {step}\\n")
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
quiet = sys.argv[2:] == ["quiet"]  # a checkpoint only as it stops

def save():
    blob = os.path.join(ck, "blob")
    if not os.path.exists(blob):  # the "weights": written once, over several chunks
        with open(blob + ".tmp", "wb") as f:
            f.write(os.urandom(1_300_000))
        os.rename(blob + ".tmp", blob)
    with open(os.path.join(ck, "step.tmp"), "w") as f:
        f.write(str(step))
    os.rename(os.path.join(ck, "step.tmp"), os.path.join(ck, "step"))

while not stop:
    step += 1
    time.sleep(0.05)
    if step % 20 == 0 and not quiet:
        save()
save()
"""


def starts(path: Path) -> dict[int, tuple[str, int]]:
    """Each attempt's start, from the trainer's file: attempt -> (SHOAL_RESUME, first step)."""
    out: dict[int, tuple[str, int]] = {}
    if not path.exists():  # the job's process has not written its first line yet
        return out
    for line in path.read_text().splitlines():
        attempt, resume, step = line.split()
        out[int(attempt)] = (resume, int(step))
    return out


def ckpt_dir(mesh: Mesh, node_id: str, job_id: str) -> Path:
    return mesh.agents[mesh.node_index(node_id)].directory / "jobs" / job_id / "checkpoint"


def saved_step(folder: Path) -> int:
    return saved_step_file(folder / "step")


def saved_step_file(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def vault_copy(mesh: Mesh, i: int, job_id: str) -> tuple[int, int]:
    """The attempt and step of the checkpoint copy agent ``i`` holds in its store ((0, 0):
    none): its pointer, and the ``step`` file's object."""
    base = mesh.agents[i].directory
    try:
        held = json.loads((base / "checkpoints" / f"{job_id}.json").read_text())
        db = sqlite3.connect(f"file:{base / 'store' / 'index.db'}?mode=ro", uri=True)
        try:
            row = db.execute(
                "SELECT f.object FROM entries e JOIN files f USING (fkey)"
                " WHERE e.digest = ? AND e.path = 'step'",
                (held["digest"],),
            ).fetchone()
        finally:
            db.close()
    except (OSError, ValueError, KeyError, sqlite3.Error):
        return 0, 0
    if row is None or row[0] is None:
        return 0, 0
    return int(held["attempt"]), saved_step_file(base / "store" / "objects" / row[0][:2] / row[0])


def content(mesh: Mesh, a: AgentProcess, what: str) -> float:
    return metric(mesh, a, "shoal_content_total", what=what)


def fetched_bytes(mesh: Mesh, a: AgentProcess) -> float:
    return metric(mesh, a, "shoal_content_fetched_bytes_total", source="peer")


def total(mesh: Mesh, what: str) -> float:
    return sum(
        metric(mesh, a, "shoal_checkpoint_total", what=what) for a in mesh.agents if a.running
    )


def start_trainer(mesh: Mesh, log: Path) -> tuple[str, str]:
    """Submit the trainer; once it has saved a checkpoint, its job id and the node it runs on."""
    a = mesh.agents[0]
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec([sys.executable, "-c", TRAINER, str(log)], gpus=0)}
    assert mesh.command(a, "submit", body)[0] == 200
    mesh.wait("running", lambda: mesh.job(a, job_id)["state"] == "running")
    first: str = mesh.job(a, job_id)["runner"]
    mesh.wait("a checkpoint", lambda: saved_step(ckpt_dir(mesh, first, job_id)) >= 20)
    return job_id, first


def test_migrate_moves_the_checkpoint_through_a_cut_and_never_resumes_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every agent cuts the connection of the second chunk it serves or receives, once.
    monkeypatch.setenv("SHOAL_TEST_DROP_CHUNK_AT", "2")
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        log = tmp_path / "starts"
        job_id, first = start_trainer(mesh, log)
        source = ckpt_dir(mesh, first, job_id)
        # The target is neither the runner nor the owner, and last in the job's order: the
        # checkpoint reaches it only through the owner's push for the migration.
        owner = mesh.job(a, job_id)["owner"]
        order = rank(job_id, [x.node_id for x in mesh.agents])
        target = next(
            mesh.agents[mesh.node_index(n)] for n in reversed(order) if n not in (first, owner)
        )

        done = shoal("migrate", job_id[:8], "--to", target.node_id, *flags)
        assert done.returncode == 0, done.stderr
        mesh.wait(
            "attempt 2 on the target",
            lambda: (j := mesh.job(a, job_id))["attempt"] == 2 and j["state"] == "running",
        )
        assert mesh.job(a, job_id)["runner"] == target.node_id
        mesh.wait("attempt 2 started", lambda: 2 in starts(log))
        left = saved_step(source)  # what attempt 1 saved as it stopped
        assert starts(log)[2] == ("1", left) and left > 0
        there = ckpt_dir(mesh, target.node_id, job_id)
        assert (there / "blob").read_bytes() == (source / "blob").read_bytes()
        # Answers were cut mid-stream (each agent cut its second chunk answer): the fetches
        # asked those chunks again and went on, never started over or given up; the target
        # fetched each byte of the checkpoint once, from the holders the offer named.
        assert sum(content(mesh, x, "served_dropped") for x in mesh.agents) >= 1
        assert total(mesh, "failed") == 0
        assert metric(mesh, target, "shoal_checkpoint_total", what="fetched") >= 1
        assert fetched_bytes(mesh, target) == 1_300_000 + len(str(left))

        # Back to the first node, which still holds attempt 1's folder: attempt 3 resumes from
        # what attempt 2 saved, never from that stale one.
        mesh.wait("a newer checkpoint on the target", lambda: saved_step(there) >= left + 20)
        done = shoal("migrate", job_id[:8], "--to", first, *flags)
        assert done.returncode == 0, done.stderr
        mesh.wait("attempt 3 started", lambda: 3 in starts(log))
        resumed, step = starts(log)[3]
        assert resumed == "1" and step == saved_step(there) >= left + 20
        # The record says so once the runner has answered and gossip has carried it (an offer
        # of attempt 3 whose checkpoint fetch was cut is made again: pending meanwhile).
        mesh.wait(
            "attempt 3 listed on the first node",
            lambda: (j := mesh.job(a, job_id))["attempt"] == 3 and j["runner"] == first,
        )
        # The stale folder was replaced (attempt 3 saves on from there), not resumed.
        assert saved_step(source) >= step > left
        # The first node's store still held attempt 1's weights: of attempt 2's checkpoint it
        # fetched only the chunks it lacked (the step), never the weights again.
        back = mesh.agents[mesh.node_index(first)]
        assert metric(mesh, back, "shoal_checkpoint_total", what="fetched") >= 1
        assert 0 < fetched_bytes(mesh, back) < 1_300_000
    finally:
        mesh.stop_all()


def test_drain_and_a_dead_runner_move_the_job_with_its_checkpoint(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        log = tmp_path / "starts"
        job_id, first = start_trainer(mesh, log)

        status, _ = mesh.command(a, "drain", {"node": first, "grace_s": 0})
        assert status == 200
        mesh.wait("attempt 2 started", lambda: 2 in starts(log))
        left = saved_step(ckpt_dir(mesh, first, job_id))
        assert starts(log)[2] == ("1", left) and left > 0
        # The process starts before the records of attempt 2 reach every agent: wait for them.
        mesh.wait(
            "the record of attempt 2 with its runner",
            lambda: (
                mesh.job(a, job_id).get("attempt") == 2
                and mesh.job(a, job_id).get("runner") is not None
            ),
        )
        second = mesh.job(a, job_id)["runner"]
        assert second != first

        # Attempt 2 checkpoints again; a copy of it lands on an agent other than its runner
        # (its owner, or its replica when the owner runs it). Then its node dies.
        survivors = [x.index for x in mesh.agents if x.node_id != second]
        mesh.wait(
            "a copy of attempt 2's checkpoint off its node",
            lambda: any(
                vault_copy(mesh, i, job_id)[0] == 2 and vault_copy(mesh, i, job_id)[1] > left
                for i in survivors
            ),
        )
        copied = max(vault_copy(mesh, i, job_id)[1] for i in survivors)
        assert mesh.command(a, "undrain", {"node": first})[0] == 200
        mesh.kill(mesh.node_index(second))
        alive = mesh.agents[survivors[0]]
        mesh.wait("attempt 3 started", lambda: 3 in starts(log), deadline_s=60)
        resumed, step = starts(log)[3]
        assert resumed == "1" and step >= copied > left
        mesh.wait(
            "the record of attempt 3 here",
            lambda: mesh.job(alive, job_id).get("attempt") == 3,
        )
        assert mesh.job(alive, job_id)["runner"] != second
    finally:
        mesh.stop_all()


def test_an_owner_killed_as_it_starts_a_moved_job_itself_loses_no_checkpoint(
    tmp_path: Path,
) -> None:
    """The owner runs the job's next attempt itself: the copy it resumes from is on the replica
    before the attempt starts, so an owner killed at once takes no progress with it."""
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        log = tmp_path / "starts"
        job_id, first = start_trainer(mesh, log)
        owner = mesh.job(mesh.agents[0], job_id)["owner"]
        via = next(x for x in mesh.agents if x.node_id != owner)
        flags = ["--agent", via.address, "--identity", str(mesh.cluster_dir)]
        if first == owner:  # first away from the owner, so that the next move brings it back
            other = next(x.node_id for x in mesh.agents if x.node_id != owner)
            assert shoal("migrate", job_id[:8], "--to", other, *flags).returncode == 0
            mesh.wait("attempt 2 started", lambda: 2 in starts(log))
            mesh.wait("a checkpoint there", lambda: saved_step(ckpt_dir(mesh, other, job_id)) > 0)
        attempt = max(starts(log))

        done = shoal("migrate", job_id[:8], "--to", owner, *flags)
        assert done.returncode == 0, done.stderr
        mesh.wait("the attempt on the owner started", lambda: attempt + 1 in starts(log))
        mesh.kill(mesh.node_index(owner))
        resumed, left = starts(log)[attempt + 1]
        assert resumed == "1" and left > 0

        mesh.wait("the next attempt started", lambda: attempt + 2 in starts(log), deadline_s=60)
        resumed, step = starts(log)[attempt + 2]
        assert resumed == "1" and step >= left, "the next attempt lost what the moved one had"
    finally:
        mesh.stop_all()


def test_a_replica_back_ahead_of_the_old_one_gets_the_copy_of_a_job_its_owner_runs(
    tmp_path: Path,
) -> None:
    """An owner running its job itself keeps a copy of the checkpoint on the job's replica; when
    an agent comes back ahead of that replica in the job's order, the copy goes to it too, at
    once, not with the job's next checkpoint (which a job may write hours apart): it is the one
    that takes the job over if the owner dies."""
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        job_id = new_job_id()
        first, second, third = (
            mesh.node_index(n) for n in rank(job_id, [x.node_id for x in mesh.agents])
        )
        owner = mesh.agents[first]
        mesh.kill(second)  # away for now: the job's replica is the third
        mesh.wait("two agents", lambda: mesh.get(owner, "/healthz")["members"] == 2)
        log = tmp_path / "starts"
        argv = [sys.executable, "-c", TRAINER, str(log), "quiet"]  # saves only as it stops
        body = {"job_id": job_id, "spec": spec(argv, gpus=0)}
        assert mesh.command(owner, "submit", body)[0] == 200
        mesh.wait("running", lambda: mesh.job(owner, job_id)["state"] == "running")
        # "running" is recorded as the process starts, before it writes its first line.
        mesh.wait("the trainer's first line", lambda: bool(starts(log)))
        flags = ["--agent", owner.address, "--identity", str(mesh.cluster_dir)]
        # Moved until the owner runs it, with a checkpoint: the one its last stop saved.
        moves = [owner.node_id]
        if mesh.job(owner, job_id)["runner"] == owner.node_id:
            moves.insert(0, mesh.agents[third].node_id)
        for target in moves:
            after = max(starts(log)) + 1
            time.sleep(0.3)  # a few steps to save
            assert shoal("migrate", job_id[:8], "--to", target, *flags).returncode == 0
            mesh.wait("the next attempt started", lambda n=after: n in starts(log))
            mesh.wait("its record", lambda n=after: mesh.job(owner, job_id)["attempt"] == n)
        assert mesh.job(owner, job_id)["runner"] == owner.node_id
        last = max(starts(log))
        step_s = starts(log)[last][1]  # what it resumed from: the checkpoint, as it stays
        # The owner pulled the restored folder once (it changed): nothing changes after that.
        mesh.wait("the replica's copy", lambda: vault_copy(mesh, third, job_id) == (last, step_s))

        mesh.start(second)  # back, ahead of the third: the job's replica now
        mesh.wait("the copy on the new replica", lambda: vault_copy(mesh, second, job_id)[1] > 0)
        assert vault_copy(mesh, second, job_id)[1] == step_s
        mesh.kill(first)
        mesh.wait("a next attempt started", lambda: max(starts(log)) > last, deadline_s=60)
        assert starts(log)[max(starts(log))] == ("1", step_s)
    finally:
        mesh.stop_all()
