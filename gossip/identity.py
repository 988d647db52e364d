"""Keys, the cluster CA, node certificates and their on-disk layout.

Every key is Ed25519, the CA's included. Python's ``ssl`` module (OpenSSL 3) negotiates Ed25519
certificates in TLS 1.3 for both sides of a mutual handshake, so one key per node serves both
transport and end-to-end signatures (``tests/gossip/test_transport.py`` proves the handshake).

Node id: the first 20 bytes of SHA-256 over the raw 32-byte Ed25519 public key, base32 lower case
without padding (32 characters), so it can be recomputed from any certificate and never collides
by accident.

Certificate: Subject CN = node id; issuer = the cluster CA (CN = cluster name); SANs carry the
node's DNS names and IP addresses, and the role (``agent`` or ``operator``) as one URI,
``shoal:role:<role>`` (:data:`ROLE_URI`). Shoal reads the role only through
:func:`role_of_certificate`, which refuses a certificate without one, or with two. Certificates
issued before carry the role in a private extension instead (:data:`ROLE_OID`, value a DER
UTF8String), which Shoal still reads; but that OID's arc (a UUID) is wider than Go's x509 parser
takes, so Prometheus and Grafana cannot load such a certificate: renewed ones have only the URI.

On-disk layout, the same for an agent's state directory and for the operator's cluster directory::

    node.key      this node's private key, PKCS#8 PEM, mode 0600, created once, never overwritten
    node.crt      this node's certificate, PEM
    ca.crt        the cluster CA's certificate, PEM
    ca.key        (operator only) the CA private key, mode 0600
    cluster.toml  (operator only) cluster name, CA fingerprint, creation time
    node.csr      (a node enrolled by hand) its certificate signing request, PEM

Enrolling by hand (``shoal enroll``, ``shoal certify``): the node makes its key and a PKCS#10
request signed with it (:func:`certificate_request`: subject CN = node id, the names as SANs, the
requested role as the same SAN URI); the CA's keeper checks it
(:func:`read_certificate_request`) and signs with :func:`issue_certificate`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import stat
import tomllib
from base64 import b32encode
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import tomli_w
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gossip.fsmodes import ensure_dir, write_file

Role = Literal["agent", "operator", "user"]
ROLES: tuple[Role, ...] = ("agent", "operator", "user")
PERSON_ROLES: tuple[Role, ...] = ("operator", "user")
"""The roles of a person's certificate: ``operator`` (one who may be an admin: ``shoal init``'s,
or ``shoal user add --role admin``), ``user`` (a user or viewer, never an admin)."""

# A private OID from the UUID arc (ITU-T X.667), so no registration is needed.
ROLE_OID = x509.ObjectIdentifier("2.25.62961453245723373676167086388390864577")
ROLE_URI = "shoal:role:"
"""The prefix of the SAN URI that names a certificate's role (``shoal:role:agent``)."""

NODE_KEY = "node.key"
NODE_CERT = "node.crt"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CLUSTER_TOML = "cluster.toml"
NODE_CSR = "node.csr"

NODE_ID_BYTES = 20
CA_VALID_FOR = timedelta(days=3650)


class IdentityError(Exception):
    """A key, certificate or cluster directory is missing, malformed or inconsistent."""


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """The cluster CA: its name, key and self-signed certificate."""

    name: str
    key: Ed25519PrivateKey
    certificate: x509.Certificate


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """One node's own identity, as loaded from its directory (paths kept for ``ssl``)."""

    node_id: str
    role: Role
    key: Ed25519PrivateKey
    certificate: x509.Certificate
    ca_certificate: x509.Certificate
    key_path: Path
    cert_path: Path
    ca_path: Path

    @property
    def certificate_der(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.DER)


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    """What ``init_cluster`` creates: the cluster's name, CA and the operator's identity."""

    name: str
    directory: Path
    created_at: datetime
    ca: CertificateAuthority
    operator: NodeIdentity

    @property
    def ca_fingerprint(self) -> str:
        return certificate_fingerprint(self.ca.certificate)


