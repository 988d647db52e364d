"""Real agents on loopback run jobs in the submitter's working folder: ``shoal submit --workdir``
packs it (less what .gitignore and .shoalignore leave out) and sends it to the agent it talks to,
the job's owner keeps it, and a gang's every member starts inside its own copy, whole and
writable; the same folder submitted again sends no chunk, a changed file only its own."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.job.ownership import rank
from tests.agent.agents import Mesh
from tests.shoal_cli import one_line_error, shoal

pytestmark = pytest.mark.slow

WAIT_S = 90.0

LISTER = r"""
import hashlib, json, os, sys
out = {"cwd": os.getcwd(), "files": {}, "rank": os.environ.get("RANK")}
for base, _dirs, files in os.walk("."):
    for f in files:
        p = os.path.join(base, f)
        with open(p, "rb") as fh:
            out["files"][os.path.relpath(p, ".")] = hashlib.sha256(fh.read()).hexdigest()
with open("written-by-the-job", "w") as fh:
    fh.write("the copy is the job's own")
with open(sys.argv[1] + "." + (out["rank"] or "0"), "w") as fh:
    json.dump(out, fh)
"""


def folder(top: Path) -> dict[str, bytes]:
    files = {
        "train.py": b"print('train')\n",
        "conf/model.yaml": b"layers: 12\n",
        "blob.bin": b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(16384)),
        "logs/old.log": b"not sent",
        ".gitignore": b"logs/\n",
        ".shoalignore": b"*.ckpt\n",
        "weights.ckpt": b"not sent either",
    }
    for rel, data in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
    return files


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ended(mesh: Mesh, job_id: str) -> dict[str, Any]:
    a = mesh.agents[0]
    mesh.wait(
        f"job {job_id[:8]} ended",
        lambda: mesh.job(a, job_id)["state"] in ("succeeded", "failed", "cancelled"),
        WAIT_S,
    )
    return mesh.job(a, job_id)


def test_a_gang_runs_in_the_working_folder_and_an_unchanged_one_is_not_sent_again(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "l4:1"])
    top = tmp_path / "proj"
    files = folder(top)
    mesh.start_all()
    try:
        entry = mesh.agents[2]  # the operator talks to the node that runs no member
        flags = ["--agent", entry.address, "--identity", str(mesh.cluster_dir)]
        out = tmp_path / "listing"
        gang = ["--nodes", "2", "--gpus", "1", "--mem", "40GiB"]
        argv = [sys.executable, "-c", LISTER, str(out)]
        done = shoal("submit", *flags, "--json", "--workdir", str(top), *gang, "--", *argv)
        assert done.returncode == 0, done.stderr
        first = json.loads(done.stdout)
        sent = first["workdir"]
        kept = {k: v for k, v in files.items() if k not in ("logs/old.log", "weights.ckpt")}
        assert sent["total_bytes"] == sum(len(v) for v in kept.values())
        assert sent["sent_bytes"] == sent["total_bytes"]
        job = ended(mesh, first["job_id"])
        assert job["state"] == "succeeded", (job, mesh.logs())
        members = {m["node"] for m in job["members"]}
        assert members == {mesh.agents[0].node_id, mesh.agents[1].node_id}
        for r in ("0", "1"):
            listing = json.loads(Path(f"{out}.{r}").read_text())
            assert listing["cwd"].endswith(f"/jobs/{first['job_id']}/work"), listing
            assert listing["files"] == {k: sha(v) for k, v in kept.items()}, listing

        # The job's owner and replica keep the folder, as they keep the submission.
        keepers = rank(first["job_id"], [a.node_id for a in mesh.agents])[:2]

        def kept_whole() -> bool:
            done = shoal("cache", *flags, "--json")
            assert done.returncode == 0, done.stderr
            docs = {d["node"]: d for d in json.loads(done.stdout)["nodes"]}
            return all(
                any(
                    i["kind"] == "workdir"
                    and i["digest"] == sent["digest"]
                    and i["held_bytes"] == i["total_bytes"]
                    for i in docs[k]["items"]
                )
                for k in keepers
            )

        mesh.wait("the owner and the replica hold the folder", kept_whole, WAIT_S)
        listed = shoal("cache", *flags)
        assert listed.returncode == 0 and "folder" in listed.stdout, listed
        assert f"({keepers[0][:8]})" in listed.stdout  # each node by its name and short id
        only = shoal("cache", *flags, "--node", keepers[0][:10])
        assert only.returncode == 0 and only.stdout.count(" store ") == 1, only
        assert "no node is named" in one_line_error(shoal("cache", *flags, "--node", "nosuch"))

        # The same folder again: only its manifest goes up.
        again = shoal("submit", *flags, "--json", "--workdir", str(top), "--", *argv)
        assert again.returncode == 0, again.stderr
        second = json.loads(again.stdout)
        assert second["workdir"]["digest"] == sent["digest"]
        assert (second["workdir"]["sent_bytes"], second["workdir"]["sent_chunks"]) == (0, 0)
        assert ended(mesh, second["job_id"])["state"] == "succeeded"

        # One file changed: that file's one chunk goes up, nothing else.
        (top / "train.py").write_bytes(b"print('train v2')\n")
        third = json.loads(
            shoal("submit", *flags, "--json", "--workdir", str(top), "--", *argv).stdout
        )
        assert third["workdir"]["sent_chunks"] == 1
        assert third["workdir"]["sent_bytes"] == len(b"print('train v2')\n")
        assert ended(mesh, third["job_id"])["state"] == "succeeded"
    finally:
        mesh.stop_all()


def test_a_folder_over_the_cap_is_refused_and_nothing_submitted(tmp_path: Path) -> None:
    top = tmp_path / "proj"
    top.mkdir()
    (top / "big.bin").write_bytes(b"x" * (2 << 20))
    done = shoal(
        "submit",
        "--agent",
        "127.0.0.1:1",
        "--workdir",
        str(top),
        "--workdir-max",
        "1MiB",
        "--",
        "true",
    )
    line = one_line_error(done)
    assert "more than the cap of 1.0 MiB" in line and ".shoalignore" in line, line
