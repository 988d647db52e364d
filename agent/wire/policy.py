"""The team policy: who the cluster's people are, their teams and roles, and each team's share.

One admin-signed, versioned policy, kept by every agent as the revocation list is: the highest
version that verifies wins and survives a restart (:mod:`agent.people.keeper`). The signed record
(:class:`SignedPolicy`, ``policy.bin`` on disk, ``GET /v1/policy``) is an outer msgpack map
``{"body": bytes, "by": signer id, "cred": signer's DER certificate, "sig": Ed25519 signature}``;
the signature covers :data:`SIGNING_CONTEXT` then ``body``, itself a msgpack map read here with
the codec's bounded readers:

- ``version`` (1 and up), ``at`` (issued, seconds since the epoch);
- ``teams``: name, ``ceiling`` (the highest priority its people may submit at; ``None``: none),
  ``quotas``: per GPU model class (or ``any``), GPUs guaranteed and the most it may hold;
- ``users``: name, team, role (``admin``, ``user``, ``viewer``), the node id of the person's key
  (what every command they sign names: a certificate re-issued for the same key keeps it);
- ``ceilings``: the highest priority per role (a role missing: no ceiling of its own).

A body is at most :data:`MAX_POLICY_BODY_BYTES` (1 MiB: some 9,000 people). It moves between
agents as content of kind ``policy`` in their stores (:mod:`agent.content.policybody`); what is
gossiped (``shoal/policy``) is the small :class:`PolicyRecord`: the version, the body's content
digest and size, and the signer's id, certificate and signature over the body (the very
signature of the signed record). An agent believes nothing of a record until it holds the body
the digest names and the signature verifies over it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import msgpack

from agent.wire.codec import (
    EMPTY_MAP,
    MAX_RECORD_BYTES,
    WireError,
    field,
    integer,
    items,
    number,
    obj,
    one_of,
    opt_integer,
    or_default,
    pack,
    text,
    unpack,
)

POLICY: Final = "shoal/policy"
"""The gossip record kind that carries the policy (each agent re-publishes the record it holds)."""
POLICY_FILE: Final = "policy.bin"
"""Where the record is kept: beside the CA on the admin's machine, in each agent's data folder."""
SIGNING_CONTEXT: Final = b"shoal/policy/v1\x00"
MAX_POLICY_BODY_BYTES: Final = 1 << 20
"""The largest policy body: 1 MiB, some 9,000 people of 100-130 bytes each, and their teams."""
MAX_POLICY_BYTES: Final = MAX_POLICY_BODY_BYTES + (16 << 10)
"""The largest signed record (:class:`SignedPolicy`): the body, the certificate, the signature."""
ROLES: Final = ("admin", "user", "viewer")
ANY_CLASS: Final = "any"
"""The GPU model class of a quota that counts every GPU."""
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
MAX_ENTRIES: Final = 10_000


def check_name(value: str, what: str) -> str:
    """A person's or team's name: 1-32 of ``a-z 0-9 . _ -``, starting with a letter or digit."""
    if not _NAME.fullmatch(value):
        raise WireError(f"{what} {value[:40]!r}: 1-32 of a-z 0-9 . _ - (first a letter or digit)")
    return value


def _name(value: Any, name: str) -> str:
    return check_name(text(value, name), name)


def _count(value: Any, name: str) -> int:
    got = integer(value, name)
    if got < 0:
        raise WireError(f"{name}: {got} is negative")
    return got


class Quota(NamedTuple):
    """A team's share of one GPU model class: ``guaranteed_gpus`` it may always have back,
    ``max_gpus`` it may hold at most, borrowing included."""

    gpu_class: str
    guaranteed_gpus: int
    max_gpus: int

    def to_wire(self) -> dict[str, Any]:
        return {"class": self.gpu_class, "guaranteed": self.guaranteed_gpus, "max": self.max_gpus}

    @classmethod
    def decode(cls, data: Any, name: str = "quota") -> Quota:
        doc = obj(data, name)
        quota = cls(
            gpu_class=field(doc, "class", text, f"{name}."),
            guaranteed_gpus=field(doc, "guaranteed", _count, f"{name}."),
            max_gpus=field(doc, "max", _count, f"{name}."),
        )
        if not quota.gpu_class or len(quota.gpu_class) > 64:
            raise WireError(f"{name}.class: 1-64 characters")
        if quota.max_gpus < quota.guaranteed_gpus:
            raise WireError(f"{name}: max {quota.max_gpus} below guaranteed")
        return quota


class Team(NamedTuple):
    name: str
    ceiling: int | None
    """The highest priority this team's people may submit at; ``None``: no team ceiling."""
    quotas: tuple[Quota, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ceiling": self.ceiling,
            "quotas": [q.to_wire() for q in self.quotas],
        }

    @classmethod
    def decode(cls, data: Any, name: str = "team") -> Team:
        doc = obj(data, name)
        quotas = field(doc, "quotas", lambda v, n: items(v, n, Quota.decode), f"{name}.")
        classes = [q.gpu_class for q in quotas]
        if len(set(classes)) != len(classes):
            raise WireError(f"{name}.quotas: a GPU class twice")
        return cls(
            name=field(doc, "name", _name, f"{name}."),
            ceiling=field(doc, "ceiling", opt_integer, f"{name}."),
            quotas=quotas,
        )


