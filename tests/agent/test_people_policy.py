"""The team policy record and the rules, without processes: the record decodes only through the
codec's bounded readers (hostile bodies are one-line errors), the keeper believes only an admin
and only a newer version and keeps it across a restart, and the rules table row by row."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgpack
import pytest

from agent.content.policybody import pointer_of
from agent.people import rules
from agent.people.keeper import PolicyKeeper, PolicyRefused
from agent.people.rules import Refused, Standing
from agent.wire.codec import MAX_WIRE_INT, WireError, pack
from agent.wire.policy import (
    MAX_POLICY_BYTES,
    POLICY_FILE,
    Person,
    PolicyBody,
    Quota,
    SignedPolicy,
    Team,
    sign_policy,
)
from gossip.certtrust import CertSigner, CertTrust
from gossip.identity import NodeIdentity, enroll_node
from tests.agent.authority_kit import Kit


class People:
    def __init__(self, root: Path) -> None:
        self.kit = Kit(root)
        self.admin = self.kit.cluster.operator
        self.alice = self.person("alice", "user")
        self.otto = self.person("otto", "operator")  # an admin's kind of key

    def person(self, name: str, role: str) -> NodeIdentity:
        return enroll_node(
            self.kit.cluster.ca,
            self.kit.root / name,
            role,  # type: ignore[arg-type]
            [name],
            timedelta(days=1),
            datetime.now(UTC),
        )

    def trust(self) -> CertTrust:
        trust = CertTrust(self.kit.cluster.ca.certificate)
        for who in (self.admin, self.alice, self.otto):
            trust.admit(who.node_id, who.certificate_der, time.time())
        return trust

    def body(self, version: int, otto: str = "user", alice: str = "user") -> PolicyBody:
        return PolicyBody(
            version=version,
            issued_at=time.time(),
            teams=(Team("ops", None), Team("vision", 5, (Quota("any", 1, 4),))),
            users=(
                Person("root", "ops", "admin", self.admin.node_id),
                Person("alice", "vision", alice, self.alice.node_id),
                Person("otto", "ops", otto, self.otto.node_id),
            ),
            ceilings={"user": 10},
        )


@pytest.fixture
def people(tmp_path: Path) -> People:
    return People(tmp_path)


def test_a_record_round_trips(people: People) -> None:
    signed = sign_policy(people.body(3), CertSigner(people.admin))
    back = SignedPolicy.decode(signed.encode())
    assert back == signed
    assert back.body.team("vision") == Team("vision", 5, (Quota("any", 1, 4),))
    assert back.body.ceilings == {"user": 10}


def _signed_bytes(people: People, body: dict[str, object]) -> bytes:
    raw = pack(body)
    signer = CertSigner(people.admin)
    sig = signer.sign(b"shoal/policy/v1\x00" + raw)
    data: bytes = msgpack.packb(
        {"body": raw, "by": signer.node_id, "cred": signer.credential, "sig": sig},
        use_bin_type=True,
    )
    return data


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"version": 0}, "starts at version 1"),
        ({"version": -1}, "negative"),
        ({"version": MAX_WIRE_INT + 1}, "out of range"),
        ({"at": float("nan")}, "finite"),
        ({"teams": [{"name": "BAD NAME", "ceiling": None, "quotas": []}]}, "a-z"),
        ({"ceilings": {"root": 3}}, "not one of"),
        ({"ceilings": {"user": 2**63}}, "out of range"),
        ({"ceilings": {"user": 1.5}}, "an integer"),
        ({"teams": "x"}, "a list"),
    ],
)
def test_a_hostile_body_is_one_line_error(
    people: People, change: dict[str, object], says: str
) -> None:
    doc = {**people.body(2).to_wire(), **change}
    with pytest.raises(WireError) as caught:
        SignedPolicy.decode(_signed_bytes(people, doc))
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("quota", "says"),
    [
        ({"class": "any", "guaranteed": 3, "max": 2}, "below guaranteed"),
        ({"class": "any", "guaranteed": -1, "max": 2}, "negative"),
        ({"class": "", "guaranteed": 0, "max": 2}, "1-64"),
    ],
)
def test_a_hostile_quota_is_refused(people: People, quota: dict[str, object], says: str) -> None:
    doc = people.body(2).to_wire()
    doc["teams"][1]["quotas"] = [quota]
    with pytest.raises(WireError, match=says):
        SignedPolicy.decode(_signed_bytes(people, doc))


def test_people_must_hold_together(people: People) -> None:
    doc = people.body(2).to_wire()
    doc["users"][1]["team"] = "nowhere"
    with pytest.raises(WireError, match="is not listed"):
        SignedPolicy.decode(_signed_bytes(people, doc))
    doc = people.body(2).to_wire()
    doc["users"][2]["id"] = doc["users"][1]["id"]
    with pytest.raises(WireError, match="listed twice"):
        SignedPolicy.decode(_signed_bytes(people, doc))
    for garbage in (b"\xc1", msgpack.packb([1, 2]), b"x" * (MAX_POLICY_BYTES + 1)):
        with pytest.raises(WireError):
            SignedPolicy.decode(garbage)


def _by(body: PolicyBody, who: NodeIdentity) -> bytes:
    return sign_policy(body, CertSigner(who)).encode()


def test_the_keeper_believes_only_an_admin(people: People) -> None:
    keeper = PolicyKeeper(people.trust(), None)
    now = time.time()
    # A user's certificate never signs a believed policy, even one naming her an admin.
    with pytest.raises(PolicyRefused, match="no admin's certificate"):
        keeper.offer(
            sign_policy(people.body(5, alice="admin"), CertSigner(people.alice)).encode(), now
        )
    # An admin's kind of key that the record does not make an admin.
    with pytest.raises(PolicyRefused, match="no admin in it"):
        keeper.offer(sign_policy(people.body(5), CertSigner(people.otto)).encode(), now)
    assert keeper.offer(sign_policy(people.body(1), CertSigner(people.admin)).encode(), now)
    # Otto names himself an admin in a newer record: the held policy does not make him one.
    with pytest.raises(PolicyRefused, match="policy held here"):
        keeper.offer(
            sign_policy(people.body(2, otto="admin"), CertSigner(people.otto)).encode(), now
        )
    # A forged signature.
    good = sign_policy(people.body(3), CertSigner(people.admin))
    with pytest.raises(PolicyRefused, match="forged"):
        keeper.offer(good._replace(signature=bytes(64)).encode(), now)
    assert keeper.version == 1
    assert keeper.refused == {"not_admin": 3, "forged": 1}


def test_the_highest_version_wins_and_survives_a_restart(people: People, tmp_path: Path) -> None:
    path = tmp_path / POLICY_FILE
    keeper = PolicyKeeper(people.trust(), path)
    now = time.time()
    admin = CertSigner(people.admin)
    assert keeper.offer(sign_policy(people.body(2), admin).encode(), now)
    assert not keeper.offer(sign_policy(people.body(1), admin).encode(), now)
    assert keeper.refused == {"older": 1}
    # Two admins racing at one version: every agent settles on the same one.
    a = sign_policy(people.body(3), admin)
    b = sign_policy(people.body(3, alice="viewer"), admin)
    other = PolicyKeeper(people.trust(), None)
    other.offer(people_record := b.encode(), now)
    other.offer(a.encode(), now)
    keeper.offer(a.encode(), now)
    keeper.offer(people_record, now)
    assert keeper.held == other.held
    assert path.stat().st_mode & 0o077 == 0
    again = PolicyKeeper(people.trust(), path)
    again.load(now)
    assert again.held == keeper.held
    path.write_bytes(b"garbage")
    broken = PolicyKeeper(people.trust(), path)
    broken.load(now)  # logged, not held
    assert broken.held is None and broken.refused == {"malformed": 1}


def test_standing(people: People) -> None:
    body = people.body(1, otto="admin")
    assert rules.standing(None, "op", "operator") == Standing("op", "admin")
    with pytest.raises(Refused) as caught:
        rules.standing(None, "u", "user")
    assert caught.value.why == "no_policy"
    with pytest.raises(Refused) as caught:
        rules.standing(body, people.admin.node_id, "agent")
    assert caught.value.why == "not_a_person"
    with pytest.raises(Refused) as caught:
        rules.standing(body, "nobody", "operator")
    assert caught.value.why == "not_in_policy"
    alice = rules.standing(body, people.alice.node_id, "user")
    assert (alice.role, alice.team, alice.ceiling) == ("user", "vision", 5)  # min(team 5, user 10)
    assert rules.standing(body, people.otto.node_id, "operator").role == "admin"
    # A user certificate named admin is a user: the certificate bounds the role.
    assert rules.standing(body, people.otto.node_id, "user").role == "user"


ROWS = [
    # role, kind, submitter is them, allowed
    ("admin", "cordon", False, True),
    ("admin", "cancel", False, True),
    ("admin", "policy", False, True),
    ("user", "submit", True, True),
    ("user", "cancel", True, True),
    ("user", "migrate", True, True),
    ("user", "cancel", False, False),
    ("user", "migrate", False, False),
    ("user", "cordon", True, False),
    ("user", "drain", True, False),
    ("user", "undrain", True, False),
    ("user", "revoke", True, False),
    ("user", "policy", True, False),
    ("user", "newkind", True, False),
    ("user", "workdir_put", True, True),
    ("user", "workdir_missing", True, True),
    ("user", "data_add", True, False),
    ("user", "stage", True, False),
    ("viewer", "workdir_put", True, False),
    ("viewer", "submit", True, False),
    ("viewer", "cancel", True, False),
]


@pytest.mark.parametrize(("role", "kind", "theirs", "allowed"), ROWS)
def test_the_rules_row_by_row(role: str, kind: str, theirs: bool, allowed: bool) -> None:
    who = Standing("me", role, "me")
    submitter = "me" if theirs else "someone"
    try:
        if kind in rules.OWN_JOB:
            rules.check_job(who, kind, "j1", submitter)
        else:
            rules.check_kind(who, kind)
    except Refused:
        assert not allowed
    else:
        assert allowed


def test_a_job_with_no_submission_held_is_an_admins_only() -> None:
    rules.check_job(Standing("root", "admin"), "cancel", "j1", "")
    with pytest.raises(Refused) as caught:
        rules.check_job(Standing("me", "user", "me"), "cancel", "j1", "")
    assert caught.value.why == "not_owner"


def test_logs_and_priority() -> None:
    for role, theirs, allowed in [
        ("admin", False, True),
        ("viewer", False, True),
        ("user", True, True),
        ("user", False, False),
    ]:
        who = Standing("me", role, "me")
        try:
            rules.check_read_logs(who, "j1", "me" if theirs else "them")
        except Refused as exc:
            assert not allowed and exc.why == "not_owner"
        else:
            assert allowed
    rules.check_priority(Standing("me", "user", ceiling=5), 5)
    rules.check_priority(Standing("me", "admin"), 10**6)
    with pytest.raises(Refused, match="ceiling of 5"):
        rules.check_priority(Standing("me", "user", ceiling=5), 6)


def test_a_gossiped_record_is_believed_only_with_its_body(people: People) -> None:
    keeper = PolicyKeeper(people.trust(), None)
    now = time.time()
    admin = CertSigner(people.admin)
    one = sign_policy(people.body(1), admin)
    record = pointer_of(one)
    # Before its body is held, a record is only a reason to fetch: nothing is believed.
    assert keeper.consider(record.encode(), now, None) == record
    assert keeper.held is None
    assert keeper.offer_body(record, one.body_bytes, now)
    assert keeper.consider(record.encode(), now, record.digest) is None  # the held one
    # The same version with another body (two admins racing): fetched, the tie decided then.
    racing = pointer_of(sign_policy(people.body(1, alice="viewer"), admin))
    assert keeper.consider(racing.encode(), now, record.digest) == racing
    # A newer record whose body is not its own (another version's bytes under its digest).
    two = sign_policy(people.body(2), admin)
    with pytest.raises(PolicyRefused, match="version 1 where the record says 2"):
        keeper.offer_body(pointer_of(two), one.body_bytes, now)
    # The record's signer is checked before any body is fetched: a user's key never signs one.
    by_alice = sign_policy(people.body(3, alice="admin"), CertSigner(people.alice))
    with pytest.raises(PolicyRefused, match="no admin's certificate"):
        keeper.consider(pointer_of(by_alice).encode(), now, record.digest)
    # An admin's kind of key that the held policy does not make an admin.
    by_otto = sign_policy(people.body(3, otto="admin"), CertSigner(people.otto))
    with pytest.raises(PolicyRefused, match="policy held here"):
        keeper.consider(pointer_of(by_otto).encode(), now, record.digest)
    # The signature is checked over the body's bytes once they are held.
    forged = pointer_of(two)._replace(signature=bytes(64))
    assert keeper.consider(forged.encode(), now, record.digest) == forged
    with pytest.raises(PolicyRefused, match="forged"):
        keeper.offer_body(forged, two.body_bytes, now)
    with pytest.raises(PolicyRefused, match="not msgpack"):
        keeper.consider(b"\xc1", now, None)
    assert keeper.version == 1
    assert keeper.refused == {
        "body_mismatch": 1,
        "not_admin": 2,
        "forged": 1,
        "malformed": 1,
    }
    assert keeper.offer_body(pointer_of(two), two.body_bytes, now)
    assert keeper.version == 2
    # An older version is not fetched, and is counted.
    assert keeper.consider(record.encode(), now, pointer_of(two).digest) is None
    assert keeper.refused["older"] == 1
