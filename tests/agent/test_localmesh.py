"""LocalMesh, the one way to start agent processes (``shoal demo``, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.sandbox.localmesh import AgentProcess, LocalMesh, _listening, compile_sources
from tests.agent.agents import Mesh

pytestmark = pytest.mark.slow


def test_an_agent_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    mesh = LocalMesh(tmp_path, 2, profiles=("h100:1", "l4:1"))
    mesh.create()
    taken = mesh.agents[1].address
    host, port = taken.rsplit(":", 1)
    with socket.socket() as squatter:
        # Ports are chosen before the agents bind them: something else binds one meanwhile.
        squatter.bind((host, int(port)))
        squatter.listen()
        mesh.start()
        try:
            asyncio.run(mesh.wait_converged(timeout_s=60))
            assert mesh.agents[1].address != taken
            assert all(a.running for a in mesh.agents)
            log = mesh.agents[1].log_path.read_text()
            assert log.count('"event": "listening"') == 1
            assert "address already in use" in log
        finally:
            mesh.stop()


def test_healthz_holds_a_watch_until_the_agent_sees_the_members_asked_for(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "l4:1"])
    try:
        first = mesh.start(0)
        # Nobody else yet: a short watch answers when its time is up, with the count it has.
        began = time.monotonic()
        assert mesh.get(first, "/healthz?members=2&wait_s=1")["members"] == 1
        assert 0.9 <= time.monotonic() - began < 5
        with ThreadPoolExecutor(1) as pool:
            watch = pool.submit(mesh.get, first, "/healthz?members=2&wait_s=50")
            time.sleep(0.5)
            assert not watch.done()  # held open
            mesh.start(1)
            answered = watch.result(timeout=30)  # well before the 50 s are up
        assert answered["members"] == 2
        assert mesh.get(first, "/healthz?members=2&wait_s=50")["members"] == 2  # at once
        for query, why in [
            ("members=two", "members must be an integer, not 'two'"),
            ("members=2&wait_s=3600", "wait_s must be between 0 and 60"),
        ]:
            status, body = mesh.request(first, "GET", f"/healthz?{query}")
            assert (status, json.loads(body)) == (400, {"error": why})
    finally:
        mesh.stop_all()


@pytest.mark.parametrize("placement", ["fifo", "shoal"])
def test_every_agent_places_with_the_placement_the_mesh_names(
    tmp_path: Path, placement: str
) -> None:
    """First fit takes the node first in id order; the Shoal policy, the H100 (4x an L4's speed
    for this class). Idle nodes, so either choice is the placement's alone."""
    mesh = LocalMesh(tmp_path, 3, profiles=("l4:1", "h100:1", "l4:1"), placement=placement)
    mesh.create()
    assert all(f'placement = "{placement}"' in a.config_path.read_text() for a in mesh.agents)
    h100 = mesh.agents[1].node_id
    want = min(a.node_id for a in mesh.agents) if placement == "fifo" else h100
    spec = JobSpec(
        command=("sleep", "30"),
        resources=Resources(gpus_per_node=1),
        labels={"class": "ResNet-50 (batch size 64)"},
    )

    async def every_agent_knows_every_gpu() -> None:
        """Each agent (the job's owner may be any) holds every node's devices and state: alive
        members alone may not have sent them yet, and a placement without the H100 is the L4."""
        for _ in range(600):
            views = []
            for i in range(len(mesh.agents)):
                async with mesh.client(i) as client:
                    views.append(await client.nodes())
            if all(
                len(nodes) == len(mesh.agents)
                and all(n["devices"] and n.get("drain") is not None for n in nodes)
                for nodes in views
            ):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"some agent lacks a node's devices or state: {views}")

    async def runner_of_a_job() -> str | None:
        await mesh.wait_converged(timeout_s=60)
        await every_agent_knows_every_gpu()
        async with mesh.client(2) as client:
            job_id = (await client.submit(spec))["job_id"]
            for _ in range(200):  # the listing may lag the owner's answer a moment
                job = {j["job_id"]: j for j in await client.jobs()}.get(job_id, {})
                if job.get("state") == "running":
                    return str(job["runner"])
                await asyncio.sleep(0.1)
        return None

    mesh.start()
    try:
        assert asyncio.run(runner_of_a_job()) == want
    finally:
        mesh.stop()


def test_the_sources_an_agent_imports_are_compiled_once_before_agents_start(tmp_path: Path) -> None:
    """Agents then read bytecode instead of each compiling every module (PYTHONDONTWRITEBYTECODE
    set, or all starting before any wrote it)."""
    for package in ("agent", "gossip", "probers", "tui"):
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "mod.py").write_text("X = 1\n")
    compile_sources(tmp_path)
    for package in ("agent", "gossip", "probers"):
        assert list((tmp_path / package / "sub" / "__pycache__").glob("mod.*.pyc"))
    assert not (tmp_path / "tui" / "sub" / "__pycache__").exists()  # agents never import it


def test_agents_start_no_more_at_once_than_the_machine_is_told(tmp_path: Path) -> None:
    class Recording(LocalMesh):
        """Notes, at each start, whether every agent started before it listens already."""

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.others_listening: list[bool] = []

        def start_agent(self, agent: AgentProcess) -> None:
            started = [a for a in self.agents if a.process is not None]
            self.others_listening.append(all(_listening(a) for a in started))
            super().start_agent(agent)

    mesh = Recording(tmp_path, 3, profiles=("l4:1",), starting_max=1)
    mesh.start()
    try:
        assert [a.process is not None for a in mesh.agents] == [True, False, False]
        converged_s = asyncio.run(mesh.wait_converged(timeout_s=60))
        assert converged_s >= 0 and all(a.running for a in mesh.agents)
        # one at a time: each started once the one before it listened
        assert mesh.others_listening == [True, True, True]
    finally:
        mesh.stop()
