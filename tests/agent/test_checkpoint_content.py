"""Real agents on loopback: a checkpoint is content of the store like any other, with its own rule
of who may read it and when it may go. Only an agent with a say over the job reads it (an owner,
the agent that started the attempt there, the node an owner named to run the next attempt);
a holder that serves chunks that do not match is dropped and the chunks come from another; and a
waiting job's checkpoint is never evicted, whatever the store's budget."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from agent.content.manifest import MIN_CHUNK_BYTES, ContentManifest
from agent.job.jobspec import new_job_id
from agent.job.ownership import rank
from agent.sandbox.localmesh import AgentProcess
from gossip.identity import load_identity
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import metric
from tests.agent.test_checkpoint_move import TRAINER, ckpt_dir, saved_step, starts, vault_copy
from tests.agent.test_content_fetch import content, make_dataset, preload

pytestmark = pytest.mark.slow

CHUNK = MIN_CHUNK_BYTES
CONTENT = "/v1/internal/content"


def make_checkpoint(job_id: str, sizes: dict[str, int]) -> tuple[ContentManifest, dict[str, bytes]]:
    """A checkpoint of ``job_id`` as a runner's store holds it (kind ``checkpoint``, named by
    the job), and its chunks."""
    m, chunks = make_dataset(job_id, sizes)
    return dataclasses.replace(m, kind="checkpoint"), chunks


def refused(mesh: Mesh, a: AgentProcess) -> float:
    return metric(mesh, a, "shoal_internal_refused_total", call="checkpoint")


def test_a_checkpoint_is_read_only_by_those_with_a_say_and_a_lying_holder_is_dropped(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, ["h100:1"] * 3)
    job_id = new_job_id()
    nodes = [a.node_id for a in mesh.agents]
    receiver, liar, honest = (mesh.agents[mesh.node_index(n)] for n in rank(job_id, nodes))
    # The liar and the receiver may act as the job's owner (first and second in its order);
    # the honest holder may not, but owns another job, where it is first.
    other_job = next(j for j in iter(new_job_id, "") if rank(j, nodes)[0] == honest.node_id)
    m, chunks = make_checkpoint(job_id, {"model.pt": 24 * CHUNK, "step": 3})
    for a in (liar, honest):
        preload(a, m, chunks)
    plain = mesh.local.env
    mesh.local.env = lambda a: {  # type: ignore[method-assign]
        **plain(a),
        **({"SHOAL_TEST_CORRUPT_CHUNKS": "1"} if a is liar else {}),
    }
    mesh.start_all()
    try:
        ids = {a.index: load_identity(a.directory / "identity") for a in mesh.agents}
        chunk = next(iter(chunks))
        routes = (
            f"{CONTENT}/{m.digest}",
            f"{CONTENT}/{m.digest}/have",
            f"{CONTENT}/chunk/{chunk}?of={m.digest}",
            f"{CONTENT}/{m.digest}/chunks?n=0",
        )
        # An owner of another job (not of this one), even once an owner of that other job
        # lets it read that job's checkpoint: refused on every route, each counted.
        grant = json.dumps({"job_id": other_job, "node": honest.node_id}).encode()
        status, _ = mesh.request(
            liar, "POST", "/v1/internal/checkpoint_grant", grant, identity=ids[honest.index]
        )
        assert status == 200
        for route in routes:
            status, answer = mesh.request(liar, "GET", route, identity=ids[honest.index])
            assert status == 403, (route, answer)
        assert refused(mesh, liar) == len(routes)
        assert content(mesh, liar, "served_refused") == len(routes)
        # The operator is no agent at all; a grant for this job from a non-owner is refused.
        assert mesh.request(liar, "GET", routes[0])[0] == 403
        grant = json.dumps({"job_id": job_id, "node": honest.node_id}).encode()
        status, _ = mesh.request(
            liar, "POST", "/v1/internal/checkpoint_grant", grant, identity=ids[honest.index]
        )
        assert status == 403
        assert refused(mesh, liar) == len(routes) + 1
        # An owner of the job reads it.
        assert mesh.request(liar, "GET", routes[0], identity=ids[receiver.index])[0] == 200

        # A copy ordered by a non-owner is refused; by an owner (the liar's key), the receiver
        # fetches from both holders: the liar's chunks do not match, so it is dropped and every
        # chunk comes from the honest holder, checked.
        order = {"job_id": job_id, "attempt": 1, "digest": m.digest, "holders": [honest.node_id]}
        body = json.dumps(order).encode()
        path = "/v1/internal/checkpoint_copy"
        assert mesh.request(receiver, "POST", path, body, identity=ids[honest.index])[0] == 403
        assert refused(mesh, receiver) == 1
        status, answer = mesh.request(
            receiver, "POST", path, body, identity=ids[liar.index], timeout_s=60.0
        )
        assert status == 200, answer
        assert content(mesh, receiver, "holders_dropped") == 1
        assert content(mesh, receiver, "chunks_refused") >= 1
        assert content(mesh, liar, "served_chunks") >= 1
        assert (
            metric(mesh, receiver, "shoal_content_fetched_bytes_total", source="peer")
            == m.total_bytes
        )
        pointer = json.loads((receiver.directory / "checkpoints" / f"{job_id}.json").read_text())
        assert pointer == {"attempt": 1, "digest": m.digest}
    finally:
        mesh.stop_all()


def held_in_store(a: AgentProcess, digest: str) -> bool:
    """Whether agent ``a``'s store knows manifest ``digest`` (its index, read-only)."""
    db = sqlite3.connect(f"file:{a.directory / 'store' / 'index.db'}?mode=ro", uri=True)
    try:
        return (
            db.execute("SELECT 1 FROM manifests WHERE digest = ?", (digest,)).fetchone() is not None
        )
    finally:
        db.close()


