"""An agent keeps the highest incarnation it used in its data folder: one accused far ahead
refutes past the wall clock, and killed and restarted at once it starts above that refutation,
so its peers take its new life and records at its first Alive (the same-second restart and the
clock stepped back, on real gossip members: tests/gossip/test_restart_incarnation.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gossip.incarnation import INCARNATION_FILE, IncarnationFile
from tests.agent.agents import Mesh
from tests.agent.test_accusations import accuse
from tests.agent.test_attacks import Intruder, metric

pytestmark = pytest.mark.slow


def test_an_agent_restarted_after_refuting_past_the_clock_starts_above_it(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "l4:1", "h100:1"])
    mesh.start_all()
    try:
        victim = mesh.agents[1]
        kept = IncarnationFile(victim.directory / INCARNATION_FILE)
        booted = kept.read()
        assert booted is not None and booted <= int(time.time())
        refuted = metric(mesh, victim, "shoal_gossip_refutations_total")
        ahead = int(time.time()) + 3000
        assert set(accuse(Intruder(mesh, 2), mesh, victim.node_id, [ahead])) <= {200, 204}
        refutations = "shoal_gossip_refutations_total"
        mesh.wait("the refutation", lambda: metric(mesh, victim, refutations) > refuted)
        raised = kept.read()
        assert raised is not None and raised > ahead  # kept before its Alive went out
        mesh.kill(1)
        mesh.start(1)
        again = kept.read()
        assert again is not None and again > raised
        assert metric(mesh, victim, "shoal_gossip_incarnations_unkept_total") == 0

        # what the new life publishes reaches the others: its drain, ordered by the operator
        assert mesh.command(victim, "drain", {"node": victim.node_id, "grace_s": 0})[0] == 200

        def drained_seen() -> bool:
            nodes = {n["node_id"]: n for n in mesh.get(mesh.agents[0], "/v1/nodes")["nodes"]}
            return nodes[victim.node_id]["drain"] is not None

        mesh.wait("the restarted agent's drain heard by another", drained_seen)

        def started_again() -> bool:
            return any(
                (e["node"], e["kind"]) == (victim.node_id, "agent_started")
                and e["message"].startswith("boot 2 ")
                for e in mesh.events(mesh.agents[0])
            )

        mesh.wait("the restarted agent's start in another's event log", started_again)
    finally:
        mesh.stop_all()
