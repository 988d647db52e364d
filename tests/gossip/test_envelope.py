"""Signed operator commands: every refusal has its own error and is counted."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgpack
import pytest

from gossip import envelope
from gossip.certtrust import CertSigner, CertTrust
from gossip.envelope import (
    Command,
    EnvelopeError,
    Forged,
    Malformed,
    NotOperator,
    Oversized,
    Replayed,
    Revoked,
    Skewed,
    Unsigned,
    UntrustedSigner,
    seal,
    signed_payload,
)
from gossip.identity import enroll_node, init_cluster
from gossip.replay import ReplayGuard
from gossip.revocation import issue_revocations

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T = NOW.timestamp()
DAY = timedelta(days=1)


@dataclass
class Mesh:
    operator: CertSigner
    operator2: CertSigner
    agent: CertSigner
    stranger: CertSigner
    trust: CertTrust
    guard: ReplayGuard
    rejections: Counter[str]

    def open(self, data: bytes, now: float = T, max_bytes: int = 1 << 20) -> Command:
        return envelope.open(
            data, self.trust, self.guard, now, max_bytes=max_bytes, rejections=self.rejections
        )


@pytest.fixture
def mesh(tmp_path: Path) -> Mesh:
    cluster = init_cluster(tmp_path / "c", "lab", "op", NOW)
    op2 = enroll_node(cluster.ca, tmp_path / "op2", "operator", [], DAY, NOW)
    agent = enroll_node(cluster.ca, tmp_path / "a", "agent", [], DAY, NOW)
    other = init_cluster(tmp_path / "other", "other", "op", NOW)
    return Mesh(
        operator=CertSigner(cluster.operator),
        operator2=CertSigner(op2),
        agent=CertSigner(agent),
        stranger=CertSigner(other.operator),
        trust=CertTrust(cluster.ca.certificate),
        guard=ReplayGuard(),
        rejections=Counter(),
    )


def _edit(data: bytes, **fields: object) -> bytes:
    doc = msgpack.unpackb(data)
    doc.update(fields)
    out: bytes = msgpack.packb(doc, use_bin_type=True)
    return out


def test_round_trip(mesh: Mesh) -> None:
    cid = uuid.uuid4().hex
    data = seal(mesh.operator, "drain", b"\x81\xa4node\xa1x", T, command_id=cid)
    command = mesh.open(data, now=T + 3)
    assert command == Command(mesh.operator.node_id, cid, T, "drain", b"\x81\xa4node\xa1x")
    assert not mesh.rejections


def test_each_refusal_has_its_error_and_counter(mesh: Mesh) -> None:
    cid = uuid.uuid4().hex
    good = seal(mesh.operator, "cancel", b"job-1", T, command_id=cid)
    good_command = Command(mesh.operator.node_id, cid, T, "cancel", b"job-1")
    cases: list[tuple[bytes, type[EnvelopeError], float]] = [
        # data altered after signing
        (_edit(good, body=b"job-2"), Forged, T),
        # signature of another node (an agent) over exactly this command
        (_edit(good, sig=mesh.agent.sign(signed_payload(good_command))), Forged, T),
        # claims operator2's identity but carries operator's signature
        (_edit(good, op=mesh.operator2.node_id, cred=mesh.operator2.credential), Forged, T),
        (_edit(good, sig=b""), Unsigned, T),
        (seal(mesh.agent, "cancel", b"job-1", T), NotOperator, T),
        (seal(mesh.stranger, "cancel", b"job-1", T), UntrustedSigner, T),
        (seal(mesh.operator, "cancel", b"job-1", T - 121), Skewed, T),
        (seal(mesh.operator, "cancel", b"job-1", T + 121), Skewed, T),
        (b"\xc1", Malformed, T),
        (msgpack.packb([1, 2, 3]), Malformed, T),
        (_edit(good, id="not-a-uuid"), Malformed, T),
        (_edit(good, at=1), Malformed, T),
        (_edit(good, v=2), Malformed, T),
        (seal(mesh.operator, "submit", b"x" * 5000, T), Oversized, T),
    ]
    for data, error, now in cases:
        with pytest.raises(error):
            mesh.open(data, now=now, max_bytes=4096)
    assert mesh.rejections == Counter(
        forged=3,
        unsigned=1,
        not_operator=1,
        untrusted_signer=1,
        skewed=2,
        malformed=5,
        oversized=1,
    )
    # None of those burned the command id: the genuine command still goes through, once.
    assert mesh.open(good).body == b"job-1"
    with pytest.raises(Replayed):
        mesh.open(good, now=T + 10)
    assert mesh.rejections["replayed"] == 1


def test_revoked_operator_is_refused(mesh: Mesh) -> None:
    assert mesh.open(seal(mesh.operator2, "drain", b"n1", T)).kind == "drain"
    rl = issue_revocations(mesh.operator, [mesh.operator2.node_id], [], 1, T)
    assert mesh.trust.apply_revocations(rl, T)
    with pytest.raises(Revoked):
        mesh.open(seal(mesh.operator2, "drain", b"n1", T + 1), now=T + 1)
    assert mesh.rejections == Counter(revoked=1)


def test_expired_operator_certificate_is_untrusted(mesh: Mesh) -> None:
    later = T + 2 * 86400
    with pytest.raises(UntrustedSigner, match="expired"):
        mesh.open(seal(mesh.operator2, "drain", b"n1", later), now=later)


def test_seal_refuses_empty_kind(mesh: Mesh) -> None:
    with pytest.raises(ValueError):
        seal(mesh.operator, "", b"", T)