def node_id_for(public_key: Ed25519PublicKey | bytes) -> str:
    """The node id of a public key (raw 32 bytes or key object); see the module docstring."""
    raw = (
        public_key
        if isinstance(public_key, bytes)
        else public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    if len(raw) != 32:
        raise IdentityError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    digest = hashlib.sha256(raw).digest()[:NODE_ID_BYTES]
    return b32encode(digest).decode("ascii").lower().rstrip("=")


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 over the DER certificate, lower-case hex."""
    return cert.fingerprint(hashes.SHA256()).hex()


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 (whatever the umask); refuse to overwrite an existing file."""
    try:
        write_file(path, data, 0o600, exclusive=True)
    except FileExistsError:
        raise IdentityError(f"{path} already exists; refusing to overwrite a private key") from None


def _write_public(path: Path, data: bytes) -> None:
    write_file(path, data, 0o644)


def _key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _load_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise IdentityError(f"cannot load private key {path}: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{path} is not an Ed25519 private key")
    return key


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as e:
        raise IdentityError(f"cannot load certificate {path}: {e}") from e


def _role_value(role: Role) -> bytes:
    raw = role.encode("ascii")
    return b"\x0c" + bytes([len(raw)]) + raw


def role_of_certificate(cert: x509.Certificate) -> Role:
    """The role the CA bound into ``cert``; raises IdentityError when absent or unknown."""
    role = _role_of(cert.extensions)
    if role is None:
        raise IdentityError("certificate carries no Shoal role")
    return role


def _role_of(extensions: x509.Extensions) -> Role | None:
    """The Shoal role in ``extensions`` (the SAN URI, else the older private extension): None
    when there is none, IdentityError when unknown or named twice."""
    try:
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        uris: list[str] = []
    else:
        uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    named = [u.removeprefix(ROLE_URI) for u in uris if u.startswith(ROLE_URI)]
    if len(named) > 1:
        raise IdentityError("certificate names more than one Shoal role")
    if named:
        for role in ROLES:
            if named[0] == role:
                return role
        raise IdentityError("unknown Shoal role in certificate")
    return _legacy_role_of(extensions)


def _legacy_role_of(extensions: x509.Extensions) -> Role | None:
    try:
        ext = extensions.get_extension_for_oid(ROLE_OID)
    except x509.ExtensionNotFound:
        return None
    value = ext.value
    if not isinstance(value, x509.UnrecognizedExtension):
        raise IdentityError("malformed Shoal role extension")
    for role in ROLES:
        if value.value == _role_value(role):
            return role
    raise IdentityError("unknown Shoal role in certificate")


def common_name(cert_or_name: x509.Certificate | x509.Name) -> str | None:
    subject = cert_or_name if isinstance(cert_or_name, x509.Name) else cert_or_name.subject
    names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return None
    value = names[0].value
    return value if isinstance(value, str) else None


def certificate_node_id(cert: x509.Certificate) -> str:
    """The node id a certificate proves: CN, checked against the hash of its public key."""
    key = cert.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise IdentityError("certificate key is not Ed25519")
    node_id = node_id_for(key)
    if common_name(cert) != node_id:
        raise IdentityError("certificate CN does not match the hash of its public key")
    return node_id


def new_certificate_authority(cluster_name: str, now: datetime) -> CertificateAuthority:
    """A fresh CA: Ed25519 key and a self-signed CA certificate named after the cluster."""
    key = Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cluster_name)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + CA_VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, None)
    )
    return CertificateAuthority(name=cluster_name, key=key, certificate=cert)


def _san(names: Sequence[str], role: Role | None = None) -> list[x509.GeneralName]:
    """The SANs for ``names`` (IP addresses, else DNS names), and ``role``'s URI."""
    out: list[x509.GeneralName] = []
    if role is not None:
        out.append(x509.UniformResourceIdentifier(ROLE_URI + role))
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def issue_certificate(
    ca: CertificateAuthority,
    public_key: Ed25519PublicKey | bytes,
    role: Role,
    names: Sequence[str],
    valid_for: timedelta,
    now: datetime,
) -> x509.Certificate:
    """Certify ``public_key`` as node ``node_id_for(public_key)`` with ``role`` until now+valid_for.

    ``names`` are the node's DNS names and IP addresses (SANs); peers identify each other by node
    id, the SANs only let ordinary TLS tooling check hostnames. Backdated five minutes for skew.
    """
    if role not in ROLES:
        raise IdentityError(f"unknown role {role!r}")
    key = (
        Ed25519PublicKey.from_public_bytes(public_key)
        if isinstance(public_key, bytes)
        else public_key
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id_for(key))]))
        .issuer_name(ca.certificate.subject)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(_san(names, role)), critical=False)
    )
    return builder.sign(ca.key, None)


