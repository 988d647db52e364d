"""Gossip members on separate test hosts (network namespaces): partition one, then heal."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gossip.identity import enroll_node, init_cluster
from tests.gossip.procs import Member, start, wait_until
from tests.netns import Lab, netns_available
from tests.support import require_system

pytestmark = [pytest.mark.slow, pytest.mark.system]

HOSTS = 4
PORT = 7946


@pytest.fixture
def lab() -> Iterator[Lab]:
    ok, why = netns_available()
    require_system(ok, why)
    lab = Lab(HOSTS)
    try:
        yield lab.open()
    finally:
        lab.close()


def test_partitioned_host_is_detected_then_heals_to_a_full_view(lab: Lab, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    ca = init_cluster(tmp_path / "cluster", "netns-test", "op", now).ca
    members: list[Member] = []
    try:
        for i in range(HOSTS):
            directory = tmp_path / f"h{i}"
            enroll_node(ca, directory, "agent", [lab.address(i)], timedelta(hours=1), now)
            seeds = [f"{lab.address(0)}:{PORT}"] if i else []
            members.append(
                start(
                    directory,
                    f"{lab.address(i)}:{PORT}",
                    seeds,
                    wrap=lambda argv, i=i: lab.command(i, argv),
                )
            )
        wait_until(members, "a full view", lambda m: m.sees_all_alive(HOSTS))

        cut = members[HOSTS - 1]
        rest = members[: HOSTS - 1]
        lab.cut(HOSTS - 1)
        wait_until(rest, "the cut host to be dead", lambda m: m.view.get(cut.node_id) == "dead")
        wait_until(
            [cut],
            "the cut host to see everyone else dead",
            lambda m: all(m.view.get(o.node_id) == "dead" for o in rest),
        )
        assert all(m.view.get(o.node_id) == "alive" for m in rest for o in rest), (
            "the connected side keeps each other alive"
        )

        lab.heal(HOSTS - 1)
        heal_s = wait_until(
            members, "the mesh to heal", lambda m: m.sees_all_alive(HOSTS), deadline_s=45
        )
        assert heal_s <= 30, f"partition healed to a full view only after {heal_s:.1f} s"
    finally:
        for m in members:
            m.stop()
