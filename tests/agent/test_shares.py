"""Shares of one GPU on real agents: jobs that ask for part of a GPU run together on one device
while their memory fits, a device given whole takes no share (and the other way round), and the
node's record, ``/v1/nodes``, ``shoal nodes`` and the simulated telemetry show what is shared.

The mesh: one L4 (the only CUDA GPU) and one MI300X; every job here asks for CUDA.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources, new_job_id
from tests.agent.agents import Mesh, spec, started
from tests.agent.test_cli_ops import Operator
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

L4, MI300X = 0, 1


def sleeper(out: Path) -> list[str]:
    """A job that writes the variables that pin it (whole: the file appears once written),
    then sleeps."""
    names = [
        "CUDA_VISIBLE_DEVICES",
        "SHOAL_DEVICES",
        "SHOAL_GPUS",
        "SHOAL_GPU_SHARE",
        "SHOAL_GPU_MEM_BYTES",
    ]
    script = (
        "import json, os, sys, time\n"
        f"env = {{n: os.environ.get(n) for n in {names!r}}}\n"
        "open(sys.argv[1] + '.part', 'w').write(json.dumps(env))\n"
        "os.replace(sys.argv[1] + '.part', sys.argv[1])\n"
        "time.sleep(300)\n"
    )
    return [sys.executable, "-c", script, str(out)]


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with started(tmp_path, ["l4:1", "mi300x:1"]) as m:
        yield m


def node_doc(mesh: Mesh, index: int) -> dict[str, Any]:
    a = mesh.agents[index]
    return next(
        n for n in mesh.get(mesh.agents[0], "/v1/nodes")["nodes"] if n["node_id"] == a.node_id
    )


def test_two_half_gpu_jobs_share_one_gpu_and_a_third_waits(mesh: Mesh, tmp_path: Path) -> None:
    op = Operator(mesh, mesh.agents[0])
    # One share from the command line, one from a job file: half of one GPU each.
    argv = ["--gpus", "0.5", "--backend", "cuda", "--kind", "inference"]
    done = shoal("submit", *op.flags, "--json", *argv, "--", *sleeper(tmp_path / "first.json"))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    first = answer["job_id"]
    assert (answer["asks"], answer["fits_now"]) == ("a 0.5 share of one GPU (cuda)", True)
    mesh.wait("the first share running and listed", lambda: node_doc(mesh, L4)["shares"] != {})
    job_file = tmp_path / "second.toml"
    job_file.write_text(
        f"command = {json.dumps(sleeper(tmp_path / 'second.json'))}\n"
        'kind = "inference"\n[resources]\ngpus = 0.5\nbackends = ["cuda"]\n'
    )
    answer = json.loads(op.ok("submit", "--json", "--file", str(job_file)))
    second = answer["job_id"]
    assert answer["fits_now"], answer  # the CLI reads the shares: the other half is free
    mesh.wait(
        "both shares running", lambda: all(op.job(j)["state"] == "running" for j in (first, second))
    )
    l4 = mesh.agents[L4]
    (key,) = (d["key"] for d in node_doc(mesh, L4)["devices"] if d["backend"] != "cpu")
    total = next(d["mem_total_bytes"] for d in node_doc(mesh, L4)["devices"] if d["key"] == key)
    for j in (first, second):
        assert (op.job(j)["runner"], op.job(j)["devices"]) == (l4.node_id, [key])

    # Each is pinned to the shared device and told its share.
    mesh.wait(
        "both wrote their env",
        lambda: all((tmp_path / f).exists() for f in ("first.json", "second.json")),
    )
    envs = [json.loads((tmp_path / f).read_text()) for f in ("first.json", "second.json")]
    uuid = next(d["uuid"] for d in node_doc(mesh, L4)["devices"] if d["key"] == key)
    for env in envs:
        assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["SHOAL_DEVICES"] == key
        assert env["SHOAL_GPU_SHARE"] == "0.5"
        assert env["SHOAL_GPU_MEM_BYTES"] == str(total // 2)

    # The node record, /v1/nodes and shoal nodes say what is shared; the telemetry adds it up.
    mesh.wait(
        "the shares listed",
        lambda: node_doc(mesh, L4)["shares"] == {key: {first: total // 2, second: total // 2}},
    )
    assert node_doc(mesh, MI300X)["shares"] == {}
    listing = op.ok("nodes")
    assert "1 shared (2 jobs); 1x" in listing, listing
    rows = {line[:8]: line.split() for line in op.ok("jobs").splitlines()[2:]}
    assert rows[first[:8]][3] == rows[second[:8]][3] == "0.5", rows  # the GPUs column

    def loaded() -> bool:
        d = next(d for d in node_doc(mesh, L4)["devices"] if d["key"] == key)
        return d["util_pct"] >= 85 and d["mem_used_bytes"] >= total // 2

    mesh.wait("the combined load in the telemetry", loaded)

    # A third half waits; so does a job that wants the whole GPU.
    third = new_job_id()
    half = spec(
        sleeper(tmp_path / "third.json"),
        resources=Resources(gpus_per_node=1, backends=("cuda",), share_fraction=0.5),
    )
    assert mesh.command(mesh.agents[0], "submit", {"job_id": third, "spec": half})[0] == 200
    whole = new_job_id()
    gpu = spec(
        sleeper(tmp_path / "whole.json"), resources=Resources(gpus_per_node=1, backends=("cuda",))
    )
    assert mesh.command(mesh.agents[0], "submit", {"job_id": whole, "spec": gpu})[0] == 200
    mesh.wait(
        "the third share's reason", lambda: "0.5 of a GPU" in (op.job(third).get("reason") or "")
    )
    mesh.wait("the whole job's reason", lambda: "free GPU" in (op.job(whole).get("reason") or ""))
    assert op.job(third)["state"] == op.job(whole)["state"] == "pending"

    # Offered straight to the runner, neither is taken: the device's memory is all shared.
    job = JobSpec(command=("true",), resources=Resources(gpus_per_node=1))
    status, error = mesh.offer(MI300X, L4, job, [key])
    assert (status, "in use" in error) == (409, True), error
    job = JobSpec(command=("true",), resources=Resources(gpus_per_node=1, share_mem_bytes=1 << 30))
    status, error = mesh.offer(MI300X, L4, job, [key])
    assert (status, "the share needs 1 GiB" in error) == (409, True), error

    # One share ends: the third starts on the same device; the whole job still waits.
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": first})[0] == 200
    mesh.wait("the third share running", lambda: op.job(third)["state"] == "running")
    assert op.job(third)["devices"] == [key]
    assert op.job(whole)["state"] == "pending"
    # Both shares end: the device is free, and the whole job takes it.
    for j in (second, third):
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": j})[0] == 200
    mesh.wait("the whole job running", lambda: op.job(whole)["state"] == "running")
    mesh.wait("no shares listed", lambda: node_doc(mesh, L4)["shares"] == {})
    # Now a share waits for the device given whole.
    fourth = new_job_id()
    assert mesh.command(mesh.agents[0], "submit", {"job_id": fourth, "spec": half})[0] == 200
    mesh.wait("the share's reason", lambda: "0.5 of a GPU" in (op.job(fourth).get("reason") or ""))
    job = JobSpec(command=("true",), resources=Resources(gpus_per_node=1, share_fraction=0.25))
    status, error = mesh.offer(MI300X, L4, job, [key])
    assert (status, "given whole" in error) == (409, True), error
    for j in (whole, fourth):
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": j})[0] == 200
