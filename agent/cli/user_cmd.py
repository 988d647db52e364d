"""``shoal user`` and ``shoal team``: people, their roles and teams (:mod:`agent.cli.user_args`).

A person makes their key on their own machine and hands over only a certificate request, as a
host does with ``shoal enroll``; the admin certifies it with the cluster's CA (an ``operator``
certificate for an admin, a ``user`` certificate for a user or viewer: one never carries an
admin's authority) and adds the person to the team policy, which every agent keeps and checks
(:mod:`agent.operator.people`). Every change signs the next policy version and offers it to
the mesh; one the mesh could not take stays saved beside the CA for ``shoal user push``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives import serialization

from agent.cli.enroll_cmd import _install, _read_request
from agent.cli.ops_cmd import run_with_client
from agent.common.errors import UserError
from agent.common.paths import default_cluster_dir
from agent.operator import people
from agent.operator.client import ApiClient
from agent.operator.people import PolicyError
from agent.wire.codec import WireError
from agent.wire.policy import Person, PolicyBody, SignedPolicy, check_name
from gossip.identity import (
    NODE_CSR,
    NODE_KEY,
    ClusterIdentity,
    IdentityError,
    Role,
    certificate_request,
    issue_certificate,
    load_cluster,
    load_node_key,
)


def _print(args: argparse.Namespace, doc: Any, lines: list[str]) -> int:
    print(json.dumps(doc, sort_keys=True) if args.json else "\n".join(lines))
    return 0


def _cluster(args: argparse.Namespace) -> ClusterIdentity:
    directory = args.identity or default_cluster_dir()
    try:
        return load_cluster(directory)
    except IdentityError as exc:
        raise UserError(
            f"this needs the cluster directory with its CA ({directory}): {exc}"
        ) from None


# -- on the person's machine -----------------------------------------------------------------------


def _request(args: argparse.Namespace) -> int:
    from agent.bootstrap.keygen import keygen

    try:
        name = check_name(args.name, "user name")
        report = keygen(args.dir)  # made here, once; it never leaves this machine
        pem = certificate_request(load_node_key(args.dir), "user", [name])
        (args.dir / NODE_CSR).write_bytes(pem)
    except (IdentityError, WireError) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {args.dir}: {exc.strerror or exc}") from None
    request = args.dir / NODE_CSR
    return _print(
        args,
        {"node_id": report["node_id"], "key": str(args.dir / NODE_KEY), "request": str(request)},
        [
            f"your id   {report['node_id']}",
            f"key       {args.dir / NODE_KEY} (it never leaves this machine)",
            f"request   {request}",
            f"Next: give {request.name} to an admin, who runs",
            f"  shoal user add {name} --team TEAM --role user --request {request.name}",
            "and, with the certificate back here:",
            f"  shoal user install --dir {args.dir} {name}.crt",
        ],
    )


def _install_cert(args: argparse.Namespace) -> int:
    args.person = True
    return _install(args)


# -- on the admin's machine ------------------------------------------------------------------------


def _change(
    args: argparse.Namespace,
    change: Callable[[PolicyBody], PolicyBody],
    after: Callable[[ApiClient], Any] | None = None,
) -> tuple[SignedPolicy, str | None]:
    """Read the newest policy (saved here, held by the mesh), apply ``change``, sign the next
    version, save it, offer it; the signed version and the mesh's refusal (``None``: taken)."""
    cluster = _cluster(args)

    async def call(client: ApiClient) -> tuple[SignedPolicy, str | None]:
        held = people.newest(cluster, await people.fetch(client))
        signed = people.sign_next(cluster, change(people.base_body(cluster, held)), held)
        refused = await people.publish(client, signed)
        if refused is None and after is not None:
            await after(client)
        return signed, refused

    try:
        result: tuple[SignedPolicy, str | None] = run_with_client(args, call)
    except (PolicyError, WireError) as exc:
        raise UserError(str(exc)) from None
    return result


def _offered(refused: str | None) -> str:
    return "" if refused is None else f" (saved here; the mesh refused it: {refused})"