def generate_node_key(directory: Path) -> tuple[Path, bytes]:
    """Create this node's key in ``directory`` (0600); return its path and raw public key.

    Runs on the node itself: the private key never leaves it. Refuses to replace an existing key.
    """
    ensure_dir(directory, 0o700)
    key = Ed25519PrivateKey.generate()
    path = directory / NODE_KEY
    _write_private(path, _key_pem(key))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return path, raw


def install_certificate(
    directory: Path, certificate: x509.Certificate, ca_certificate: x509.Certificate
) -> NodeIdentity:
    """Write a node's certificate and the CA certificate beside its key, then load the result."""
    _write_public(directory / CA_CERT, _cert_pem(ca_certificate))
    _write_public(directory / NODE_CERT, _cert_pem(certificate))
    return load_identity(directory)


def enroll_node(
    ca: CertificateAuthority,
    directory: Path,
    role: Role,
    names: Sequence[str],
    valid_for: timedelta,
    now: datetime,
) -> NodeIdentity:
    """Key, certificate and CA certificate for a node whose directory is on this host.

    For local nodes (the demo, tests, a second operator on this machine); remote hosts run
    :func:`generate_node_key` themselves and only their public key travels.
    """
    _, public = generate_node_key(directory)
    cert = issue_certificate(ca, public, role, names, valid_for, now)
    return install_certificate(directory, cert, ca.certificate)


@dataclass(frozen=True, slots=True)
class CertificateRequest:
    """What a verified certificate signing request asks for."""

    public_key: bytes
    node_id: str
    role: Role
    names: tuple[str, ...]


def load_node_key(directory: Path) -> Ed25519PrivateKey:
    """The node's own private key from its identity directory."""
    return _load_key(directory / NODE_KEY)


def certificate_request(key: Ed25519PrivateKey, role: Role, names: Sequence[str]) -> bytes:
    """A PEM certificate signing request for ``key``, signed with it (proof that the requester
    holds the key): CN = its node id, ``names`` and ``role``'s URI as SANs."""
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id_for(key.public_key()))])
        )
        .add_extension(x509.SubjectAlternativeName(_san(names, role)), critical=False)
    )
    return builder.sign(key, None).public_bytes(serialization.Encoding.PEM)


def read_certificate_request(pem: bytes) -> CertificateRequest:
    """Parse and check a request: its signature verifies with its own Ed25519 key, its CN (when
    it has one) is that key's node id. A request without a role asks for ``agent``."""
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError:
        raise IdentityError("not a PEM certificate signing request") from None
    key = csr.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise IdentityError("the request's key is not Ed25519")
    if not csr.is_signature_valid:
        raise IdentityError("the request's signature does not verify with its own key")
    node_id = node_id_for(key)
    cn = common_name(csr.subject)
    if cn is not None and cn != node_id:
        raise IdentityError(f"the request names node {cn!r} but its key is node {node_id}")
    role = _role_of(csr.extensions) or "agent"
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names: tuple[str, ...] = ()
    else:
        names = tuple(
            [str(n) for n in san.get_values_for_type(x509.DNSName)]
            + [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
        )
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return CertificateRequest(public_key=raw, node_id=node_id, role=role, names=names)


def load_identity(directory: Path) -> NodeIdentity:
    """Load and cross-check a node identity: key matches certificate, CA signed it, id is right."""
    key_path, cert_path, ca_path = directory / NODE_KEY, directory / NODE_CERT, directory / CA_CERT
    if key_path.exists() and not private_key_mode_ok(key_path):
        raise IdentityError(f"{key_path} is readable by others; run: chmod 600 {key_path}")
    key = _load_key(key_path)
    cert = _load_cert(cert_path)
    ca_cert = _load_cert(ca_path)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    cert_key = cert.public_key()
    if (
        not isinstance(cert_key, Ed25519PublicKey)
        or cert_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) != raw
    ):
        raise IdentityError(f"{cert_path} does not certify the key in {key_path}")
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as e:
        raise IdentityError(f"{cert_path} was not issued by the CA in {ca_path}") from e
    return NodeIdentity(
        node_id=certificate_node_id(cert),
        role=role_of_certificate(cert),
        key=key,
        certificate=cert,
        ca_certificate=ca_cert,
        key_path=key_path,
        cert_path=cert_path,
        ca_path=ca_path,
    )


