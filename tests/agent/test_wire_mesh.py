"""The wire contract between real agents: what the simulated mesh and an agent write has one
shape, and a whole 8-GPU NVLink baseboard and a MIG host arrive whole, with their OS and CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import new_job_id
from agent.wire.documents import EventsDoc, JobDoc, NodeDoc
from tests.agent.agents import Mesh
from tui.simmesh import SimSource

pytestmark = pytest.mark.slow


def _linked(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The first node with a linked device: the one whose documents are compared."""
    return next(n for n in nodes if any(d["links"] for d in n["devices"]))


def _keys(nodes: list[dict[str, Any]], jobs: list[dict[str, Any]], events: dict[str, Any]) -> Any:
    """The fields of every kind of document and sub-document (values aside)."""
    node = _linked(nodes)
    device = next(d for d in node["devices"] if d["links"])
    return {
        "node": sorted(node),
        "host": sorted(node["host"]),
        "device": sorted(device),
        "link": sorted(device["links"][0]),
        "job": sorted(jobs[0]),
        "events": sorted(events),
        "event": sorted(events["events"][0]),
    }


def test_agents_and_the_simulated_mesh_write_the_same_documents(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:8", "linux-a100"])
    first = mesh.agents[0]
    # A dataset on every host, so the compared node document lists dataset_versions as the
    # simulated mesh's hosts do (a node holding none leaves the field out).
    for agent in mesh.agents:
        agent.datasets_dir.mkdir(parents=True, exist_ok=True)
        (agent.datasets_dir / "imagenet").write_bytes(b"x" * 4096)
    try:
        mesh.start_all()
        mesh.wait(
            "its dataset listed",
            lambda: "dataset_versions" in _linked(mesh.get(first, "/v1/nodes")["nodes"]),
        )
        job_id = new_job_id()
        spec = {"command": ["true"], "resources": {"gpus_per_node": 1}}
        assert mesh.command(first, "submit", {"job_id": job_id, "spec": spec})[0] == 200
        mesh.wait("the job listed", lambda: bool(mesh.get(first, "/v1/jobs")["jobs"]))
        nodes = mesh.get(first, "/v1/nodes")["nodes"]
        jobs = mesh.get(first, "/v1/jobs")["jobs"]
        events = mesh.get(first, "/v1/events")
    finally:
        mesh.stop_all()
    sim = SimSource(4, seed=0)
    sim_nodes, sim_jobs = sim.nodes_now(), sim.jobs_now()
    assert _keys(nodes, jobs, events) == _keys(sim_nodes, sim_jobs, sim.events_now())
    # Every document decodes with the contract, and says what the hosts are.
    by_name = {}
    for raw in nodes:
        node = NodeDoc.from_wire(raw)
        assert node.host is not None and node.wire_version == 2
        by_name[node.host.hostname.split("-")[0]] = node
    [JobDoc.from_wire(j) for j in jobs]
    EventsDoc.from_wire(events)
    h100, a100 = by_name["h100"], by_name["linux"]
    assert len(h100.devices) == 8
    for d in h100.devices:  # a full NVLink mesh, every link to a device of the host
        peers = {link.peer for link in d.static.links}
        assert {link.kind for link in d.static.links} == {"nvlink"}
        assert peers == {o.static.key for o in h100.devices} - {d.static.key}
    assert (a100.host.os, a100.host.arch) == ("linux", "x86_64")  # type: ignore[union-attr]
    assert [len(d.static.mig_devices) for d in a100.devices] == [7, 0]
    assert a100.devices[0].static.source == "sim:nvml"
