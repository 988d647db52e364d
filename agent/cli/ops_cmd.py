"""Operator commands of the CLI: submit, jobs, nodes, logs, cancel, migrate, cordon, drain,
undrain, revoke (their arguments: :mod:`agent.cli.ops_args`).

Each runs its requests through :class:`agent.operator.client.ApiClient` as the operator's identity
and prints a table (:mod:`agent.cli.tables`) or ``--json``. A job or node is named as the operator
sees it and resolved through the API before anything is signed (:mod:`agent.operator.resolve`).
Every failure an operator can cause or meet is one line (an ambiguous name lists what it matches).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.cli.ops_args import AGENT_ENV
from agent.cli.tables import hostnames, job_detail, job_hints, jobs_table, nodes_table
from agent.common.errors import UserError
from agent.common.paths import default_cluster_dir
from agent.job.jobstate import TERMINAL_JOB_STATES
from agent.operator.client import ApiClient, ApiError
from agent.operator.failover import first_answering
from agent.operator.fleet import fleet_path, load_fleet
from agent.operator.following import until_interrupted
from agent.operator.resolve import NODE_ID_RE, check_migration_target, pick_job, pick_node
from agent.operator.terminal import console, short
from gossip.identity import IdentityError, NodeIdentity, load_identity

# -- connection ------------------------------------------------------------------------------------


def operator_identity(args: argparse.Namespace) -> tuple[NodeIdentity, Path]:
    """The operator identity of ``--identity`` (default: the ``shoal init`` folder) and that
    folder (one-line errors)."""
    directory = args.identity or default_cluster_dir()
    if not (directory / "node.key").exists():
        raise UserError(
            f"no operator identity in {directory}: run 'shoal init' first or pass --identity DIR"
        )
    try:
        return load_identity(directory), directory
    except IdentityError as exc:
        raise UserError(f"cannot load your identity from {directory}: {exc}") from None


async def connect(args: argparse.Namespace) -> ApiClient:
    """A client, as the operator, to ``--agent`` (or ``$SHOAL_AGENT``); without either, to the
    first agent of the fleet (``fleet.toml`` in the cluster folder) that answers."""
    identity, directory = operator_identity(args)
    if args.agent:
        try:
            return ApiClient(identity, args.agent)
        except ValueError as exc:
            raise UserError(f"--agent: {exc}") from None
    fleet = load_fleet(directory)
    if not fleet.agents:
        raise UserError(
            f"no agent to talk to: pass --agent HOST:PORT, set ${AGENT_ENV}, or set up hosts "
            f"with 'shoal bootstrap' (it remembers them in {fleet_path(directory)})"
        )
    return await first_answering(identity, fleet.addresses)


def run_with_client(args: argparse.Namespace, call: Callable[[ApiClient], Awaitable[Any]]) -> Any:
    """``call(client)`` in a fresh event loop; an agent's refusal becomes a one-line UserError."""

    async def go() -> Any:
        async with await connect(args) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except ApiError as exc:
        raise UserError(str(exc)) from None


def run_following(args: argparse.Namespace, call: Callable[[ApiClient], Awaitable[Any]]) -> int:
    """:func:`run_with_client` for a command that may follow (``-f``): Ctrl-C is how a follow
    ends, so it exits 0 there, promptly (:mod:`agent.operator.following`); 130 otherwise, as
    anywhere."""

    async def followed(client: ApiClient) -> Any:
        return await until_interrupted(lambda: call(client))

    try:
        run_with_client(args, followed if args.follow else call)
    except KeyboardInterrupt:
        if not args.follow:
            raise
    return 0


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def print_json_line(value: Any) -> None:
    print(json.dumps(value, sort_keys=True), flush=True)


# -- commands --------------------------------------------------------------------------------------


