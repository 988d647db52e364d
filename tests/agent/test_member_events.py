"""A member's death is told to the mesh once, by its successor, not once by every agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.mesh.mesh import reporter_of
from tests.agent.agents import started

pytestmark = pytest.mark.slow


def test_a_killed_agent_is_one_member_dead_event_in_every_agents_feed(tmp_path: Path) -> None:
    with started(tmp_path, ["l4:1"] * 4) as mesh:
        gone = mesh.agents[2]
        mesh.kill(2)
        others = [a for a in mesh.agents if a is not gone]
        teller = reporter_of(gone.node_id, [a.node_id for a in others])

        def deaths(a: object) -> list[dict[str, object]]:
            return [
                e
                for e in mesh.events(a)  # type: ignore[arg-type]
                if e["kind"] == "member_dead" and str(e["message"]).startswith(gone.node_id[:8])
            ]

        mesh.wait("every agent holds the death", lambda: all(deaths(a) for a in others))
        for a in others:
            told = deaths(a)
            assert [e["node"] for e in told] == [teller], told
        assert "is dead" in mesh.logs()  # each agent still logs what it saw
