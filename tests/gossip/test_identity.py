"""Cluster CA, node certificates, on-disk layout, CertTrust and the revocation list."""

from __future__ import annotations

import ipaddress
import os
import stat
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgpack
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from gossip import revocation
from gossip.certtrust import Admission, CertSigner, CertTrust
from gossip.identity import (
    CLUSTER_TOML,
    ClusterIdentity,
    IdentityError,
    NodeIdentity,
    enroll_node,
    generate_node_key,
    init_cluster,
    issue_certificate,
    load_cluster,
    load_identity,
    node_id_for,
    role_of_certificate,
)
from gossip.revocation import RevocationError, RevocationList, issue_revocations
from gossip.trust import Signer, Trust

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOW_S = NOW.timestamp()
DAY = timedelta(days=1)

posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX file modes do not apply on Windows")


@pytest.fixture
def cluster(tmp_path: Path) -> ClusterIdentity:
    return init_cluster(tmp_path / "cluster", "lab", "op-laptop", NOW)


@pytest.fixture
def agent(cluster: ClusterIdentity, tmp_path: Path) -> NodeIdentity:
    return enroll_node(cluster.ca, tmp_path / "a", "agent", ["gpu-a", "10.0.0.7"], DAY, NOW)


@pytest.fixture
def agent_b(cluster: ClusterIdentity, tmp_path: Path) -> NodeIdentity:
    return enroll_node(cluster.ca, tmp_path / "b", "agent", ["gpu-b"], DAY, NOW)


def test_node_id_is_truncated_sha256_in_base32() -> None:
    # Computed outside Shoal: sha256 | first 20 bytes | base32 | lower case.
    assert node_id_for(bytes(32)) == "mzuhvlpymk6xo3epygfy5h4oeaejofef"
    assert node_id_for(b"\x01" * 32) == "olgw5bbcyqd7w3ijq2ipceylpxwx5qxx"
    with pytest.raises(IdentityError):
        node_id_for(b"short")


def test_init_cluster_writes_layout(cluster: ClusterIdentity, tmp_path: Path) -> None:
    d = tmp_path / "cluster"
    assert sorted(p.name for p in d.iterdir()) == [
        "ca.crt",
        "ca.key",
        "cluster.toml",
        "node.crt",
        "node.key",
    ]
    doc = tomllib.loads((d / CLUSTER_TOML).read_text())["cluster"]
    assert doc["name"] == "lab"
    assert doc["created_at"] == NOW
    assert doc["operator_node_id"] == cluster.operator.node_id
    ca_der_fp = cluster.ca.certificate.fingerprint(hashes.SHA256()).hex()
    assert doc["ca_fingerprint_sha256"] == ca_der_fp
    ca = cluster.ca.certificate
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "lab"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cluster.operator.role == "operator"
    loaded = load_cluster(d)
    assert loaded.name == "lab"
    assert loaded.operator.node_id == cluster.operator.node_id


@posix_only
def test_private_keys_are_owner_only(cluster: ClusterIdentity, agent: NodeIdentity) -> None:
    for path in (cluster.directory / "ca.key", cluster.operator.key_path, agent.key_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(cluster.directory.stat().st_mode) == 0o700


@posix_only
def test_load_identity_refuses_a_world_readable_key(agent: NodeIdentity) -> None:
    agent.key_path.chmod(0o644)
    with pytest.raises(IdentityError, match="readable by others"):
        load_identity(agent.key_path.parent)


def test_init_cluster_refuses_to_overwrite(cluster: ClusterIdentity) -> None:
    before = (cluster.directory / "ca.key").read_bytes()
    with pytest.raises(IdentityError, match="already holds a Shoal cluster"):
        init_cluster(cluster.directory, "other", "op", NOW)
    assert (cluster.directory / "ca.key").read_bytes() == before


def test_generate_node_key_refuses_to_overwrite(tmp_path: Path) -> None:
    path, public = generate_node_key(tmp_path / "n")
    assert len(public) == 32
    with pytest.raises(IdentityError, match="refusing to overwrite"):
        generate_node_key(tmp_path / "n")
    assert path.exists()


def test_certificate_binds_id_role_expiry_and_names(
    cluster: ClusterIdentity, agent: NodeIdentity
) -> None:
    cert = agent.certificate
    public = cert.public_key()
    assert isinstance(public, Ed25519PublicKey)
    key_id = node_id_for(public.public_bytes_raw())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == key_id
    assert agent.node_id == key_id
    assert role_of_certificate(cert) == "agent"
    assert cert.not_valid_after_utc == NOW + DAY
    assert cert.issuer == cluster.ca.certificate.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpu-a"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # the role is a SAN URI; no extension with an OID Go's x509 (Prometheus's) cannot parse
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["shoal:role:agent"]
    assert all(not e.oid.dotted_string.startswith("2.25.") for e in cert.extensions)


def _with_roles(
    cluster: ClusterIdentity, uris: list[str], legacy: bytes | None = None
) -> x509.Certificate:
    key = Ed25519PrivateKey.generate()
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id_for(key.public_key()))])
        )
        .issuer_name(cluster.ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(11)
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + DAY)
    )
    if uris:
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if legacy is not None:
        oid = x509.ObjectIdentifier("2.25.62961453245723373676167086388390864577")
        builder = builder.add_extension(x509.UnrecognizedExtension(oid, legacy), critical=False)
    return builder.sign(cluster.ca.key, None)