def _add(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if args.days < 1:
        raise UserError("--days must be at least 1")
    request = _read_request(args.request)
    try:
        check_name(args.name, "user name")
        check_name(args.team, "team name")
    except WireError as exc:
        raise UserError(str(exc)) from None
    role: Role = "operator" if args.role == "admin" else "user"
    now = datetime.now(UTC)
    cert = issue_certificate(
        cluster.ca, request.public_key, role, [args.name], timedelta(days=args.days), now
    )
    out = args.out or args.request.with_name(f"{args.name}.crt")
    pem = serialization.Encoding.PEM
    try:
        out.write_bytes(cert.public_bytes(pem) + cluster.ca.certificate.public_bytes(pem))
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    person = Person(args.name, args.team, args.role, request.node_id)
    signed, refused = _change(args, lambda body: people.with_person(body, person))
    return _print(
        args,
        {**person.to_wire(), "certificate": str(out), "policy_version": signed.version},
        [
            f"{args.name}: {args.role} of team {args.team}, id {request.node_id}",
            f"wrote {out} (their certificate, then the CA's): they run "
            f"'shoal user install --dir DIR {out.name}'",
            f"team policy version {signed.version}{_offered(refused)}",
        ],
    )


def _set(args: argparse.Namespace) -> int:
    if args.team is None and args.role is None:
        raise UserError("say what changes: --team TEAM, --role ROLE or both")

    demoted: list[bool] = []

    def change(body: PolicyBody) -> PolicyBody:
        person = body.person(args.name)
        if person is None:
            raise PolicyError(f"no user {args.name!r} in the team policy")
        changed = person._replace(team=args.team or person.team, role=args.role or person.role)
        demoted.append(person.role == "admin" and changed.role != "admin")
        return people.with_person(body, changed)

    async def resign(client: ApiClient) -> None:
        """A demoted admin's revocation lists stop being believed where the new policy is held:
        the list is signed again, as this admin, so a host that joins later still takes it."""
        from agent.operator.revocations import publish, revoke_nodes

        if demoted and demoted[0]:
            refused = await publish(client, revoke_nodes(_cluster(args), set()))
            if refused is not None:
                raise PolicyError(f"the revocation list, signed again, was refused: {refused}")

    signed, refused = _change(args, change, resign)
    lines = [f"{args.name} changed: team policy version {signed.version}{_offered(refused)}"]
    if demoted and demoted[0]:
        lines.append(
            f"note: {args.name} keeps an admin's certificate, which an agent holding no team "
            f"policy yet still believes; to take it away: shoal user revoke {args.name}, then "
            "add them again as a user"
        )
    return _print(args, {"name": args.name, "policy_version": signed.version}, lines)


def _revoke(args: argparse.Namespace) -> int:
    from agent.operator.revocations import publish, revoke_nodes

    gone: list[Person] = []

    def change(body: PolicyBody) -> PolicyBody:
        after, person = people.without_person(body, args.name)
        gone.append(person)
        return after

    async def then(client: ApiClient) -> None:
        signed = revoke_nodes(_cluster(args), {gone[0].node_id})
        refused = await publish(client, signed)
        if refused is not None:
            raise PolicyError(f"revocation signed and saved, but the mesh refused it: {refused}")

    signed, refused = _change(args, change, then)
    return _print(
        args,
        {"revoked": args.name, "node_id": gone[0].node_id, "policy_version": signed.version},
        [
            f"revoked {args.name} ({gone[0].node_id}): refused everywhere from now on",
            f"team policy version {signed.version}{_offered(refused)}",
        ],
    )


def _push(args: argparse.Namespace) -> int:
    cluster = _cluster(args)

    async def call(client: ApiClient) -> tuple[SignedPolicy | None, str | None]:
        held = people.newest(cluster, None)
        if held is None:
            return None, None
        return held, await people.publish(client, held)

    try:
        held, refused = run_with_client(args, call)
    except PolicyError as exc:
        raise UserError(str(exc)) from None
    if held is None:
        raise UserError(f"no team policy saved in {cluster.directory}")
    if refused is not None:
        raise UserError(f"the mesh refused policy version {held.version}: {refused}")
    return _print(args, {"version": held.version}, [f"offered team policy version {held.version}"])


def _ls(args: argparse.Namespace) -> int:
    async def call(client: ApiClient) -> dict[str, Any]:
        return await client.get("/v1/policy")

    answer = run_with_client(args, call)
    policy = answer.get("policy")
    if args.json:
        print(json.dumps(answer.get("policy"), sort_keys=True))
        return 0
    if not isinstance(policy, dict):
        print("no team policy yet: every operator certificate is an admin")
        return 0
    rows = [[u["name"], u["team"], u["role"], u["id"]] for u in policy["users"]]
    lines = [
        f"team policy version {policy['version']}",
        *_columns(["NAME", "TEAM", "ROLE", "ID"], rows),
    ]
    teams = []
    for t in policy["teams"]:
        quotas = ", ".join(f"{q['class']} {q['guaranteed']}-{q['max']}" for q in t["quotas"])
        ceiling = "-" if t["ceiling"] is None else str(t["ceiling"])
        teams.append([t["name"], ceiling, quotas or "-"])
    lines += ["", *_columns(["TEAM", "CEILING", "GPUS GUARANTEED-MAX"], teams)]
    if policy.get("ceilings"):
        ceilings = ", ".join(f"{r} {c}" for r, c in policy["ceilings"].items())
        lines += ["", f"role ceilings: {ceilings}"]
    print("\n".join(lines))
    return 0


def _columns(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]


USER_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "request": _request,
    "install": _install_cert,
    "add": _add,
    "ls": _ls,
    "set": _set,
    "revoke": _revoke,
    "push": _push,
}


def cmd_user(args: argparse.Namespace) -> int:
    return USER_ACTIONS[args.action](args)


def cmd_team(args: argparse.Namespace) -> int:
    quotas = None
    try:
        if args.quota is not None:
            quotas = tuple(people.parse_quota(q) for q in args.quota)
    except PolicyError as exc:
        raise UserError(str(exc)) from None

    def change(body: PolicyBody) -> PolicyBody:
        held = body.team(args.name)
        if hasattr(args, "ceiling"):  # given (``none`` clears it)
            ceiling = args.ceiling
        else:
            ceiling = None if held is None else held.ceiling
        return people.with_team(body, args.name, ceiling, quotas)

    signed, refused = _change(args, change)
    return _print(
        args,
        {"team": args.name, "policy_version": signed.version},
        [f"team {args.name} set: team policy version {signed.version}{_offered(refused)}"],
    )


__all__ = ["cmd_team", "cmd_user"]