def test_the_checkpoint_of_a_waiting_job_is_never_evicted(tmp_path: Path) -> None:
    """One agent, its store's budget so small that the job's checkpoint alone is over the cache
    rules' watermark, with other content held: the job stops (its node drained) and waits
    while the rules run again and again; the other content is evicted, the checkpoint kept,
    and the job resumes from it."""
    config = tmp_path / "agent.toml"
    config.write_text("store_budget_bytes = 1420000\n")  # high watermark: 1.278 MB
    mesh = Mesh(
        tmp_path / "mesh",
        ["h100:1"],
        extra=("--config", str(config), "--datasets-rescan-s", "0.5"),
    )
    a = mesh.agents[0]
    older, older_chunks = make_checkpoint("c" * 32, {"older": CHUNK})
    older = ContentManifest("workdir", "older", CHUNK, older.files)  # cache: no job names it
    preload(a, older, older_chunks)
    mesh.start_all()
    try:
        log = tmp_path / "starts"
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec([sys.executable, "-c", TRAINER, str(log)], gpus=0)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("running", lambda: mesh.job(a, job_id)["state"] == "running")
        mesh.wait("a checkpoint", lambda: saved_step(ckpt_dir(mesh, a.node_id, job_id)) >= 20)
        assert mesh.command(a, "drain", {"node": a.node_id, "grace_s": 0})[0] == 200
        mesh.wait("waiting", lambda: mesh.job(a, job_id)["state"] == "pending")
        left = saved_step(ckpt_dir(mesh, a.node_id, job_id))
        mesh.wait("its last checkpoint held", lambda: vault_copy(mesh, 0, job_id) == (1, left))
        mesh.wait("the other content evicted", lambda: not held_in_store(a, older.digest))
        time.sleep(2.0)  # the cache rules run every 0.5 s meanwhile (a bounded wait)
        assert vault_copy(mesh, 0, job_id) == (1, left)
        assert mesh.command(a, "undrain", {"node": a.node_id})[0] == 200
        mesh.wait("attempt 2 started", lambda: 2 in starts(log))
        assert starts(log)[2] == ("1", left)
    finally:
        mesh.stop_all()
