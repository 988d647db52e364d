"""``shoal init`` as an operator runs it."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gossip.identity import enroll_node, load_cluster


def shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_init_creates_a_loadable_cluster_with_private_keys_kept_private(tmp_path: Path) -> None:
    target = tmp_path / "cluster"
    done = shoal("init", "--dir", str(target), "--name", "lab-a", "--operator", "alice")
    assert done.returncode == 0, done.stderr
    cluster = load_cluster(target)
    assert cluster.name == "lab-a"
    assert cluster.operator.role == "operator"
    assert cluster.ca_fingerprint in done.stdout
    assert cluster.operator.node_id in done.stdout
    for key in ("ca.key", "node.key"):
        assert stat.S_IMODE((target / key).stat().st_mode) == 0o600


def test_init_refuses_to_overwrite_a_cluster_in_one_line(tmp_path: Path) -> None:
    target = tmp_path / "cluster"
    assert shoal("init", "--dir", str(target)).returncode == 0
    before = (target / "ca.key").read_bytes()
    again = shoal("init", "--dir", str(target))
    assert again.returncode == 2
    assert len(again.stderr.strip().splitlines()) == 1
    assert "refusing to overwrite" in again.stderr
    assert (target / "ca.key").read_bytes() == before


def test_bootstrap_with_a_wheelhouse_lacking_shoal_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "cluster"
    assert shoal("init", "--dir", str(target)).returncode == 0
    empty = tmp_path / "wheels"
    empty.mkdir()
    done = shoal("bootstrap", "--identity", str(target), "--wheelhouse", str(empty), "me@127.0.0.1")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "holds no shoal-" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_agent_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    cluster = load_cluster(_init(tmp_path))
    ident = tmp_path / "agent-id"
    enroll_node(cluster.ca, ident, "agent", ["127.0.0.1"], timedelta(days=1), datetime.now(UTC))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = shoal(
            "agent",
            "--listen",
            f"127.0.0.1:{port}",
            "--identity",
            str(ident),
            "--data-dir",
            str(tmp_path / "data"),
            "--sim",
            "demo",
        )
    assert done.returncode == 2, done.stderr[-1500:]
    assert "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def _init(tmp_path: Path) -> Path:
    target = tmp_path / "cluster"
    assert shoal("init", "--dir", str(target)).returncode == 0
    return target
