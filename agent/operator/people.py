"""The admin's side of people and roles: the team policy kept beside the CA, changed, signed
and offered to the mesh.

``policy.bin`` in the cluster directory holds the latest version this admin signed. A change
reads the newest of that file and the version the mesh holds (each verified as agents verify it,
:class:`agent.people.keeper.PolicyKeeper`), applies the change, signs the next version with the
admin's key, saves it, and offers it to the mesh as a ``policy`` command: every agent checks the
admin's signature itself and gossips it on. A mesh that cannot be reached leaves the version
saved here; ``shoal user push`` offers it again.

The body goes up first, as content of kind ``policy`` (``policy_missing``, ``policy_put``: what
the agent lacks of it), then the ``policy`` command with the small record that names it: the
agent believes it once the body it holds verifies, and the other agents fetch the body from it.
"""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path

from cryptography import x509

from agent.content.policybody import body_manifest, chunks_of
from agent.operator.client import ApiClient, ApiError
from agent.operator.upload import POLICY_COMMANDS, upload_content
from agent.people.keeper import PolicyKeeper, PolicyRefused
from agent.wire.codec import WireError
from agent.wire.policy import (
    POLICY_FILE,
    Person,
    PolicyBody,
    Quota,
    SignedPolicy,
    Team,
    check_name,
    sign_policy,
)
from gossip.certtrust import CertSigner, CertTrust
from gossip.identity import ClusterIdentity

DEFAULT_TEAM = "default"


class PolicyError(Exception):
    """A change that cannot be made; the message is one line."""


def person_name(text: str) -> str:
    """``text`` made a valid person's name (``shoal init``'s operator name: a host name)."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:32]
    return name or "admin"


def first_policy(cluster: ClusterIdentity, name: str, now: float) -> SignedPolicy:
    """Version 1: the cluster's operator, an admin of team ``default`` (``shoal init``)."""
    body = PolicyBody(
        version=1,
        issued_at=now,
        teams=(Team(DEFAULT_TEAM, None),),
        users=(Person(person_name(name), DEFAULT_TEAM, "admin", cluster.operator.node_id),),
    )
    signed = sign_policy(body, CertSigner(cluster.operator))
    save(cluster.directory, signed)
    return signed


def save(directory: Path, signed: SignedPolicy) -> None:
    path = directory / POLICY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(signed.encode())
    tmp.chmod(0o600)
    tmp.replace(path)


def _keeper(cluster: ClusterIdentity) -> PolicyKeeper:
    trust = CertTrust(cluster.ca.certificate)
    return PolicyKeeper(trust, None)


def newest(cluster: ClusterIdentity, from_mesh: bytes | None) -> SignedPolicy | None:
    """The newest believed of the version saved here and ``from_mesh`` (what an agent holds)."""
    keeper = _keeper(cluster)
    now = time.time()
    for data in (_read(cluster.directory), from_mesh):
        if data is None:
            continue
        try:
            keeper.offer(data, now)
        except PolicyRefused as exc:
            raise PolicyError(f"a team policy that does not verify: {exc}") from None
    return keeper.held


