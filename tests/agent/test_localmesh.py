"""LocalMesh, the one way to start agent processes (``shoal demo``, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agent.localmesh import LocalMesh

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