async def _jobs_and_nodes(client: ApiClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return await client.jobs(), await client.nodes()


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.job is not None:

        async def one(
            client: ApiClient,
        ) -> tuple[Mapping[str, Any], list[dict[str, Any]], dict[str, Any]]:
            job = await resolve_job(client, args.job)
            return job, await client.nodes(), await client.events()

        job, nodes, events = run_with_client(args, one)
        hints = job_hints(events.get("events") or (), str(job.get("job_id")))
        if args.json:
            print_json({**job, "hints": hints})
        else:
            rows = job_detail(job, hostnames(nodes), time.time())
            rows += [("Hint" if i == 0 else "", h["message"]) for i, h in enumerate(hints)]
            for label, value in rows:
                print(f"{label:<9} {value}")
        return 0
    jobs, nodes = run_with_client(args, _jobs_and_nodes)
    if args.json:
        print_json(jobs)
    elif not jobs:
        print("no jobs")
    else:
        out = console()
        out.print(jobs_table(jobs, hostnames(nodes), time.time(), out.width))
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    nodes = run_with_client(args, lambda c: c.nodes())
    if args.json:
        print_json(nodes)
    else:
        out = console()
        out.print(nodes_table(nodes, out.width))
    return 0


async def resolve_job(client: ApiClient, text: str) -> Mapping[str, Any]:
    """The job ``text`` names, as ``GET /v1/jobs`` lists it (see :mod:`agent.operator.resolve`); a
    whole id that is no longer listed (an ended job, retired: ``agent.mesh.retiring``) is asked
    for."""
    jobs = await client.jobs()
    wanted = text.strip().lower()
    if len(wanted) == 32 and not any(j.get("job_id") == wanted for j in jobs):
        with contextlib.suppress(ApiError):
            return await client.job(wanted)
    return pick_job(jobs, text)


async def resolve_node(client: ApiClient, text: str) -> Mapping[str, Any]:
    """The node ``text`` names, as ``GET /v1/nodes`` lists it (see
    :mod:`agent.operator.resolve`)."""
    return pick_node(await client.nodes(), text)


def _show(args: argparse.Namespace, answer: Mapping[str, Any], text: str) -> int:
    if args.json:
        print_json(answer)
    else:
        print(text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    async def call(client: ApiClient) -> dict[str, Any]:
        job = await resolve_job(client, args.job)
        return await client.cancel(str(job["job_id"]))

    answer = run_with_client(args, call)
    state = answer.get("state")
    if state not in {s.value for s in TERMINAL_JOB_STATES}:  # the agent answers once it stopped
        raise UserError(f"{answer.get('job_id')}: not cancelled: the job is {state or 'unknown'}")
    return _show(args, answer, f"{answer.get('job_id')}: {state}")


def cmd_migrate(args: argparse.Namespace) -> int:
    async def call(client: ApiClient) -> tuple[dict[str, Any], str | None]:
        jobs, nodes = await _jobs_and_nodes(client)
        job = pick_job(jobs, args.job)
        target_name = None
        target = None
        if args.to is not None:
            names = hostnames(nodes)
            node = pick_node(nodes, args.to)
            check_migration_target(node, job, names)
            target = str(node["node_id"])
            target_name = names.get(target, short(target))
        answer = await client.migrate(str(job["job_id"]), target)
        return answer, target_name

    answer, target_name = run_with_client(args, call)
    where = f" to {target_name}" if target_name else ""
    return _show(args, answer, f"{answer.get('job_id')}: {answer.get('state', '?')}{where}")


def _node_command(
    args: argparse.Namespace, send: Callable[[ApiClient, str], Awaitable[dict[str, Any]]]
) -> int:
    async def call(client: ApiClient) -> dict[str, Any]:
        node = await resolve_node(client, args.node)
        return await send(client, str(node["node_id"]))

    answer = run_with_client(args, call)
    return _show(args, answer, f"{short(answer.get('node'))}: {answer.get('drain', '?')}")


def cmd_cordon(args: argparse.Namespace) -> int:
    return _node_command(args, lambda c, node: c.cordon(node))


def cmd_drain(args: argparse.Namespace) -> int:
    return _node_command(args, lambda c, node: c.drain(node, args.grace))


def cmd_undrain(args: argparse.Namespace) -> int:
    return _node_command(args, lambda c, node: c.undrain(node))


def _revoked_id(nodes: Sequence[Mapping[str, Any]], text: str) -> str:
    """A node to revoke: as any command names one, or a full node id the mesh no longer lists
    (a host that is gone can still be revoked)."""
    if NODE_ID_RE.fullmatch(text) and not any(n.get("node_id") == text for n in nodes):
        return text
    return str(pick_node(nodes, text)["node_id"])


def cmd_revoke(args: argparse.Namespace) -> int:
    from agent.operator.revocations import publish, revoke_nodes
    from gossip.identity import load_cluster

    directory = args.identity or default_cluster_dir()
    try:
        cluster = load_cluster(directory)
    except IdentityError as exc:
        raise UserError(f"revoking needs the cluster CA directory ({directory}): {exc}") from None

    async def call(client: ApiClient) -> tuple[list[str], str | None]:
        nodes = await client.nodes()
        node_ids = [_revoked_id(nodes, name) for name in args.node]
        signed = revoke_nodes(cluster, set(node_ids))
        return node_ids, await publish(client, signed)

    node_ids, refused = run_with_client(args, call)
    if refused is not None:
        raise UserError(f"revocation signed and saved, but the mesh refused it: {refused}")
    answer = {"revoked": node_ids}
    return _show(args, answer, "revoked " + ", ".join(short(n) for n in node_ids))