def _read(directory: Path) -> bytes | None:
    try:
        return (directory / POLICY_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PolicyError(f"cannot read {directory / POLICY_FILE}: {exc.strerror or exc}") from None


def base_body(cluster: ClusterIdentity, held: SignedPolicy | None) -> PolicyBody:
    """What the next version starts from: the held one, else version 0 with this admin in it
    (a cluster from before people and roles: its operator becomes the first admin)."""
    if held is not None:
        return held.body
    me = Person(
        person_name(_operator_name(cluster)), DEFAULT_TEAM, "admin", cluster.operator.node_id
    )
    return PolicyBody(version=0, issued_at=0.0, teams=(Team(DEFAULT_TEAM, None),), users=(me,))


def _operator_name(cluster: ClusterIdentity) -> str:
    """The name ``shoal init`` gave the operator (its certificate's DNS name)."""
    try:
        names = cluster.operator.certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value
    except x509.ExtensionNotFound:
        return "admin"
    dns = names.get_values_for_type(x509.DNSName)
    return dns[0] if dns else "admin"


def sign_next(
    cluster: ClusterIdentity, body: PolicyBody, held: SignedPolicy | None
) -> SignedPolicy:
    """Sign ``body`` as the version after ``held``, as this admin, and save it."""
    version = (held.version if held is not None else 0) + 1
    try:
        signed = sign_policy(
            body._replace(version=version, issued_at=time.time()), CertSigner(cluster.operator)
        )
    except WireError as exc:
        raise PolicyError(str(exc)) from None
    me = signed.body.person_by_id(cluster.operator.node_id)
    if me is None or me.role != "admin":
        raise PolicyError("this change would leave you no admin: agents would not believe it")
    save(cluster.directory, signed)
    return signed


def with_person(body: PolicyBody, person: Person) -> PolicyBody:
    """``person`` added, or put in place of the one of that name."""
    check_name(person.name, "user name")
    check_name(person.team, "team name")
    clash = body.person_by_id(person.node_id)
    if clash is not None and clash.name != person.name:
        raise PolicyError(f"that key is already {clash.name}'s")
    teams = body.teams
    if body.team(person.team) is None:
        teams = (*teams, Team(person.team, None))
    users = (*(u for u in body.users if u.name != person.name), person)
    return body._replace(teams=teams, users=users)


def without_person(body: PolicyBody, name: str) -> tuple[PolicyBody, Person]:
    person = body.person(name)
    if person is None:
        raise PolicyError(f"no user {name!r} in the team policy")
    return body._replace(users=tuple(u for u in body.users if u.name != name)), person


def with_team(
    body: PolicyBody, name: str, ceiling: int | None, quotas: tuple[Quota, ...] | None
) -> PolicyBody:
    """Team ``name`` added or changed: its priority ceiling and (when given) its quotas."""
    check_name(name, "team name")
    held = body.team(name) or Team(name, None)
    team = Team(name, ceiling, held.quotas if quotas is None else quotas)
    teams = (*(t for t in body.teams if t.name != name), team)
    return body._replace(teams=teams)


def parse_quota(text: str) -> Quota:
    """``CLASS=GUARANTEED:MAX`` (``any=4:8``, ``H100=2:4``)."""
    gpu_class, sep, counts = text.partition("=")
    low, sep2, high = counts.partition(":")
    try:
        if not (sep and sep2 and gpu_class):
            raise ValueError
        quota = Quota(gpu_class, int(low), int(high))
    except ValueError:
        raise PolicyError(f"quota {text!r}: CLASS=GUARANTEED:MAX, e.g. any=4:8") from None
    if quota.guaranteed_gpus < 0 or quota.max_gpus < quota.guaranteed_gpus:
        raise PolicyError(f"quota {text!r}: 0 <= guaranteed <= max")
    return quota


async def fetch(client: ApiClient) -> bytes | None:
    """The policy record the agent holds (``None``: none)."""
    answer = await client.get("/v1/policy")
    record = answer.get("record")
    return base64.b64decode(record) if isinstance(record, str) else None


async def publish(client: ApiClient, signed: SignedPolicy) -> str | None:
    """Put the body to the agent behind ``client``, then offer the record that names it to
    the mesh; ``None`` when accepted, else the one-line reason."""
    manifest = body_manifest(signed.body_bytes)
    record = signed.pointer(manifest.digest)
    try:
        await upload_content(
            client,
            manifest,
            lambda wanted: [
                c for c in chunks_of(signed.body_bytes, manifest) if c[0].digest in wanted
            ],
            POLICY_COMMANDS,
            f"team policy version {signed.version}",
        )
        await client.command("policy", {"policy": base64.b64encode(record.encode()).decode()})
    except (ApiError, ValueError) as exc:
        return str(exc)
    return None