def test_a_certificate_names_one_known_role(cluster: ClusterIdentity) -> None:
    """Certificates issued before the role moved to a SAN URI (a private extension) still
    read; two roles, an unknown one, or none are refused."""
    assert role_of_certificate(_with_roles(cluster, [], b"\x0c\x08operator")) == "operator"
    assert role_of_certificate(_with_roles(cluster, ["shoal:role:operator"])) == "operator"
    for uris, why in (
        (["shoal:role:agent", "shoal:role:operator"], "more than one"),
        (["shoal:role:root"], "unknown"),
        (["https://example.org/role/agent"], "no Shoal role"),
        ([], "no Shoal role"),
    ):
        with pytest.raises(IdentityError, match=why):
            role_of_certificate(_with_roles(cluster, uris))


def test_load_identity_refuses_a_certificate_from_another_ca(
    cluster: ClusterIdentity, agent: NodeIdentity, tmp_path: Path
) -> None:
    other = init_cluster(tmp_path / "other", "other", "op", NOW)
    public = agent.key.public_key()
    foreign = issue_certificate(other.ca, public, "agent", [], DAY, NOW)
    agent.cert_path.write_bytes(foreign.public_bytes(encoding=Encoding.PEM))
    with pytest.raises(IdentityError, match="not issued by the CA"):
        load_identity(agent.cert_path.parent)


# -- CertTrust -------------------------------------------------------------------------------


def test_trust_admits_and_verifies(
    cluster: ClusterIdentity, agent: NodeIdentity, agent_b: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    a, b = CertSigner(agent), CertSigner(agent_b)
    assert trust.verify(a.node_id, b"x", a.sign(b"x")) is False  # not yet admitted
    assert trust.admit(a.node_id, a.credential, NOW_S)
    assert trust.admit(b.node_id, b.credential, NOW_S)
    assert trust.role_of(a.node_id) == "agent"
    sig = a.sign(b"state v7")
    assert trust.verify(a.node_id, b"state v7", sig)
    assert not trust.verify(a.node_id, b"state v8", sig)  # data altered
    assert not trust.verify(a.node_id, b"state v7", b.sign(b"state v7"))  # another node's
    assert not trust.verify(a.node_id, b"state v7", sig[:-1] + bytes([sig[-1] ^ 1]))


def test_trust_refusals_say_why(
    cluster: ClusterIdentity, agent: NodeIdentity, agent_b: NodeIdentity, tmp_path: Path
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    a = CertSigner(agent)
    assert trust.check(agent_b.node_id, a.credential, NOW_S) is Admission.ID_MISMATCH
    assert trust.check(a.node_id, b"\x30\x03junk", NOW_S) is Admission.MALFORMED
    assert trust.check(a.node_id, a.credential, NOW_S + 2 * 86400) is Admission.EXPIRED
    assert trust.check(a.node_id, a.credential, NOW_S - 3600) is Admission.NOT_YET_VALID
    other = init_cluster(tmp_path / "other", "other", "op", NOW)
    stranger = CertSigner(other.operator)
    assert trust.check(stranger.node_id, stranger.credential, NOW_S) is Admission.WRONG_CA
    # A certificate whose CN is not the hash of its key, even when signed by our CA.
    key = Ed25519PrivateKey.generate()
    forged_cn = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, agent_b.node_id)]))
        .issuer_name(cluster.ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.UnrecognizedExtension(
                x509.ObjectIdentifier("2.25.62961453245723373676167086388390864577"),
                b"\x0c\x08operator",
            ),
            critical=False,
        )
        .sign(cluster.ca.key, None)
    )
    der = forged_cn.public_bytes(Encoding.DER)
    assert trust.check(agent_b.node_id, der, NOW_S) is Admission.ID_MISMATCH
    assert trust.role_of(agent_b.node_id) is None


