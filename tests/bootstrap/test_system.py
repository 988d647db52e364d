"""``shoal bootstrap`` against real OpenSSH servers on loopback, into a running local mesh."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psutil
import pytest
from cryptography import x509

from agent.cli.bootstrap_cmd import run_bootstrap
from agent.operator.fleet import load_fleet
from agent.operator.revocations import load_revocations
from gossip.identity import certificate_node_id
from tests.bootstrap.conftest import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.system]


def _alive(fleet: Fleet) -> dict[str, dict[str, object]]:
    return {str(n["node_id"]): n for n in fleet.nodes() if n.get("state") == "alive"}


def _processes_under(directory: Path) -> list[int]:
    """Pids of processes whose command line names ``directory`` (the host's agent, supervisor)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(directory) in part for part in proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


def _pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_one_host_joins_the_mesh_and_reports_its_gpus(fleet: Fleet) -> None:
    fleet.add_hosts(1)
    [result] = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0])))
    assert result.ok, result.message
    assert result.action == "installed"
    assert result.os == "Linux"
    assert result.service == "process"
    assert result.gpus == "2x NVIDIA L4 (simulated)"
    remote = fleet.remote_dir(0)
    # The key was made on the host and stays private there; the certificate came from our CA.
    key = remote / "identity" / "node.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((remote / "identity" / "node.crt").read_bytes())
    assert certificate_node_id(cert) == result.node_id
    assert cert.issuer == fleet.mesh.operator.ca_certificate.subject  # type: ignore[union-attr]
    assert (remote / "venv").is_symlink()
    assert (remote / "venv" / "bin" / "python").exists()
    config = (remote / "agent.toml").read_text()
    assert 'sim = "l4:2"' in config
    assert f'join = [\n    "{fleet.seed}",\n]' in config or f'join = ["{fleet.seed}"]' in config
    alive = _alive(fleet)
    assert result.node_id in alive
    node = alive[str(result.node_id)]
    assert node["labels"] == {"rack": "r0"}
    assert _pid_alive(fleet.supervisor_pid(0))


def test_three_hosts_in_parallel_all_join(fleet: Fleet) -> None:
    fleet.add_hosts(3)
    results = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0, 1, 2])), "--jobs", "3")
    assert [r.ok for r in results] == [True, True, True], [r.message for r in results]
    ids = {r.node_id for r in results}
    assert len(ids) == 3
    alive = _alive(fleet)
    assert ids <= set(alive)
    assert {str(alive[str(i)]["labels"]) for i in ids} == {
        "{'rack': 'r0'}",
        "{'rack': 'r1'}",
        "{'rack': 'r2'}",
    }
    assert len(alive) == 5  # the two seed agents and the three new ones


def test_rerun_changes_nothing_then_upgrade_then_uninstall(
    fleet: Fleet, wheelhouse_next: Path
) -> None:
    fleet.add_hosts(1)
    hosts = str(fleet.hosts_file([0]))
    remote = fleet.remote_dir(0)
    [first] = fleet.bootstrap("--hosts-file", hosts)
    assert first.ok, first.message
    pid = fleet.supervisor_pid(0)
    venv = os.readlink(remote / "venv")
    cert = (remote / "identity" / "node.crt").read_bytes()
    # The CLI remembers it in the fleet file, and forgets it once uninstalled.
    assert first.node_id in {a.node_id for a in load_fleet(fleet.cluster_dir).agents}

    # Rerun: nothing reinstalled, re-signed, rewritten or restarted.
    [again] = fleet.bootstrap("--hosts-file", hosts)
    assert again.ok, again.message
    assert again.action == "unchanged"
    assert again.changes == ()
    assert fleet.supervisor_pid(0) == pid
    assert os.readlink(remote / "venv") == venv
    assert (remote / "identity" / "node.crt").read_bytes() == cert

    # Upgrade to another build: new venv, same node, restarted, drained and undrained.
    [up] = fleet.bootstrap(
        "--hosts-file", hosts, "--shoal-version", "0.1.1", wheelhouse=wheelhouse_next
    )
    assert up.ok, up.message
    assert up.action == "upgraded"
    assert up.changes == ("shoal 0.1.0 -> 0.1.1",)
    assert up.node_id == first.node_id
    assert fleet.supervisor_pid(0) not in (None, pid)
    assert not _pid_alive(pid)
    new_venv = os.readlink(remote / "venv")
    assert new_venv != venv and new_venv.split("/")[-1].startswith("0.1.1-")
    assert sorted(p.name for p in (remote / "venvs").iterdir()) == [new_venv.split("/")[-1]]
    assert 'version = "0.1.1"' in (remote / "install.toml").read_text()
    assert (remote / "identity" / "node.crt").read_bytes() == cert
    node = _alive(fleet)[str(first.node_id)]
    assert node["drain"] == "schedulable"

    # Uninstall: service stopped, venv, key and config gone, the node revoked.
    new_pid = fleet.supervisor_pid(0)
    [gone] = fleet.bootstrap("--hosts-file", hosts, "--uninstall")
    assert gone.ok, gone.message
    assert gone.action == "uninstalled"
    assert not _pid_alive(new_pid)
    assert not remote.exists()
    assert _processes_under(remote) == []
    revoked = load_revocations(fleet.cluster_dir)
    assert f"node {str(first.node_id)[:12]} revoked (list v1)" in gone.message
    assert "not yet published" not in gone.message, "the mesh accepts the signed list"
    assert revoked.version == 1
    assert revoked.node_ids == frozenset({str(first.node_id)})
    assert revoked.signer_id == fleet.mesh.operator.node_id  # type: ignore[union-attr]
    assert first.node_id not in {a.node_id for a in load_fleet(fleet.cluster_dir).agents}


