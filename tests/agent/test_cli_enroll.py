"""Enrolling a host by hand: ``shoal enroll`` on the host, ``shoal certify`` on the operator's
machine, ``shoal enroll --install`` back on the host, then a real ``shoal agent`` with that
identity joins a mesh. Every step is the real command."""

from __future__ import annotations

import contextlib
import json
import stat
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.operator.revocations import revoke_nodes
from agent.sandbox.localmesh import free_ports
from gossip.identity import (
    NODE_CSR,
    certificate_request,
    enroll_node,
    generate_node_key,
    load_cluster,
    load_identity,
    load_node_key,
)
from tests.agent.agents import DEADLINE_S, Mesh
from tests.shoal_cli import SHOAL, one_line_error, shoal


def _ok(*args: str) -> str:
    done = shoal(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _cluster(directory: Path, name: str) -> Path:
    _ok("init", "--dir", str(directory), "--name", name)
    return directory


def _enroll(directory: Path, *extra: str) -> dict[str, str]:
    doc: dict[str, str] = json.loads(_ok("enroll", "--dir", str(directory), "--json", *extra))
    return doc


def _certify(request: Path, cluster: Path, out: Path) -> Path:
    _ok("certify", str(request), "--identity", str(cluster), "--out", str(out))
    return out


def test_enroll_makes_a_private_key_and_a_request_and_keeps_the_key_on_a_rerun(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    first = _enroll(host, "--name", "gpu7", "--address", "10.0.0.7")
    assert stat.S_IMODE((host / "node.key").stat().st_mode) == 0o600
    assert first["names"] == ["gpu7", "10.0.0.7"] and first["key_created"]
    again = _enroll(host, "--name", "gpu7")
    assert again["node_id"] == first["node_id"] and not again["key_created"]
    assert (host / NODE_CSR).read_bytes().startswith(b"-----BEGIN CERTIFICATE REQUEST-----")


def test_certify_and_install_refuse_what_does_not_fit_and_write_nothing(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "cluster", "lab")
    other = _cluster(tmp_path / "other", "elsewhere")
    host, host2 = tmp_path / "host", tmp_path / "host2"
    _enroll(host)
    node2 = _enroll(host2)["node_id"]

    # wrong CA: bundled by another cluster, or a bare certificate the given CA did not issue
    foreign = _certify(host / NODE_CSR, other, tmp_path / "foreign.crt")
    line = one_line_error(
        shoal(
            "enroll", "--dir", str(host), "--install", str(foreign), "--ca", str(cluster / "ca.crt")
        )
    )
    assert "another cluster" in line
    bare = tmp_path / "bare.crt"
    text = foreign.read_text()
    bare.write_text(text[: text.index("-----END CERTIFICATE-----")] + "-----END CERTIFICATE-----\n")
    line = one_line_error(
        shoal("enroll", "--dir", str(host), "--install", str(bare), "--ca", str(cluster / "ca.crt"))
    )
    assert "wrong CA" in line
    assert "pass --ca" in one_line_error(
        shoal("enroll", "--dir", str(host), "--install", str(bare))
    )

    # a certificate for another host's key
    theirs = _certify(host2 / NODE_CSR, cluster, tmp_path / "host2.crt")
    line = one_line_error(shoal("enroll", "--dir", str(host), "--install", str(theirs)))
    assert f"certifies node {node2}, not this host's key" in line
    assert not (host / "node.crt").exists() and not (host / "ca.crt").exists()

    # a request for an operator certificate
    sneaky = tmp_path / "sneaky"
    generate_node_key(sneaky)
    request = sneaky / NODE_CSR
    request.write_bytes(certificate_request(load_node_key(sneaky), "operator", ["me"]))
    line = one_line_error(shoal("certify", str(request), "--identity", str(cluster)))
    assert "asks for an operator certificate" in line
    assert not request.with_suffix(".crt").exists()

    # a revoked node's key, and a request that is not one
    revoke_nodes(load_cluster(cluster), {node2})
    line = one_line_error(shoal("certify", str(host2 / NODE_CSR), "--identity", str(cluster)))
    assert "is revoked" in line
    junk = tmp_path / "junk.csr"
    junk.write_text("hello\n")
    assert "not a PEM certificate signing request" in one_line_error(
        shoal("certify", str(junk), "--identity", str(cluster))
    )

    # installed once, a folder does not move to another cluster
    mine = _certify(host / NODE_CSR, cluster, tmp_path / "host.crt")
    _ok("enroll", "--dir", str(host), "--install", str(mine))
    line = one_line_error(
        shoal(
            "enroll", "--dir", str(host), "--install", str(foreign), "--ca", str(other / "ca.crt")
        )
    )
    assert "CA of another cluster" in line
    assert load_identity(host).ca_certificate == load_cluster(cluster).ca.certificate


@pytest.mark.slow
def test_a_host_enrolled_by_hand_joins_the_mesh(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path / "mesh", ["h100:1", "mi300x:1"])
    mesh.start_all()
    agent: subprocess.Popen[bytes] | None = None
    stack = contextlib.ExitStack()
    try:
        host = tmp_path / "newhost"
        node_id = _enroll(host, "--name", "newhost", "--address", "127.0.0.1")["node_id"]
        cert = _certify(host / NODE_CSR, mesh.cluster_dir, tmp_path / "newhost.crt")
        installed = json.loads(
            _ok(
                "enroll",
                "--dir",
                str(host),
                "--install",
                str(cert),
                "--ca",
                str(mesh.cluster_dir / "ca.crt"),
                "--json",
            )
        )
        assert installed["node_id"] == node_id and installed["cluster"] == "shoal-demo"

        port = free_ports(1)[0]
        log = stack.enter_context((tmp_path / "newhost.log").open("wb"))
        agent = subprocess.Popen(
            [
                *SHOAL,
                "agent",
                "--listen",
                f"127.0.0.1:{port}",
                "--join",
                mesh.agents[0].address,
                "--identity",
                str(host),
                "--data-dir",
                str(tmp_path / "newhost-data"),
                "--sim",
                "l4:1",
                "--name",
                "newhost",
                "--job-user",
                "",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def seen_alive() -> bool:
            done = shoal(
                "nodes",
                "--json",
                "--agent",
                mesh.agents[1].address,
                "--identity",
                str(mesh.cluster_dir),
            )
            nodes = {n["node_id"]: n for n in json.loads(done.stdout)}
            node = nodes.get(node_id)
            return node is not None and node["state"] == "alive" and bool(node["devices"])

        try:
            mesh.wait("the enrolled host alive in the mesh", seen_alive, DEADLINE_S)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n{(tmp_path / 'newhost.log').read_text()[-3000:]}"
            ) from None
        listing = _ok(
            "nodes", "--agent", mesh.agents[0].address, "--identity", str(mesh.cluster_dir)
        )
        assert any(
            line.startswith("newhost ") and " alive " in line for line in listing.splitlines()
        )
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=60)
        stack.close()
        mesh.stop_all()


def test_enroll_node_and_the_manual_path_issue_the_same_kind_of_certificate(
    tmp_path: Path,
) -> None:
    """The certificate ``shoal certify`` writes loads as an identity exactly as one that
    :func:`gossip.identity.enroll_node` (the demo's and the tests' way) makes."""
    cluster = _cluster(tmp_path / "cluster", "lab")
    ca = load_cluster(cluster).ca
    local = enroll_node(
        ca, tmp_path / "local", "agent", ["h"], timedelta(days=1), datetime.now(UTC)
    )
    host = tmp_path / "host"
    _enroll(host, "--name", "h")
    cert = _certify(host / NODE_CSR, cluster, tmp_path / "host.crt")
    _ok("enroll", "--dir", str(host), "--install", str(cert))
    manual = load_identity(host)
    assert (manual.role, local.role) == ("agent", "agent")
    assert manual.ca_certificate == local.ca_certificate
