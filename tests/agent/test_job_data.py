"""Real agents on loopback give jobs their datasets: a job naming a dataset another node holds
waits while its runner stages it (its reason says how far), starts with ``SHOAL_DATA_<NAME>``
readable and whole (the job hashes what it reads), a gang stages on every member, a job never
starts on a partial copy (the holder killed mid-stage), and a job reaches no dataset its spec
does not name."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.content.manifest import ContentManifest
from agent.job.jobspec import Resources, new_job_id
from agent.sandbox.localmesh import AgentProcess
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import metric
from tests.agent.test_content_fetch import CHUNK, make_dataset, preload

pytestmark = pytest.mark.slow

WAIT_S = 90.0
BIG_GPU = Resources(gpus_per_node=1, min_mem_per_gpu_bytes=40 << 30)
"""Fits an H100 (80 GB), not an L4 (24 GB): the job runs where the data is not."""

READER = r"""
import hashlib, json, os, sys
out = {"env": {k: v for k, v in os.environ.items() if k.startswith("SHOAL_DATA")}, "files": {}}
root = os.environ.get("SHOAL_DATA_IMAGENET")
if root:
    for base, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(base, f)
            with open(p, "rb") as fh:
                out["files"][os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
for probe in sys.argv[2:]:
    try:
        with open(probe, "rb") as fh:
            fh.read(1)
        out.setdefault("read", []).append(probe)
    except OSError as exc:
        out.setdefault("refused", []).append(probe)
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh)
"""


def expected_hashes(m: ContentManifest, chunks: dict[str, bytes]) -> dict[str, str]:
    return {
        f.path: hashlib.sha256(b"".join(chunks[d] for d in f.chunks)).hexdigest() for f in m.files
    }


def submit(mesh: Mesh, at: AgentProcess, argv: list[str], **extra: Any) -> str:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(argv, **extra)}
    status, answer = mesh.command(at, "submit", body)
    assert status == 200, answer
    return job_id


def ended(mesh: Mesh, a: AgentProcess, job_id: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    mesh.wait(
        f"job {job_id[:8]} ended",
        lambda: mesh.job(a, job_id)["state"] in ("succeeded", "failed", "cancelled"),
        wait_s,
    )
    return mesh.job(a, job_id)


def test_a_job_waits_while_its_dataset_stages_then_reads_it_whole(tmp_path: Path) -> None:
    cap = 256 << 10
    mesh = Mesh(
        tmp_path, ["h100:1", "l4:1", "l4:1"], extra=("--content-link-bytes-per-s", str(cap))
    )
    m, chunks = make_dataset("imagenet", {"train/a.bin": 20 * CHUNK + 5, "val/b.bin": 3 * CHUNK})
    for holder in mesh.agents[1:]:
        preload(holder, m, chunks)
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        out = tmp_path / "read.json"
        job_id = submit(
            mesh,
            runner,
            [sys.executable, "-c", READER, str(out)],
            resources=BIG_GPU,
            datasets=("imagenet",),
        )
        reasons: list[str] = []

        def staging_said() -> bool:
            reason = mesh.job(runner, job_id).get("reason") or ""
            if reason.startswith("staging"):
                reasons.append(reason)
            return bool(re.fullmatch(r"staging imagenet \d+% \(.+ from \d holders?.*\)", reason))

        mesh.wait("the job's reason shows the staging", staging_said, WAIT_S)
        job = ended(mesh, runner, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        read = json.loads(out.read_text())
        assert read["files"] == expected_hashes(m, chunks), read
        root = read["env"]["SHOAL_DATA_IMAGENET"]
        assert read["env"]["SHOAL_DATASETS"] == f"imagenet={root}"
        assert root.endswith(f"/jobs/{job_id}/datasets/imagenet"), root
        assert job.get("reason") in (None, ""), job
        assert metric(mesh, runner, "shoal_job_data_total", what="misses") == 1
        assert metric(mesh, runner, "shoal_job_data_wait_seconds_count") == 1
        assert metric(mesh, runner, "shoal_job_data_wait_seconds_sum") > 1.0
        # Held here now: the next job naming it waits for nothing.
        out2 = tmp_path / "again.json"
        again = submit(
            mesh,
            runner,
            [sys.executable, "-c", READER, str(out2)],
            resources=BIG_GPU,
            datasets=(f"imagenet@{m.digest}",),
        )
        assert ended(mesh, runner, again)["state"] == "succeeded"
        assert json.loads(out2.read_text())["files"] == expected_hashes(m, chunks)
        assert metric(mesh, runner, "shoal_job_data_total", what="hits") == 1
    finally:
        mesh.stop_all()