def test_verify_refuses_an_expired_admitted_key(
    cluster: ClusterIdentity, agent: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    a = CertSigner(agent)
    assert trust.admit(a.node_id, a.credential, NOW_S)
    sig = a.sign(b"m")
    assert trust.verify(a.node_id, b"m", sig)
    assert trust.expire(NOW_S + 2 * 86400) == [a.node_id]
    assert not trust.verify(a.node_id, b"m", sig)
    assert trust.role_of(a.node_id) is None


# -- revocation ------------------------------------------------------------------------------


def test_revocation_list_shuns_a_node(
    cluster: ClusterIdentity, agent: NodeIdentity, agent_b: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    op, a, b = CertSigner(cluster.operator), CertSigner(agent), CertSigner(agent_b)
    assert trust.admit(a.node_id, a.credential, NOW_S)
    rl = issue_revocations(op, [a.node_id], [], version=1, now=NOW_S)
    wire = revocation.encode(rl)
    decoded = revocation.decode(wire)
    assert decoded == rl
    assert trust.apply_revocations(decoded, NOW_S + 1)
    assert trust.is_revoked(a.node_id)
    assert not trust.verify(a.node_id, b"m", a.sign(b"m"))
    assert trust.check(a.node_id, a.credential, NOW_S + 2) is Admission.REVOKED
    assert trust.admit(b.node_id, b.credential, NOW_S + 2)  # others unaffected
    assert not trust.apply_revocations(decoded, NOW_S + 3)  # same list again: no change


def test_revocation_by_serial_spares_a_reissued_certificate(
    cluster: ClusterIdentity, agent: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    op, a = CertSigner(cluster.operator), CertSigner(agent)
    old_serial = agent.certificate.serial_number
    rl = issue_revocations(op, [], [old_serial], version=1, now=NOW_S)
    assert trust.apply_revocations(rl, NOW_S)
    assert trust.check(a.node_id, a.credential, NOW_S) is Admission.REVOKED
    renewed = issue_certificate(
        cluster.ca, agent.key.public_key(), "agent", [], DAY, NOW + timedelta(hours=1)
    )
    assert renewed.serial_number != old_serial
    assert trust.admit(a.node_id, renewed.public_bytes(Encoding.DER), NOW_S + 3600)
    assert trust.verify(a.node_id, b"m", a.sign(b"m"))


def test_revocation_list_must_come_from_an_operator(
    cluster: ClusterIdentity, agent: NodeIdentity, agent_b: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    by_agent = issue_revocations(CertSigner(agent), [agent_b.node_id], [], 1, NOW_S)
    with pytest.raises(RevocationError, match="not an operator"):
        trust.apply_revocations(by_agent, NOW_S)
    assert trust.revocations.version == 0


def test_revocation_list_tampering_and_malformed_input(
    cluster: ClusterIdentity, agent: NodeIdentity, agent_b: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    op = CertSigner(cluster.operator)
    rl = issue_revocations(op, [agent.node_id], [], 2, NOW_S)
    doc = msgpack.unpackb(revocation.encode(rl))
    doc["ids"] = [agent_b.node_id]  # swap the victim, keep the signature
    tampered = revocation.decode(msgpack.packb(doc))
    with pytest.raises(RevocationError, match="forged"):
        trust.apply_revocations(tampered, NOW_S)
    doc["sig"] = b""
    with pytest.raises(RevocationError, match="unsigned"):
        trust.apply_revocations(revocation.decode(msgpack.packb(doc)), NOW_S)
    with pytest.raises(RevocationError, match="malformed"):
        revocation.decode(b"\xc1")
    with pytest.raises(RevocationError, match="'v'"):
        revocation.decode(msgpack.packb({"v": "1"}))
    with pytest.raises(RevocationError, match="exceeds"):
        revocation.decode(b"\x00" * 64, max_bytes=32)


def test_revocation_merge_keeps_the_highest_version(
    cluster: ClusterIdentity, agent: NodeIdentity, agent_b: NodeIdentity
) -> None:
    trust = CertTrust(cluster.ca.certificate)
    op = CertSigner(cluster.operator)
    v2 = issue_revocations(op, [agent.node_id, agent_b.node_id], [], 2, NOW_S)
    v1 = issue_revocations(op, [agent.node_id], [], 1, NOW_S)
    assert trust.apply_revocations(v2, NOW_S)
    assert not trust.apply_revocations(v1, NOW_S)  # older: ignored
    assert trust.revocations.version == 2
    assert trust.is_revoked(agent_b.node_id)
    # Two operators racing on the same version: every node picks the same list.
    other = issue_revocations(op, [agent_b.node_id], [], 2, NOW_S)
    assert revocation.newer(v2, other) == revocation.newer(other, v2)
    assert RevocationList.empty().version == 0


def test_cert_types_satisfy_the_core_seams(cluster: ClusterIdentity) -> None:
    signer: Signer = CertSigner(cluster.operator)
    trust: Trust = CertTrust(cluster.ca.certificate)
    assert trust.admit(signer.node_id, signer.credential, NOW_S)
    assert trust.verify(signer.node_id, b"m", signer.sign(b"m"))
    assert not trust.is_revoked(signer.node_id)