class Person(NamedTuple):
    name: str
    team: str
    role: str
    """``admin``, ``user`` or ``viewer``."""
    node_id: str
    """The node id of the person's key: the ``op`` of every command they sign."""

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "team": self.team, "role": self.role, "id": self.node_id}

    @classmethod
    def decode(cls, data: Any, name: str = "user") -> Person:
        doc = obj(data, name)
        node_id = field(doc, "id", text, f"{name}.")
        if not 1 <= len(node_id) <= 64:
            raise WireError(f"{name}.id: 1-64 characters")
        return cls(
            name=field(doc, "name", _name, f"{name}."),
            team=field(doc, "team", _name, f"{name}."),
            role=field(doc, "role", one_of(ROLES), f"{name}."),
            node_id=node_id,
        )


class PolicyBody(NamedTuple):
    """What an admin signs."""

    version: int
    issued_at: float
    teams: tuple[Team, ...] = ()
    users: tuple[Person, ...] = ()
    ceilings: Mapping[str, int] = EMPTY_MAP
    """The highest priority per role (``admin``, ``user``, ``viewer``)."""

    def team(self, name: str) -> Team | None:
        return _index(self).teams.get(name)

    def person(self, name: str) -> Person | None:
        return _index(self).by_name.get(name)

    def person_by_id(self, node_id: str) -> Person | None:
        """Looked up at every command and for every job's team: a dict, not a scan of
        thousands of people."""
        return _index(self).by_id.get(node_id)

    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "at": self.issued_at,
            "teams": [t.to_wire() for t in self.teams],
            "users": [u.to_wire() for u in self.users],
            "ceilings": dict(self.ceilings),
        }

    @classmethod
    def decode(cls, data: Any, name: str = "policy") -> PolicyBody:
        doc = obj(data, name)
        teams = field(doc, "teams", lambda v, n: items(v, n, Team.decode), f"{name}.")
        users = field(doc, "users", lambda v, n: items(v, n, Person.decode), f"{name}.")
        raw_ceilings: Mapping[str, Any] = field(
            doc, "ceilings", or_default(obj, EMPTY_MAP), f"{name}."
        )
        ceilings: dict[str, int] = {}
        for role, value in raw_ceilings.items():
            one_of(ROLES)(role, f"{name}.ceilings")
            ceilings[role] = integer(value, f"{name}.ceilings.{role}")
        body = cls(
            version=field(doc, "version", _count, f"{name}."),
            issued_at=field(doc, "at", number, f"{name}."),
            teams=teams,
            users=users,
            ceilings=ceilings,
        )
        body.check()
        return body

    def check(self) -> None:
        """Raise :class:`WireError` unless the record holds together: version 1 and up, names
        unique, every person's team listed, at most :data:`MAX_ENTRIES` of each."""
        if self.version < 1:
            raise WireError("policy.version: a signed policy starts at version 1")
        if len(self.teams) > MAX_ENTRIES or len(self.users) > MAX_ENTRIES:
            raise WireError(f"policy: more than {MAX_ENTRIES} teams or users")
        team_names = [t.name for t in self.teams]
        if len(set(team_names)) != len(team_names):
            raise WireError("policy.teams: a team named twice")
        for key in ("name", "node_id"):
            values = [getattr(u, key) for u in self.users]
            if len(set(values)) != len(values):
                raise WireError(f"policy.users: a {key.replace('_', ' ')} listed twice")
        for user in self.users:
            if user.team not in team_names:
                raise WireError(f"policy.users: {user.name}'s team {user.team!r} is not listed")


class _Index(NamedTuple):
    body: PolicyBody
    """Held, so that its ``id`` names no other body while it is indexed here."""
    teams: dict[str, Team]
    by_name: dict[str, Person]
    by_id: dict[str, Person]


_INDEXES: OrderedDict[int, _Index] = OrderedDict()
_INDEXES_KEPT: Final = 8


def _index(body: PolicyBody) -> _Index:
    """The lookups of ``body`` (immutable), made once; the first of a name wins, as a scan's."""
    found = _INDEXES.get(id(body))
    if found is not None and found.body is body:
        return found
    made = _Index(
        body,
        {t.name: t for t in reversed(body.teams)},
        {u.name: u for u in reversed(body.users)},
        {u.node_id: u for u in reversed(body.users)},
    )
    _INDEXES[id(body)] = made
    while len(_INDEXES) > _INDEXES_KEPT:
        _INDEXES.popitem(last=False)
    return made


