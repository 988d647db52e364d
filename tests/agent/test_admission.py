"""The hard filters a job's spec states, honoured by real agents: the owner places by them, and the
runner checks them again against its own inventory (links, labels, OS) before it admits an offer.

The mesh: an 8x H100 host whose GPUs are joined by NVLink (rack-a), a host with two L4 on PCIe
(rack-b), and a Windows host with an Arc A770 (rack-a).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.policy.adapt import link_domains
from agent.running.admission import NodeFacts, local_node, offer_problem
from agent.sandbox.localmesh import AgentProcess
from probers.records import DeviceStatic, Link
from tests.agent.agents import Mesh, spec

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
NVLINK, PCIE, WINDOWS = 0, 1, 2


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("admission"), ["h100:8", "l4:2", "windows-arc-a770"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def submit(mesh: Mesh, resources: Resources, **extra: Any) -> str:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(SLEEPER, resources=resources, **extra)}
    status, answer = mesh.command(mesh.agents[0], "submit", body)
    assert status == 200, answer
    return job_id


def running_on(mesh: Mesh, job_id: str) -> dict[str, Any]:
    mesh.wait(
        f"job {job_id[:8]} running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running"
    )
    return mesh.job(mesh.agents[0], job_id)


def device_keys(mesh: Mesh, a: AgentProcess) -> list[str]:
    node = next(n for n in mesh.get(a, "/v1/nodes")["nodes"] if n["node_id"] == a.node_id)
    return [d["key"] for d in node["devices"] if d["backend"] != "cpu"]


def test_an_nvlink_job_runs_only_where_its_gpus_are_linked(mesh: Mesh) -> None:
    jobs = [submit(mesh, Resources(gpus_per_node=2, interconnect="nvlink")) for _ in range(3)]
    nvlink_host = mesh.agents[NVLINK]
    keys = set(device_keys(mesh, nvlink_host))
    for job_id in jobs:
        job = running_on(mesh, job_id)
        assert job["runner"] == nvlink_host.node_id
        assert len(job["devices"]) == 2 and set(job["devices"]) <= keys
    # Labels and the OS place too: each of these has one host that meets it.
    windows = running_on(mesh, submit(mesh, Resources(gpus_per_node=1, os="windows")))
    assert windows["runner"] == mesh.agents[WINDOWS].node_id
    rack_b = running_on(mesh, submit(mesh, Resources(gpus_per_node=1), affinity={"zone": "rack-b"}))
    assert rack_b["runner"] == mesh.agents[PCIE].node_id
    for job_id in [*jobs, windows["job_id"], rack_b["job_id"]]:
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


@pytest.mark.parametrize(
    ("resources", "extra", "reason"),
    [
        (Resources(gpus_per_node=2, interconnect="xgmi"), {}, "linked by xgmi"),
        (Resources(gpus_per_node=1, os="darwin"), {}, "OS darwin"),
        (Resources(gpus_per_node=1), {"affinity": {"zone": "rack-z"}}, "label zone=rack-z"),
        (
            Resources(gpus_per_node=2, interconnect="nvlink"),
            {"anti_affinity": {"zone": "rack-a"}},
            "no label zone=rack-a",
        ),
    ],
)
def test_a_job_nothing_satisfies_waits_with_its_reason(
    mesh: Mesh, resources: Resources, extra: dict[str, Any], reason: str
) -> None:
    job_id = submit(mesh, resources, **extra)
    mesh.wait(
        f"the reason {reason!r}",
        lambda: reason in (mesh.job(mesh.agents[0], job_id).get("reason") or ""),
    )
    assert mesh.job(mesh.agents[0], job_id)["state"] == "pending"
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_a_runner_declines_an_offer_its_own_node_does_not_meet(mesh: Mesh) -> None:
    pcie = mesh.agents[PCIE]
    keys = device_keys(mesh, pcie)
    before = {j["job_id"] for j in mesh.get(pcie, "/v1/jobs")["jobs"]}
    cases = [
        (Resources(gpus_per_node=2, interconnect="nvlink"), {}, keys, "not linked by nvlink"),
        (Resources(gpus_per_node=1, os="windows"), {}, keys[:1], "OS windows"),
        (Resources(gpus_per_node=1), {"affinity": {"zone": "rack-a"}}, keys[:1], "zone=rack-a"),
        (Resources(gpus_per_node=1), {"anti_affinity": {"zone": "rack-b"}}, keys[:1], "no label"),
        (Resources(gpus_per_node=2), {}, keys[:1], "offered 1 device(s) for a job of 2"),
    ]
    for resources, extra, offered, reason in cases:
        job = JobSpec(command=tuple(SLEEPER), resources=resources, **extra)
        status, error = mesh.offer(NVLINK, PCIE, job, offered)
        assert (status, reason in error) == (409, True), (status, error)
    # The same offer of a job the node does meet is taken: the refusals were the filters'.
    status, _ = mesh.offer(NVLINK, PCIE, JobSpec(command=("true",)), [])
    assert status == 200
    assert {j["job_id"] for j in mesh.get(pcie, "/v1/jobs")["jobs"]} >= before


# -- the check itself, on captured shapes of inventory ------------------------------------------


def _gpu(key: str, *peers: str) -> DeviceStatic:
    links = tuple(Link(peer=p, kind="nvlink") for p in peers)
    return DeviceStatic(
        key=key, vendor="nvidia", backend="cuda", name="H100", source="sim", links=links
    )


def test_two_nvlink_islands_on_one_host_are_two_domains() -> None:
    # Two HGX halves: 0-1 linked, 2-3 linked, nothing across.
    statics = [_gpu("g0", "g1"), _gpu("g1", "g0"), _gpu("g2", "g3"), _gpu("g3", "g2")]
    domains = link_domains(statics)
    assert domains["g0"] == domains["g1"] != domains["g2"] == domains["g3"]
    node = local_node("n", NodeFacts(os="linux"), statics)
    job = JobSpec(command=("x",), resources=Resources(gpus_per_node=2, interconnect="nvlink"))
    assert offer_problem(job, node, ["g0", "g1"]) is None
    assert offer_problem(job, node, ["g2", "g3"]) is None
    assert offer_problem(job, node, ["g1", "g2"]) == "devices g1, g2 are not linked by nvlink here"