def load_ca(directory: Path) -> CertificateAuthority:
    """Load the CA the operator keeps in the cluster directory."""
    key = _load_key(directory / CA_KEY)
    cert = _load_cert(directory / CA_CERT)
    if cert.public_key() != key.public_key():
        raise IdentityError(f"{directory / CA_CERT} does not match {directory / CA_KEY}")
    name = common_name(cert)
    if name is None:
        raise IdentityError("CA certificate has no single common name")
    return CertificateAuthority(name=name, key=key, certificate=cert)


def init_cluster(
    directory: Path,
    cluster_name: str,
    operator_name: str,
    now: datetime,
    *,
    operator_valid_for: timedelta = timedelta(days=365),
) -> ClusterIdentity:
    """Create a cluster in ``directory``: CA, ``cluster.toml`` and the operator's own identity.

    ``operator_name`` becomes the operator certificate's DNS SAN (the operator is identified by its
    node id like any peer). Refuses a directory that already holds a cluster or a key.
    """
    if not cluster_name.strip():
        raise IdentityError("cluster name must not be empty")
    if now.tzinfo is None:
        raise IdentityError("now must be timezone-aware")
    for existing in (CLUSTER_TOML, CA_KEY, NODE_KEY):
        if (directory / existing).exists():
            raise IdentityError(
                f"{directory} already holds a Shoal cluster ({existing} exists); "
                "refusing to overwrite it"
            )
    ensure_dir(directory, 0o700)
    ca = new_certificate_authority(cluster_name, now)
    _write_private(directory / CA_KEY, _key_pem(ca.key))
    _write_public(directory / CA_CERT, _cert_pem(ca.certificate))
    _, public = generate_node_key(directory)
    cert = issue_certificate(ca, public, "operator", [operator_name], operator_valid_for, now)
    operator = install_certificate(directory, cert, ca.certificate)
    cluster = ClusterIdentity(
        name=cluster_name, directory=directory, created_at=now, ca=ca, operator=operator
    )
    doc = {
        "cluster": {
            "name": cluster_name,
            "ca_fingerprint_sha256": cluster.ca_fingerprint,
            "created_at": now,
            "operator_node_id": operator.node_id,
        }
    }
    _write_public(directory / CLUSTER_TOML, tomli_w.dumps(doc).encode("utf-8"))
    return cluster


def load_cluster(directory: Path) -> ClusterIdentity:
    """Load what ``init_cluster`` wrote, checking the CA fingerprint against ``cluster.toml``."""
    try:
        doc = tomllib.loads((directory / CLUSTER_TOML).read_text("utf-8"))
        section = doc["cluster"]
        name, fingerprint, created = (
            section["name"],
            section["ca_fingerprint_sha256"],
            section["created_at"],
        )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise IdentityError(f"cannot read {directory / CLUSTER_TOML}: {e}") from e
    if not isinstance(name, str) or not isinstance(created, datetime):
        raise IdentityError(f"{directory / CLUSTER_TOML} is malformed")
    ca = load_ca(directory)
    if certificate_fingerprint(ca.certificate) != fingerprint:
        raise IdentityError("CA certificate does not match the fingerprint in cluster.toml")
    return ClusterIdentity(
        name=name,
        directory=directory,
        created_at=created,
        ca=ca,
        operator=load_identity(directory),
    )


def private_key_mode_ok(path: Path) -> bool:
    """True when nobody but the owner can read or write ``path`` (always true on Windows)."""
    if os.name == "nt":
        return True
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
