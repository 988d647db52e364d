"""The operator's half of certification: sign the public key the host reported, locally.

Only the certificate and the CA certificate travel to the host. A certificate already installed is
kept when it certifies the same key, was issued by this cluster's CA and is not close to expiry,
so a rerun changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives import serialization

from gossip.identity import ClusterIdentity, certificate_fingerprint, issue_certificate

RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True, slots=True)
class KeyReport:
    """What ``python -m agent.bootstrap.keygen`` printed on the host."""

    public_key: bytes
    node_id: str
    created: bool
    cert_matches_key: bool
    cert_ca_fingerprint: str | None
    cert_not_after_s: float | None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> KeyReport:
        cert = doc.get("certificate") or {}
        not_after = cert.get("not_after")
        return cls(
            public_key=bytes.fromhex(str(doc["public_key"])),
            node_id=str(doc["node_id"]),
            created=bool(doc.get("created")),
            cert_matches_key=bool(cert.get("matches_key")),
            cert_ca_fingerprint=cert.get("ca_fingerprint"),
            cert_not_after_s=float(not_after) if not_after is not None else None,
        )


def needs_certificate(report: KeyReport, cluster: ClusterIdentity, now: datetime) -> bool:
    """True unless the host already holds a current certificate from this CA for this key."""
    if not report.cert_matches_key or report.cert_not_after_s is None:
        return True
    if report.cert_ca_fingerprint != certificate_fingerprint(cluster.ca.certificate):
        return True
    return report.cert_not_after_s < (now + RENEW_BEFORE).timestamp()


@dataclass(frozen=True, slots=True)
class SignedFiles:
    node_crt_pem: bytes
    ca_crt_pem: bytes
    serial: int


def sign_node(
    cluster: ClusterIdentity,
    report: KeyReport,
    names: Sequence[str],
    valid_for: timedelta,
    now: datetime,
) -> SignedFiles:
    """An ``agent`` certificate for the reported key, SANs ``names``."""
    cert = issue_certificate(cluster.ca, report.public_key, "agent", names, valid_for, now)
    return SignedFiles(
        node_crt_pem=cert.public_bytes(serialization.Encoding.PEM),
        ca_crt_pem=cluster.ca.certificate.public_bytes(serialization.Encoding.PEM),
        serial=cert.serial_number,
    )
