"""Real gossip members as separate processes on loopback, over mutual TLS."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gossip.identity import enroll_node, init_cluster
from tests.gossip.procs import Member, start, wait_until

pytestmark = pytest.mark.slow

MEMBERS = 16


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[Path], list[Member]]]:
    now = datetime.now(UTC)
    ca = init_cluster(tmp_path / "cluster", "proc-test", "op", now).ca
    dirs = [tmp_path / f"n{i}" for i in range(MEMBERS)]
    for d in dirs:
        enroll_node(ca, d, "agent", ["127.0.0.1"], timedelta(hours=1), now)
    running: list[Member] = []
    yield dirs, running
    for m in running:
        m.stop()


def test_sixteen_processes_see_all_detect_a_kill_and_take_a_restart_back(
    cluster: tuple[list[Path], list[Member]],
) -> None:
    dirs, running = cluster
    first = start(dirs[0], "127.0.0.1:0")
    running.append(first)
    wait_until([first], "the seed to listen", lambda m: bool(m.addr))
    running += [start(d, "127.0.0.1:0", [first.addr]) for d in dirs[1:]]

    wait_until(running, "a full view", lambda m: m.sees_all_alive(MEMBERS))
    ids = {m.node_id for m in running}
    assert len(ids) == MEMBERS
    assert all(set(m.view) == ids for m in running)

    victim = running[5]
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(timeout=10)
    survivors = [m for m in running if m is not victim]
    detect_s = wait_until(
        survivors, "the kill to be detected", lambda m: m.view.get(victim.node_id) == "dead"
    )
    assert detect_s < 15, f"kill -9 detected by all only after {detect_s:.1f} s"
    others_alive = [
        state for m in survivors for node, state in m.view.items() if node != victim.node_id
    ]
    assert set(others_alive) == {"alive"}, "no live member may be declared dead"

    reborn = start(victim.directory, "127.0.0.1:0", [first.addr])
    running.append(reborn)
    wait_until([reborn], "the restarted member to listen", lambda m: bool(m.addr))
    assert reborn.node_id == victim.node_id
    wait_until(
        [*survivors, reborn],
        "the restarted member to be alive everywhere",
        lambda m: m.sees_all_alive(MEMBERS),
    )
