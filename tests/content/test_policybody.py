"""The team policy's body as content, sans processes: put into a real store and read back whole,
chunk by chunk; a record names it by digest and stays one small gossip record however many people
the body holds; a body that is not its record's is refused."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest

from agent.content.manifest import ContentError, ContentFile, ContentManifest
from agent.content.policybody import (
    CHUNK_BYTES,
    body_manifest,
    pointer_of,
    put_body,
    read_body,
)
from agent.content.store import DiskStore
from agent.wire.codec import MAX_RECORD_BYTES, WireError
from agent.wire.policy import (
    MAX_POLICY_BODY_BYTES,
    BodyMismatch,
    Person,
    PolicyBody,
    PolicyRecord,
    SignedPolicy,
    Team,
    sign_policy,
)
from gossip.certtrust import CertSigner
from gossip.identity import NodeIdentity
from tests.agent.authority_kit import Kit


def lab_body(version: int, admin: str, people: int, teams: int, pad: int = 0) -> PolicyBody:
    """A lab: ``teams`` teams, ``people`` users spread over them (names ``pad`` longer), and
    ``admin`` an admin."""
    names = [f"team-{t:03d}" for t in range(teams)]
    users = [Person("root", names[0], "admin", admin)]
    users += [
        Person(f"p{n:05d}" + "x" * pad, names[n % teams], "user", f"{n:064x}")
        for n in range(people)
    ]
    return PolicyBody(
        version=version,
        issued_at=time.time(),
        teams=tuple(Team(name, None) for name in names),
        users=tuple(users),
        ceilings={"user": 10},
    )


@pytest.fixture
def admin(tmp_path: Path) -> NodeIdentity:
    return Kit(tmp_path / "kit").cluster.operator


def test_a_lab_of_hundreds_is_one_small_record(admin: NodeIdentity) -> None:
    signed = sign_policy(lab_body(3, admin.node_id, 500, 50), CertSigner(admin))
    assert len(signed.body_bytes) > 8 * MAX_RECORD_BYTES  # it never fitted one gossip record
    record = pointer_of(signed)
    assert len(record.encode()) < MAX_RECORD_BYTES
    assert PolicyRecord.decode(record.encode()) == record
    assert record.digest == body_manifest(signed.body_bytes).digest
    assert record.size_bytes == len(signed.body_bytes) and record.version == 3
    assert record.joined(signed.body_bytes) == signed


def test_a_body_over_the_bound_is_refused_in_one_line(admin: NodeIdentity) -> None:
    with pytest.raises(WireError) as caught:
        sign_policy(lab_body(1, admin.node_id, 9000, 50, pad=26), CertSigner(admin))
    assert f"more than {MAX_POLICY_BODY_BYTES}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_body_is_held_whole_and_read_back(tmp_path: Path, admin: NodeIdentity) -> None:
    store = DiskStore(tmp_path / "store")
    signed = sign_policy(lab_body(2, admin.node_id, 6000, 50), CertSigner(admin))
    assert len(signed.body_bytes) > 2 * CHUNK_BYTES  # several chunks
    digest = put_body(store, signed.body_bytes)
    assert put_body(store, signed.body_bytes) == digest  # again: nothing new
    held = store.held(digest)
    assert held is not None and held.complete and held.kind == "policy"
    assert read_body(store, digest) == signed.body_bytes
    assert SignedPolicy.decode(signed.encode()) == pointer_of(signed).joined(
        read_body(store, digest)
    )
    with pytest.raises(ContentError, match="no policy body"):
        read_body(store, "0" * 64)
    # Content of another kind under the digest a record names is no policy body.
    other = ContentManifest("workdir", "w", CHUNK_BYTES, (ContentFile("a", 0, 0o644, ("e" * 64,)),))
    store.add_manifest(other)
    with pytest.raises(ContentError, match="is no policy body"):
        read_body(store, other.digest)
    # A body's manifest known, its chunks not held: not held whole.
    lone = body_manifest(b"\x81\xa1x\x01")
    store.add_manifest(lone)
    with pytest.raises(ContentError, match="not held whole"):
        read_body(store, lone.digest)
    store.close()


def test_a_body_that_is_not_its_records_is_a_mismatch(admin: NodeIdentity) -> None:
    two = sign_policy(lab_body(2, admin.node_id, 10, 2), CertSigner(admin))
    three = sign_policy(lab_body(3, admin.node_id, 10, 2), CertSigner(admin))
    record = pointer_of(three)
    assert len(two.body_bytes) == len(three.body_bytes)
    with pytest.raises(BodyMismatch, match="version 2 where the record says 3"):
        record.joined(two.body_bytes)
    with pytest.raises(BodyMismatch, match="bytes where the record says"):
        record.joined(three.body_bytes + b"\x00")
    with pytest.raises(WireError):
        record._replace(size_bytes=3).joined(b"abc")  # not a policy body at all


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"digest": "ABC"}, "64 lowercase hex"),
        ({"size": 0}, "is not 1.."),
        ({"size": MAX_POLICY_BODY_BYTES + 1}, "is not 1.."),
        ({"v": 0}, "starts at version 1"),
        ({"sig": "text"}, "expected bytes"),
    ],
)
def test_a_hostile_record_is_one_line_error(
    admin: NodeIdentity, change: dict[str, object], says: str
) -> None:
    record = pointer_of(sign_policy(lab_body(1, admin.node_id, 1, 1), CertSigner(admin)))
    doc = msgpack.unpackb(record.encode(), raw=False)
    with pytest.raises(WireError) as caught:
        PolicyRecord.decode(msgpack.packb({**doc, **change}, use_bin_type=True))
    assert says in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(WireError, match="exceeds"):
        PolicyRecord.decode(b"\x00" * (MAX_RECORD_BYTES + 1))


def test_lookups_in_a_lab_of_thousands(admin: NodeIdentity) -> None:
    body = lab_body(1, admin.node_id, 9000, 50)
    assert body.person_by_id(f"{8999:064x}") == Person("p08999", "team-049", "user", f"{8999:064x}")
    assert body.person("root") == Person("root", "team-000", "admin", admin.node_id)
    assert body.team("team-049") == Team("team-049", None)
    assert body.person("nobody") is None and body.team("nowhere") is None
    # A changed body is another body: its lookups see its people, the old one's its own.
    newcomer = Person("zed", "team-001", "user", "f" * 64)
    changed = body._replace(users=(*body.users, newcomer))
    assert changed.person_by_id("f" * 64) == newcomer and body.person_by_id("f" * 64) is None
    # Two people of one name (a body not yet checked): the first is found, as a scan finds it.
    twice = body._replace(users=(newcomer, newcomer._replace(node_id="e" * 64)))
    assert twice.person("zed") == newcomer