class SignedPolicy(NamedTuple):
    """One version of the policy as an admin signed it (not yet verified: see
    :mod:`agent.people.keeper`)."""

    body: PolicyBody
    body_bytes: bytes
    signer_id: str
    signer_credential: bytes
    signature: bytes

    @property
    def version(self) -> int:
        return self.body.version

    def signed_payload(self) -> bytes:
        return SIGNING_CONTEXT + self.body_bytes

    def pointer(self, digest: str) -> PolicyRecord:
        """What is gossiped of this record once its body is content ``digest``."""
        return PolicyRecord(
            self.version,
            digest,
            len(self.body_bytes),
            self.signer_id,
            self.signer_credential,
            self.signature,
        )

    def encode(self) -> bytes:
        return _pack_signed(
            {"body": self.body_bytes}, self.signer_id, self.signer_credential, self.signature
        )

    @classmethod
    def decode(cls, data: bytes) -> SignedPolicy:
        """Parse a record; :class:`WireError` (one line) for anything that is not one."""
        doc, credential, signature = _signed_doc(data, MAX_POLICY_BYTES)
        body_bytes = doc.get("body")
        if not isinstance(body_bytes, bytes):
            raise WireError("policy.body: expected bytes")
        return cls(
            body=PolicyBody.decode(unpack(body_bytes)),
            body_bytes=body_bytes,
            signer_id=field(doc, "by", text, "policy."),
            signer_credential=credential,
            signature=signature,
        )


def _pack_signed(fields: dict[str, Any], signer_id: str, credential: bytes, sig: bytes) -> bytes:
    data: bytes = msgpack.packb(
        {**fields, "by": signer_id, "cred": credential, "sig": sig}, use_bin_type=True
    )
    return data


def _signed_doc(data: bytes, limit: int) -> tuple[dict[str, Any], bytes, bytes]:
    """The map of a signed record of at most ``limit`` bytes, its certificate and signature."""
    if len(data) > limit:
        raise WireError(f"policy record of {len(data)} bytes exceeds {limit}")
    doc = unpack(data)
    credential, signature = doc.get("cred"), doc.get("sig")
    if not isinstance(credential, bytes) or not isinstance(signature, bytes):
        raise WireError("policy.cred and policy.sig: expected bytes")
    return doc, credential, signature


class BodyMismatch(WireError):
    """A body that is not the one its record names (its size or version differ)."""


class PolicyRecord(NamedTuple):
    """What is gossiped of a policy: where its body is (content ``digest`` of ``size_bytes``)
    and who signed it. Nothing in it is believed before the body is held and verified."""

    version: int
    digest: str
    """The content digest of the body (:mod:`agent.content.policybody`)."""
    size_bytes: int
    signer_id: str
    signer_credential: bytes
    signature: bytes
    """The signer's, over :data:`SIGNING_CONTEXT` then the body's bytes."""

    def encode(self) -> bytes:
        return _pack_signed(
            {"v": self.version, "digest": self.digest, "size": self.size_bytes},
            self.signer_id,
            self.signer_credential,
            self.signature,
        )

    @classmethod
    def decode(cls, data: bytes) -> PolicyRecord:
        """Parse a gossiped record; :class:`WireError` (one line) for anything that is not one."""
        doc, credential, signature = _signed_doc(data, MAX_RECORD_BYTES)
        digest = field(doc, "digest", text, "policy.")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise WireError("policy.digest: 64 lowercase hex digits")
        size = field(doc, "size", _count, "policy.")
        if not 0 < size <= MAX_POLICY_BODY_BYTES:
            raise WireError(f"policy.size: {size} is not 1..{MAX_POLICY_BODY_BYTES}")
        record = cls(
            version=field(doc, "v", _count, "policy."),
            digest=digest,
            size_bytes=size,
            signer_id=field(doc, "by", text, "policy."),
            signer_credential=credential,
            signature=signature,
        )
        if record.version < 1:
            raise WireError("policy.v: a signed policy starts at version 1")
        return record

    def joined(self, body_bytes: bytes) -> SignedPolicy:
        """The signed record of this one's body (the bytes content :attr:`digest` holds);
        :class:`BodyMismatch` when they are not the body this record names, :class:`WireError`
        when they are no policy body. The signature is checked by the keeper, over these
        bytes."""
        if len(body_bytes) != self.size_bytes:
            raise BodyMismatch(
                f"policy body of {len(body_bytes)} bytes where the record says {self.size_bytes}"
            )
        body = PolicyBody.decode(unpack(body_bytes))
        if body.version != self.version:
            raise BodyMismatch(
                f"policy body of version {body.version} where the record says {self.version}"
            )
        return SignedPolicy(
            body, body_bytes, self.signer_id, self.signer_credential, self.signature
        )


def sign_policy(body: PolicyBody, signer: Any) -> SignedPolicy:
    """Sign ``body`` as ``signer`` (a :class:`gossip.trust.Signer`: an admin's identity);
    :class:`WireError` when it does not hold together or is over
    :data:`MAX_POLICY_BODY_BYTES`."""
    body.check()
    body_bytes = pack(body.to_wire())
    if len(body_bytes) > MAX_POLICY_BODY_BYTES:
        raise WireError(
            f"the policy would be {len(body_bytes)} bytes, more than {MAX_POLICY_BODY_BYTES}"
        )
    unsigned = SignedPolicy(body, body_bytes, signer.node_id, signer.credential, b"")
    return unsigned._replace(signature=signer.sign(unsigned.signed_payload()))