def test_unknown_host_key_is_refused_with_its_fingerprint(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    [server] = fleet.add_hosts(1, trust=False)
    fleet.known_hosts.write_text("")
    # Through the command itself: exit status 1, the summary, and one line on stderr.
    assert run_bootstrap(fleet.args("--hosts-file", str(fleet.hosts_file([0])))) == 1
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines[-1] == (
        f"host {server.address}: unknown host key ssh-ed25519 {server.fingerprint()}; check it, "
        f"then trust it with: ssh-keyscan -p {server.port} -t ed25519 127.0.0.1 >> "
        f"{fleet.known_hosts} (or rerun with --accept-new)"
    )
    assert not fleet.remote_dir(0).exists()


def test_accept_new_trusts_a_host_never_seen_and_records_its_key(fleet: Fleet) -> None:
    [server] = fleet.add_hosts(1, trust=False)
    fleet.known_hosts.write_text("")
    [result] = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0])), "--accept-new")
    assert result.ok, result.message
    assert result.notes == (
        f"trusted its new host key ssh-ed25519 {server.fingerprint()} (added to "
        f"{fleet.known_hosts})",
    )
    assert fleet.known_hosts.read_text() == server.known_hosts_line()
    # Known now: a rerun trusts nothing new, with or without the flag.
    [again] = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0])), "--accept-new")
    assert again.ok and again.notes == ()


def test_accept_new_still_refuses_a_changed_key(fleet: Fleet) -> None:
    [server] = fleet.add_hosts(1, trust=False)
    other = fleet.add_hosts(1, trust=False)[0]
    recorded = other.known_hosts_line().replace(f":{other.port} ", f":{server.port} ")
    fleet.known_hosts.write_text(recorded)
    [result] = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0])), "--accept-new")
    assert not result.ok
    assert "host key CHANGED" in result.message and server.fingerprint() in result.message
    assert fleet.known_hosts.read_text() == recorded
    assert not fleet.remote_dir(0).exists()


def test_changed_host_key_is_refused(fleet: Fleet) -> None:
    [server] = fleet.add_hosts(1, trust=False)
    other = fleet.add_hosts(1, trust=False)[0]
    # Record the other server's key under this server's name: a key change (or an impostor).
    fleet.known_hosts.write_text(
        other.known_hosts_line().replace(f":{other.port} ", f":{server.port} ")
    )
    [result] = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0])))
    assert not result.ok
    assert "CHANGED" in result.message
    assert server.fingerprint() in result.message


def test_host_without_python_311_gets_one_clear_line(fleet: Fleet) -> None:
    fleet.add_hosts(1)
    fake = fleet.root / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 3.9.18\n")
    fake.chmod(0o755)
    [result] = fleet.bootstrap("--hosts-file", str(fleet.hosts_file([0], python=str(fake))))
    assert not result.ok
    assert result.message.startswith(
        f"host {fleet.servers[0].address}: Python 3.11+ not found (found 3.9.18 at {fake}); "
        "install Python 3.11 or newer"
    )
    assert not fleet.remote_dir(0).exists()


def test_a_failed_start_leaves_the_host_as_it_was(fleet: Fleet) -> None:
    fleet.add_hosts(1)
    hosts = fleet.hosts_file([0])
    # An agent that cannot start: its sim profile names no real accelerator.
    hosts.write_text(hosts.read_text().replace('sim = "l4:2"', 'sim = "no-such-gpu:1"'))
    [result] = fleet.bootstrap("--hosts-file", str(hosts), "--join-timeout", "8")
    assert not result.ok
    assert "did not join the mesh within 8 s" in result.message
    assert not fleet.remote_dir(0).exists()
    assert _processes_under(fleet.remote_dir(0)) == []
