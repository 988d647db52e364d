"""The team policy: who the cluster's people are, their teams and roles, and each team's share.

One admin-signed, versioned record (``shoal/policy`` in gossip, ``policy.bin`` on disk), kept by
every agent as the revocation list is: the highest version that verifies wins and survives a
restart (:mod:`agent.people.keeper`). The record is an outer msgpack map ``{"body": bytes, "by":
signer id, "cred": signer's DER certificate, "sig": Ed25519 signature}``; the signature covers
:data:`SIGNING_CONTEXT` then ``body``, itself a msgpack map read here with the codec's bounded
readers:

- ``version`` (1 and up), ``at`` (issued, seconds since the epoch);
- ``teams``: name, ``ceiling`` (the highest priority its people may submit at; ``None``: none),
  ``quotas``: per GPU model class (or ``any``), GPUs guaranteed and the most it may hold;
- ``users``: name, team, role (``admin``, ``user``, ``viewer``), the node id of the person's key
  (what every command they sign names: a certificate re-issued for the same key keeps it);
- ``ceilings``: the highest priority per role (a role missing: no ceiling of its own).

The whole record fits one gossip record (:data:`MAX_POLICY_BYTES`): about 40 people and teams.
"""

from __future__ import annotations

import re
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
MAX_POLICY_BYTES: Final = MAX_RECORD_BYTES
ROLES: Final = ("admin", "user", "viewer")
ANY_CLASS: Final = "any"
"""The GPU model class of a quota that counts every GPU."""
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
MAX_ENTRIES: Final = 256


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
        return next((t for t in self.teams if t.name == name), None)

    def person(self, name: str) -> Person | None:
        return next((u for u in self.users if u.name == name), None)

    def person_by_id(self, node_id: str) -> Person | None:
        return next((u for u in self.users if u.node_id == node_id), None)

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

    def encode(self) -> bytes:
        data: bytes = msgpack.packb(
            {
                "body": self.body_bytes,
                "by": self.signer_id,
                "cred": self.signer_credential,
                "sig": self.signature,
            },
            use_bin_type=True,
        )
        return data

    @classmethod
    def decode(cls, data: bytes) -> SignedPolicy:
        """Parse a record; :class:`WireError` (one line) for anything that is not one."""
        if len(data) > MAX_POLICY_BYTES:
            raise WireError(f"policy record of {len(data)} bytes exceeds {MAX_POLICY_BYTES}")
        doc = unpack(data)
        body_bytes = doc.get("body")
        credential = doc.get("cred")
        signature = doc.get("sig")
        for key, value in (("body", body_bytes), ("cred", credential), ("sig", signature)):
            if not isinstance(value, bytes):
                raise WireError(f"policy.{key}: expected bytes")
        assert isinstance(body_bytes, bytes)
        assert isinstance(credential, bytes) and isinstance(signature, bytes)
        return cls(
            body=PolicyBody.decode(unpack(body_bytes)),
            body_bytes=body_bytes,
            signer_id=field(doc, "by", text, "policy."),
            signer_credential=credential,
            signature=signature,
        )


def sign_policy(body: PolicyBody, signer: Any) -> SignedPolicy:
    """Sign ``body`` as ``signer`` (a :class:`gossip.trust.Signer`: an admin's identity);
    :class:`WireError` when it does not hold together or would not fit one gossip record."""
    body.check()
    body_bytes = pack(body.to_wire())
    unsigned = SignedPolicy(body, body_bytes, signer.node_id, signer.credential, b"")
    signed = unsigned._replace(signature=signer.sign(unsigned.signed_payload()))
    size = len(signed.encode())
    if size > MAX_POLICY_BYTES:
        raise WireError(
            f"the policy would be {size} bytes, more than one gossip record ({MAX_POLICY_BYTES})"
        )
    return signed
