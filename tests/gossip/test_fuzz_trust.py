"""Fuzzing what a node is handed to trust: certificates (a valid one with bytes changed, or any
bytes) and signed revocation lists. A certificate is admitted or refused with a reason, never an
exception; a revocation list decodes and verifies, or raises ``RevocationError``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gossip import revocation
from gossip.certtrust import Admission, CertSigner, CertTrust
from gossip.identity import ClusterIdentity, NodeIdentity, enroll_node, init_cluster
from tests.hostile import ANY, FUZZ, mutated


class _Cluster:
    def __init__(self, root: Path) -> None:
        now = datetime.now(UTC)
        self.cluster: ClusterIdentity = init_cluster(root / "cluster", "t", "operator", now)
        self.agent: NodeIdentity = enroll_node(
            self.cluster.ca, root / "a", "agent", ["127.0.0.1"], timedelta(days=1), now
        )
        self.revocations = revocation.issue_revocations(
            CertSigner(self.cluster.operator), [self.agent.node_id], [12345], 1, time.time()
        )

    def trust(self) -> CertTrust:
        return CertTrust(self.cluster.ca.certificate)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> _Cluster:
    return _Cluster(tmp_path_factory.mktemp("trust"))


@st.composite
def _flipped(draw: Any, data: bytes) -> bytes:
    """``data`` with a few bytes changed, cut short, or extended."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(out) - 1))
        out[i] = draw(st.integers(0, 255))
    cut = draw(st.integers(len(out) // 2, len(out) + 8))
    return bytes(out[:cut]) + b"\x00" * max(0, cut - len(out))


@FUZZ
@given(data=st.data())
def test_a_changed_or_made_up_certificate_is_refused_with_a_reason(
    cluster: _Cluster, data: st.DataObject
) -> None:
    der = cluster.agent.certificate_der
    credential = data.draw(_flipped(der) | st.binary(max_size=300), label="credential")
    trust = cluster.trust()
    admission = trust.check(cluster.agent.node_id, credential, time.time())
    assert isinstance(admission, Admission)
    if credential != der:
        assert admission is not Admission.ADMITTED or credential.startswith(der)


@FUZZ
@given(data=st.data())
@example(data=None)
def test_a_hostile_revocation_list_is_a_revocation_error(
    cluster: _Cluster, data: st.DataObject | None
) -> None:
    valid = revocation.encode(cluster.revocations)
    if data is None:  # the valid list itself decodes and verifies
        got = revocation.decode(valid)
        revocation.verify(got, cluster.trust(), time.time())
        assert got == cluster.revocations
        return
    doc = msgpack.unpackb(valid, raw=False)
    value = data.draw(mutated(doc, ANY) | ANY, label="value")
    try:
        hostile = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        hostile = data.draw(_flipped(valid), label="bytes")
    try:
        got = revocation.decode(hostile)
        revocation.verify(got, cluster.trust(), time.time())
        revocation.encode(got)
    except revocation.RevocationError:
        pass
