"""Real agents on loopback give jobs their datasets: a job naming a dataset another node holds
waits while its runner stages it (its reason says how far), starts with ``SHOAL_DATA_<NAME>``
readable and whole (the job hashes what it reads), a gang stages on every member (for its launch,
or ahead by a pre-fetch), a job never starts on a partial copy (the holder killed mid-stage), and
a job reaches no dataset its spec does not name."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from agent.content.manifest import ContentManifest
from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import rank
from agent.sandbox.localmesh import AgentProcess
from agent.wire.calls import PrefetchAsk
from gossip import envelope
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import Intruder, metric
from tests.agent.test_content_fetch import CHUNK, make_dataset, preload
from tests.support import require_system

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
GANG_HEAD = """
import os, sys
sys.argv[1] += "." + os.environ["RANK"]  # each rank its own file: both ranks run at once
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
    # 1.4 MiB from two holders at 96 KiB/s each: about 8 s of staging, so the runner's staging
    # line (its node record) reaches the owner and becomes the reason (WATCH_S) on a loaded host.
    cap = 96 << 10
    mesh = Mesh(
        tmp_path, ["h100:1", "l4:1", "l4:1"], extra=("--content-link-bytes-per-s", str(cap))
    )
    m, chunks = make_dataset("imagenet", {"train/a.bin": 20 * CHUNK + 5, "val/b.bin": 3 * CHUNK})
    labels, label_chunks = make_dataset("labels.v2", {"l.txt": 100})
    for holder in mesh.agents[1:]:
        preload(holder, m, chunks)
    preload(mesh.agents[2], labels, label_chunks)
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        out = tmp_path / "read.json"
        job_id = submit(
            mesh,
            runner,
            [sys.executable, "-c", READER, str(out)],
            resources=BIG_GPU,
            datasets=("imagenet", "labels.v2"),
        )
        reasons: list[str] = []

        def staging_said() -> bool:
            reason = mesh.job(runner, job_id).get("reason") or ""
            if reason.startswith("staging"):
                reasons.append(reason)
            return bool(re.fullmatch(r"staging imagenet \d+% \(.+ from \d holders?.*\)", reason))

        try:
            mesh.wait("the job's reason shows the staging", staging_said, WAIT_S)
        except AssertionError as exc:
            raise AssertionError(f"reasons seen: {reasons}\n{exc}") from None
        job = ended(mesh, runner, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        read = json.loads(out.read_text())
        assert read["files"] == expected_hashes(m, chunks), read
        root = read["env"]["SHOAL_DATA_IMAGENET"]
        second = read["env"]["SHOAL_DATA_LABELS_V2"]
        assert read["env"]["SHOAL_DATASETS"] == f"imagenet={root}:labels.v2={second}"
        assert root.endswith(f"/jobs/{job_id}/datasets/imagenet"), root
        assert second.endswith(f"/jobs/{job_id}/datasets/labels.v2"), second
        assert job.get("reason") in (None, ""), job
        assert metric(mesh, runner, "shoal_job_data_total", what="misses") == 2
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


def test_a_gang_stages_on_every_member(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "l4:1"])
    m, chunks = make_dataset("imagenet", {"a.bin": 6 * CHUNK + 3, "sub/b.bin": CHUNK})
    preload(mesh.agents[2], m, chunks)
    mesh.start_all()
    try:
        a = mesh.agents[0]
        argv = [sys.executable, "-c", GANG_HEAD + READER, str(tmp_path / "rank")]
        gang = Resources(gpus_per_node=1, nodes=2, min_mem_per_gpu_bytes=40 << 30)
        job_id = submit(mesh, a, argv, resources=gang, datasets=("imagenet",))
        job = ended(mesh, a, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        assert {x["node"] for x in job["members"]} == {
            mesh.agents[0].node_id,
            mesh.agents[1].node_id,
        }
        for rank in (0, 1):
            read = json.loads((tmp_path / f"rank.{rank}").read_text())
            assert read["files"] == expected_hashes(m, chunks), (rank, read)
        for member in mesh.agents[:2]:
            # Staged for a launch (a miss), or before it by a pre-fetch its owner asked for
            # while the gang waited for its second member (then the launch found it: a hit);
            # never twice: a later attempt of the gang on the same member finds it held (a hit).
            misses = metric(mesh, member, "shoal_job_data_total", what="misses")
            hits = metric(mesh, member, "shoal_job_data_total", what="hits")
            fetched = metric(mesh, member, "shoal_job_data_total", what="prefetch_started")
            seen = (member.index, misses, hits, fetched)
            assert misses <= 1, seen
            assert misses == 1 or (hits >= 1 and fetched >= 1), seen
    finally:
        mesh.stop_all()


def test_a_job_never_starts_on_a_partial_copy(tmp_path: Path) -> None:
    """The only holder is killed mid-stage: the job does not start (its reason says why); the
    holder back, the staging goes on from what was held and the job runs once, on a whole copy."""
    cap = 128 << 10
    mesh = Mesh(
        tmp_path, ["h100:1", "l4:1", "l4:1"], extra=("--content-link-bytes-per-s", str(cap))
    )
    m, chunks = make_dataset("imagenet", {"a.bin": 24 * CHUNK + 1})
    holder = mesh.agents[2]
    preload(holder, m, chunks)
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        live = [x.node_id for x in mesh.agents]
        job_id = next(j for j in iter(new_job_id, "") if rank(j, live)[-1] == holder.node_id)
        out = tmp_path / "read.json"
        body = {
            "job_id": job_id,
            "spec": spec(
                [sys.executable, "-c", READER, str(out)],
                resources=BIG_GPU,
                datasets=("imagenet",),
            ),
        }
        assert mesh.command(runner, "submit", body)[0] == 200
        mesh.wait(
            "staging under way",
            lambda: (mesh.job(runner, job_id).get("reason") or "").startswith("staging imagenet"),
            WAIT_S,
        )
        mesh.kill(2)
        mesh.wait(
            "the offer declined for want of a holder, the job waiting for one",
            lambda: (
                (mesh.job(runner, job_id).get("reason") or "").startswith(
                    "waiting: dataset imagenet: no member holds it"
                )
                and mesh.job(runner, job_id)["state"] == "pending"
            ),
            WAIT_S,
        )
        assert not out.exists(), "the job started on a partial copy"
        mesh.start(2)
        job = ended(mesh, runner, job_id, 2 * WAIT_S)
        assert job["state"] == "succeeded", (job, mesh.logs())
        assert json.loads(out.read_text())["files"] == expected_hashes(m, chunks)
        assert len([x for x in job["attempts"] if x.get("started_at")]) == 1, job["attempts"]
        assert metric(mesh, runner, "shoal_job_data_total", what="failed") >= 1
        assert metric(mesh, runner, "shoal_content_total", what="resumes") >= 1
    finally:
        mesh.stop_all()


PROBE = r"""
echo "uid $(id -u)"
echo "vars $(env | grep '^SHOAL_DATA' | cut -d= -f1 | sort | tr '\n' ' ')"
cd "$SHOAL_DATA_IMAGENET" || exit 3
find . -type f | sort | while read -r f; do
    echo "hash ${f#./} $(sha256sum < "$f" | cut -d' ' -f1)"
done
shift
for f in "$@"; do
    if cat "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi
done
if (: >> "$SHOAL_DATA_IMAGENET/a.bin") 2>/dev/null; then echo "WROTE"; else echo "NOWRITE"; fi
"""


def test_a_job_reads_only_the_datasets_its_spec_names(tmp_path: Path) -> None:
    """Jobs run as nobody: one reads ``imagenet``, read-only; the store, the objects of another
    dataset and the links an earlier job had to it are out of its reach."""
    require_system(sys.platform.startswith("linux"), "setpriv: Linux")
    require_system(os.geteuid() == 0, "root, so that the agent runs its jobs as nobody")
    root = Path(tempfile.mkdtemp(prefix="shoal-data-", dir="/tmp"))
    root.chmod(0o755)
    mesh = Mesh(root, ["h100:1", "l4:1"], job_user=None)
    m, chunks = make_dataset("imagenet", {"a.bin": 2 * CHUNK + 9})
    secret, secret_chunks = make_dataset("secret", {"s.bin": CHUNK + 1})
    preload(mesh.agents[1], m, chunks)
    preload(mesh.agents[1], secret, secret_chunks)
    try:
        mesh.start_all()
        runner = mesh.agents[0]
        first = submit(mesh, runner, ["true"], resources=BIG_GPU, datasets=("secret",))
        assert ended(mesh, runner, first)["state"] == "succeeded", mesh.logs()
        s_sha = expected_hashes(secret, secret_chunks)["s.bin"]
        probes = [
            str(runner.directory / "store" / "index.db"),
            str(runner.directory / "store" / "objects" / s_sha[:2] / s_sha),
            str(runner.directory / "jobs" / first / "datasets" / "secret" / "s.bin"),
        ]
        assert Path(probes[1]).exists(), "the secret is in the runner's store"
        job_id = submit(
            mesh,
            runner,
            ["sh", "-c", PROBE, "sh", "-", *probes],
            resources=BIG_GPU,
            datasets=("imagenet",),
        )
        state = ended(mesh, runner, job_id)["state"]
        status, text = mesh.request(runner, "GET", f"/v1/jobs/{job_id}/logs?lines=50")
        assert status == 200
        lines = text.decode().splitlines()
        assert state == "succeeded", "\n".join(lines[-8:])
        assert "uid 65534" in lines
        assert "vars SHOAL_DATASETS SHOAL_DATA_IMAGENET " in lines, lines
        hashes = {ln.split()[1]: ln.split()[2] for ln in lines if ln.startswith("hash ")}
        assert hashes == expected_hashes(m, chunks)
        assert [ln for ln in lines if ln.startswith(("READ", "DENIED"))] == [
            f"DENIED {p}" for p in probes
        ]
        assert "NOWRITE" in lines
    finally:
        mesh.stop_all()
        shutil.rmtree(root, ignore_errors=True)


HOLD = """
import os, sys, time
end = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < end:
    time.sleep(0.1)
"""


def running(mesh: Mesh, a: AgentProcess, job_id: str) -> dict[str, Any]:
    mesh.wait(f"job {job_id[:8]} running", lambda: mesh.job(a, job_id)["state"] == "running")
    return mesh.job(a, job_id)


def stage_state(mesh: Mesh, a: AgentProcess, m: ContentManifest) -> str | None:
    for s in mesh.get(a, "/v1/content/stages")["stages"]:
        if s["digest"] == m.digest:
            return str(s["state"])
    return None


def data_count(mesh: Mesh, a: AgentProcess, what: str) -> float:
    return metric(mesh, a, "shoal_job_data_total", what=what)


def test_a_waiting_job_is_prefetched_and_starts_with_no_data_wait(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "l4:1", "l4:1"], extra=("--datasets-rescan-s", "1"))
    m, chunks = make_dataset("imagenet", {"a.bin": 20 * CHUNK + 7})
    preload(mesh.agents[1], m, chunks)
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        release = tmp_path / "release"
        first = submit(mesh, runner, [sys.executable, "-c", HOLD, str(release)], resources=BIG_GPU)
        running(mesh, runner, first)
        out = tmp_path / "read.json"
        job_id = submit(
            mesh,
            runner,
            [sys.executable, "-c", READER, str(out)],
            resources=BIG_GPU,
            datasets=("imagenet",),
        )
        mesh.wait(
            "the waiting job's data pre-fetched on the only node it fits",
            lambda: stage_state(mesh, runner, m) == "done",
            WAIT_S,
        )
        # Still waiting for the GPU (the job's record may reach this agent after its data).
        mesh.wait(
            "the job pending, as the runner sees it",
            lambda: mesh.job(runner, job_id)["state"] == "pending",
            WAIT_S,
        )
        assert data_count(mesh, runner, "prefetch_started") == 1
        assert sum(metric(mesh, a, "shoal_prefetch_total", what="asked") for a in mesh.agents) >= 1
        release.touch()
        job = ended(mesh, runner, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        assert json.loads(out.read_text())["files"] == expected_hashes(m, chunks)
        assert (data_count(mesh, runner, "hits"), data_count(mesh, runner, "misses")) == (1, 0)
        assert metric(mesh, runner, "shoal_job_data_wait_seconds_sum") < 1.0
        # The rate the runner measured from the holder reaches the others' view (its place
        # record), where the scheduler's data term reads it.
        holder = mesh.agents[1].node_id

        def rate_seen() -> float:
            nodes = mesh.get(mesh.agents[2], "/v1/nodes")["nodes"]
            doc = next(n for n in nodes if n["node_id"] == runner.node_id)
            return float(doc.get("fetch_rates", {}).get(holder, 0.0))

        mesh.wait("the measured rate gossiped", lambda: rate_seen() > 0, WAIT_S)
    finally:
        mesh.stop_all()


def test_a_waiting_gang_is_prefetched_on_every_member_it_is_forecast_on(tmp_path: Path) -> None:
    """Both H100s are busy; a 2-node gang naming a dataset the L4 holds waits, and both H100
    nodes (its forecast members) stage the dataset meanwhile: once they free, every rank starts
    on a whole copy with no data wait."""
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "l4:1"], extra=("--datasets-rescan-s", "1"))
    m, chunks = make_dataset("imagenet", {"a.bin": 12 * CHUNK + 5})
    preload(mesh.agents[2], m, chunks)
    mesh.start_all()
    try:
        a0 = mesh.agents[0]
        release = tmp_path / "release"
        hold = [sys.executable, "-c", HOLD, str(release)]
        for _ in range(2):
            running(mesh, a0, submit(mesh, a0, hold, resources=BIG_GPU))
        argv = [sys.executable, "-c", GANG_HEAD + READER, str(tmp_path / "rank")]
        gang = Resources(gpus_per_node=1, nodes=2, min_mem_per_gpu_bytes=40 << 30)
        job_id = submit(mesh, a0, argv, resources=gang, datasets=("imagenet",))
        big = mesh.agents[:2]
        mesh.wait(
            "the waiting gang's data pre-fetched on both members",
            lambda: all(stage_state(mesh, a, m) == "done" for a in big),
            WAIT_S,
        )
        # Still waiting for the GPUs (its record may reach this agent after its data).
        mesh.wait(
            "the gang pending, as this agent sees it",
            lambda: mesh.job(a0, job_id)["state"] == "pending",
            WAIT_S,
        )
        assert all(data_count(mesh, a, "prefetch_started") == 1 for a in big)
        release.touch()
        job = ended(mesh, a0, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        for rank in (0, 1):
            read = json.loads((tmp_path / f"rank.{rank}").read_text())
            assert read["files"] == expected_hashes(m, chunks), (rank, read)
        for member in big:
            assert (data_count(mesh, member, "hits"), data_count(mesh, member, "misses")) == (1, 0)
    finally:
        mesh.stop_all()


def test_a_stale_prefetch_is_cancelled_when_the_forecast_moves(tmp_path: Path) -> None:
    cap = 64 << 10
    mesh = Mesh(
        tmp_path,
        ["h100:1", "h100:1", "l4:1"],
        extra=("--content-link-bytes-per-s", str(cap)),
    )
    m, chunks = make_dataset("imagenet", {"a.bin": 32 * CHUNK + 7})
    preload(mesh.agents[2], m, chunks)
    mesh.start_all()
    try:
        a0 = mesh.agents[0]
        release = tmp_path / "release"
        hold = [sys.executable, "-c", HOLD, str(release)]
        for _ in range(2):
            running(mesh, a0, submit(mesh, a0, hold, resources=BIG_GPU))
        out = tmp_path / "read.json"
        job_id = submit(
            mesh,
            a0,
            [sys.executable, "-c", READER, str(out)],
            resources=BIG_GPU,
            datasets=("imagenet",),
        )
        big = mesh.agents[:2]
        mesh.wait(
            "a pre-fetch on one of the two nodes it fits",
            lambda: any(data_count(mesh, a, "prefetch_started") == 1 for a in big),
            WAIT_S,
        )
        first = next(a for a in big if data_count(mesh, a, "prefetch_started") == 1)
        other = big[1] if first is big[0] else big[0]
        assert stage_state(mesh, first, m) == "staging"
        status, answer = mesh.command(a0, "cordon", {"node": first.node_id})
        assert status == 200, answer
        mesh.wait(
            "the forecast moved: the stale pre-fetch cancelled, the other node asked",
            lambda: (
                data_count(mesh, first, "prefetch_cancelled") == 1
                and data_count(mesh, other, "prefetch_started") == 1
            ),
            WAIT_S,
        )
        mesh.wait(
            "the stale stage ended", lambda: stage_state(mesh, first, m) == "cancelled", WAIT_S
        )
        assert sum(metric(mesh, a, "shoal_prefetch_total", what="moved") for a in mesh.agents) >= 1
        release.touch()
        job = ended(mesh, a0, job_id, 2 * WAIT_S)
        assert job["state"] == "succeeded", (job, mesh.logs())
        assert job["runner"] == other.node_id
        assert json.loads(out.read_text())["files"] == expected_hashes(m, chunks)
    finally:
        mesh.stop_all()


def test_a_job_naming_a_dataset_no_member_holds_waits_until_one_is_added(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "l4:1"])
    mesh.start_all()
    try:
        runner, host = mesh.agents
        out = tmp_path / "read.json"
        job_id = submit(
            mesh,
            runner,
            [sys.executable, "-c", READER, str(out)],
            resources=BIG_GPU,
            datasets=("imagenet",),
        )
        said = "waiting: dataset imagenet: no member holds it"
        mesh.wait("the reason", lambda: mesh.job(runner, job_id).get("reason") == said)
        assert mesh.job(runner, job_id)["state"] == "pending"
        assert (
            sum(metric(mesh, a, "shoal_placements_total", outcome="declined") for a in mesh.agents)
            == 0
        )
        src = tmp_path / "imagenet"
        (src / "train").mkdir(parents=True)
        files = {"train/a.bin": os.urandom(3 * CHUNK + 11), "b.txt": b"labels\n"}
        for rel, data in files.items():
            (src / rel).write_bytes(data)
        status, answer = mesh.command(host, "data_add", {"name": "imagenet", "path": str(src)})
        assert status == 200, answer
        job = ended(mesh, runner, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        want = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
        assert json.loads(out.read_text())["files"] == want
    finally:
        mesh.stop_all()


def test_a_prefetch_needs_the_operators_submission_and_an_owner(tmp_path: Path) -> None:
    """A member asks a node to pre-fetch: for a job it may not own (with the operator's genuine
    submission), and for a job of its window with a submission it signed itself. Both refused
    (403), nothing staged."""
    mesh = Mesh(tmp_path, ["h100:1", "l4:1", "l4:1"])
    m, chunks = make_dataset("imagenet", {"a.bin": 4 * CHUNK})
    preload(mesh.agents[1], m, chunks)
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        intruder = Intruder(mesh, 2)
        live = [a.node_id for a in mesh.agents]
        body = spec(["true"], resources=BIG_GPU, datasets=(f"imagenet@{m.digest}",))
        theirs = next(j for j in iter(new_job_id, "") if intruder.node_id not in rank(j, live)[:2])
        sealed = mesh.seal("submit", {"job_id": theirs, "spec": body})
        mine = next(j for j in iter(new_job_id, "") if rank(j, live)[0] == intruder.node_id)
        forged = envelope.seal(
            intruder.signer,
            "submit",
            json.dumps({"job_id": mine, "spec": body}).encode(),
            time.time(),
        )
        for job_id, submission in ((theirs, sealed), (mine, forged)):
            ask = PrefetchAsk(job_id, intruder.node_id, submission).to_wire()
            assert intruder.call(runner, "prefetch", ask) == 403
        assert metric(mesh, runner, "shoal_internal_refused_total", call="prefetch") == 2
        assert stage_state(mesh, runner, m) is None
        assert data_count(mesh, runner, "prefetch_started") == 0
    finally:
        mesh.stop_all()


def test_a_copy_evicted_since_it_was_staged_is_staged_again(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "l4:1"])
    m, chunks = make_dataset("imagenet", {"a.bin": 3 * CHUNK + 1})
    preload(mesh.agents[1], m, chunks)
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        ref = f"imagenet@{m.digest}"
        first = submit(mesh, runner, ["true"], resources=BIG_GPU, datasets=(ref,))
        assert ended(mesh, runner, first)["state"] == "succeeded", mesh.logs()
        body = {"dataset": ref, "node": runner.node_id}
        status, answer = mesh.command(runner, "data_evict", body)
        assert status == 200, answer
        out = tmp_path / "read.json"
        again = submit(
            mesh,
            runner,
            [sys.executable, "-c", READER, str(out)],
            resources=BIG_GPU,
            datasets=(ref,),
        )
        job = ended(mesh, runner, again)
        assert job["state"] == "succeeded", (job, mesh.logs())
        assert json.loads(out.read_text())["files"] == expected_hashes(m, chunks)
        # Fetched twice: by its launch, or by a pre-fetch while it waited for the device the
        # first job had just been offered.
        fetched = metric(mesh, runner, "shoal_content_fetched_bytes_total", source="peer")
        assert fetched == 2 * (3 * CHUNK + 1)
    finally:
        mesh.stop_all()
