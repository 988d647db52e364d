"""Operator commands of the CLI: submit, jobs, nodes, logs, cancel, drain, cordon, undrain, migrate.

Each runs one request through :class:`agent.client.ApiClient` as the operator's identity and prints
a rich table (or ``--json``). Every failure an operator can cause or meet is one line.

rich is imported where a table is drawn: every ``shoal agent`` builds this module's parsers, and
an agent never draws one (rich is ~1 MB of an agent's memory it would never use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.client import ApiClient, ApiError
from agent.errors import UserError
from agent.jobspec import JobSpec, check_job_id, new_job_id
from agent.paths import default_cluster_dir
from gossip.identity import IdentityError, load_identity

if TYPE_CHECKING:
    from rich.table import Table

AGENT_ENV = "SHOAL_AGENT"


# -- connection options ----------------------------------------------------------------------------


def add_agent_and_identity_arguments(
    parser: argparse.ArgumentParser, agent_flag: str = "--agent"
) -> None:
    """Which agent to talk to, and as which operator (shared with ``shoal tui``)."""
    parser.add_argument(
        agent_flag,
        dest="agent",
        metavar="HOST:PORT",
        default=os.environ.get(AGENT_ENV),
        help=f"any agent of the mesh (default: ${AGENT_ENV})",
    )
    parser.add_argument(
        "--identity",
        type=Path,
        metavar="DIR",
        default=None,
        help="your operator identity (default: the cluster directory of shoal init)",
    )


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _client(args: argparse.Namespace) -> ApiClient:
    if not args.agent:
        raise UserError(f"no agent to talk to: pass --agent HOST:PORT or set ${AGENT_ENV}")
    directory = args.identity or default_cluster_dir()
    if not (directory / "node.key").exists():
        raise UserError(
            f"no operator identity in {directory}: run 'shoal init' first or pass --identity DIR"
        )
    try:
        identity = load_identity(directory)
    except IdentityError as exc:
        raise UserError(f"cannot load your identity from {directory}: {exc}") from None
    try:
        return ApiClient(identity, args.agent)
    except ValueError as exc:
        raise UserError(f"--agent: {exc}") from None


def _run(args: argparse.Namespace, call: Callable[[ApiClient], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        async with _client(args) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except ApiError as exc:
        raise UserError(str(exc)) from None


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# -- formatting ------------------------------------------------------------------------------------


def short(node_or_job: str | None, width: int = 8) -> str:
    return (node_or_job or "-")[:width]


def _age(seconds_since: float | None, now: float) -> str:
    if seconds_since is None:
        return "-"
    s = max(0.0, now - seconds_since)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def jobs_table(jobs: Sequence[dict[str, Any]], hostnames: dict[str, str], now: float) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (
        ("Job", "left"),
        ("State", "left"),
        ("Kind", "left"),
        ("GPUs", "right"),
        ("Node", "left"),
        ("Age", "right"),
        ("Done", "right"),
        ("Command / why", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=name != "Command / why")  # type: ignore[arg-type]
    for job in jobs:
        spec = job.get("spec") or {}
        resources = spec.get("resources") or {}
        gpus = f"{resources.get('gpus_per_node', '?')}"
        if resources.get("nodes", 1) != 1:
            gpus += f"x{resources['nodes']}"
        progress = job.get("progress")
        runner = job.get("runner")
        why = job.get("reason") if job.get("state") == "pending" else None
        table.add_row(
            short(job.get("job_id")),
            str(job.get("state", "?")),
            str(spec.get("kind", "-")),
            gpus,
            hostnames.get(runner or "", short(runner)),
            _age(job.get("submitted_at"), now),
            "-" if progress is None else f"{100 * float(progress):.0f}%",
            why or " ".join(spec.get("command") or []),
        )
    return table


def nodes_table(nodes: Sequence[dict[str, Any]]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("Host", no_wrap=True)
    table.add_column("Node", no_wrap=True)
    table.add_column("State", no_wrap=True)
    table.add_column("Drain", no_wrap=True)
    table.add_column("GPUs", overflow="fold")
    table.add_column("Util", justify="right", no_wrap=True)
    table.add_column("Jobs", justify="right", no_wrap=True)
    for node in nodes:
        devices = node.get("devices") or []
        names: dict[str, int] = {}
        for device in devices:
            name = str(device.get("name", "?")).removesuffix(" (simulated)")
            names[name] = names.get(name, 0) + 1
        utils = [d["util_pct"] for d in devices if d.get("util_pct") is not None]
        host = node.get("host") or {}
        table.add_row(
            str(host.get("hostname") or "-"),
            short(node.get("node_id")),
            str(node.get("state", "?")),
            str(node.get("drain", "-")),
            ", ".join(f"{n}x {name}" for name, n in names.items()) or "-",
            f"{sum(utils) / len(utils):.0f}%" if utils else "N/A",
            str(len(node.get("running_jobs") or [])),
        )
    return table


# -- commands --------------------------------------------------------------------------------------


def _spec_from_args(args: argparse.Namespace) -> JobSpec:
    if args.file is not None:
        try:
            text = args.file.read_text()
        except OSError as exc:
            raise UserError(f"--file {args.file}: {exc.strerror or exc}") from None
        if args.command:
            raise UserError("give the command either in --file or after --, not both")
        return JobSpec.from_toml(text)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("no command to run: shoal submit [options] -- COMMAND [ARGS...]")
    resources: dict[str, Any] = {"gpus_per_node": args.gpus, "nodes": args.nodes}
    if args.mem is not None:
        resources["min_mem_per_gpu_bytes"] = args.mem
    if args.backend:
        resources["backends"] = [b.strip() for b in args.backend.split(",") if b.strip()]
    data: dict[str, Any] = {
        "command": command,
        "resources": resources,
        "kind": args.kind,
        "priority": args.priority,
        "preemptible": args.preemptible,
        "datasets": args.dataset,
        "retries": args.retries,
        "env": dict(_pairs(args.env, "--env")),
        "labels": dict(_pairs(args.label, "--label")),
    }
    if args.deadline is not None:
        data["deadline"] = args.deadline
    if args.max_runtime is not None:
        data["max_runtime_s"] = args.max_runtime
    if args.checkpoint_dir is not None:
        data["checkpoint_dir"] = args.checkpoint_dir
    return JobSpec.from_human(data)


def _pairs(values: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} {value!r}: expected KEY=VALUE")
        out.append((key, val))
    return out


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec = _spec_from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    job_id = new_job_id()
    answer = _run(args, lambda c: c.submit(spec, job_id))
    if args.json:
        _print_json(answer)
    else:
        copies = answer.get("replicas", "?")
        print(
            f"submitted {answer.get('job_id', job_id)} "
            f"(owner {short(answer.get('owner'))}, durable on {copies} agents)"
        )
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    async def call(client: ApiClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await client.jobs(), await client.nodes()

    from rich.console import Console

    jobs, nodes = _run(args, call)
    if args.json:
        _print_json(jobs)
        return 0
    hostnames = {n["node_id"]: (n.get("host") or {}).get("hostname", "") for n in nodes}
    hostnames = {k: v or short(k) for k, v in hostnames.items()}
    if not jobs:
        print("no jobs")
    else:
        Console().print(jobs_table(jobs, hostnames, time.time()))
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    from rich.console import Console

    nodes = _run(args, lambda c: c.nodes())
    if args.json:
        _print_json(nodes)
    else:
        Console().print(nodes_table(nodes))
    return 0


def _job_arg(value: str) -> str:
    try:
        return check_job_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_logs(args: argparse.Namespace) -> int:
    async def call(client: ApiClient) -> None:
        async for line in client.logs(args.job_id, lines=args.lines, follow=args.follow):
            print(line, flush=True)

    _run(args, call)
    return 0


def _show(args: argparse.Namespace, answer: dict[str, Any], text: str) -> int:
    if args.json:
        _print_json(answer)
    else:
        print(text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    answer = _run(args, lambda c: c.cancel(args.job_id))
    return _show(args, answer, f"{args.job_id}: {answer.get('state', '?')}")


def cmd_migrate(args: argparse.Namespace) -> int:
    answer = _run(args, lambda c: c.migrate(args.job_id, args.to))
    return _show(args, answer, f"{args.job_id}: {answer.get('state', '?')}")


def _node_command(kind: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        async def call(client: ApiClient) -> dict[str, Any]:
            node = await _resolve_node(client, args.node)
            if kind == "drain":
                return await client.drain(node, args.grace)
            return await (client.cordon(node) if kind == "cordon" else client.undrain(node))

        answer = _run(args, call)
        return _show(args, answer, f"{short(answer.get('node'))}: {answer.get('drain', '?')}")

    return run


async def _resolve_node(client: ApiClient, name: str) -> str:
    """A node id from a node id, a unique prefix of one, or a hostname."""
    nodes = await client.nodes()
    exact = [n["node_id"] for n in nodes if n.get("node_id") == name]
    if exact:
        return str(exact[0])
    matches = {
        str(n["node_id"])
        for n in nodes
        if str(n.get("node_id", "")).startswith(name)
        or (n.get("host") or {}).get("hostname") == name
    }
    if len(matches) == 1:
        return matches.pop()
    if not matches:
        raise ApiError(404, f"no node named {name!r} in the mesh")
    raise ApiError(409, f"{name!r} names {len(matches)} nodes; give more of the node id")


def cmd_revoke(args: argparse.Namespace) -> int:
    from agent.revocations import publish, revoke_nodes
    from gossip.identity import load_cluster

    directory = args.identity or default_cluster_dir()
    try:
        cluster = load_cluster(directory)
    except IdentityError as exc:
        raise UserError(f"revoking needs the cluster CA directory ({directory}): {exc}") from None

    async def call(client: ApiClient) -> tuple[list[str], str | None]:
        node_ids = [await _resolve_node(client, name) for name in args.node]
        signed = revoke_nodes(cluster, set(node_ids))
        return node_ids, await publish(client, signed)

    node_ids, refused = _run(args, call)
    if refused is not None:
        raise UserError(f"revocation signed and saved, but the mesh refused it: {refused}")
    answer = {"revoked": node_ids}
    return _show(args, answer, "revoked " + ", ".join(short(n) for n in node_ids))


def add_operator_commands(sub: Any) -> None:
    """Register the operator subcommands on the CLI's subparsers."""
    submit = sub.add_parser("submit", help="submit a job: shoal submit [options] -- COMMAND ...")
    add_connection_arguments(submit)
    submit.add_argument("--file", type=Path, metavar="JOB.toml", help="a TOML job file")
    submit.add_argument("--gpus", type=int, default=1, help="GPUs per node (0: CPU only)")
    submit.add_argument("--nodes", type=int, default=1, help="nodes for a gang job")
    submit.add_argument("--mem", metavar="SIZE", help="least memory per GPU, e.g. 40GiB")
    submit.add_argument("--backend", metavar="LIST", help="accepted backends, e.g. cuda,rocm")
    submit.add_argument(
        "--kind", choices=("training", "inference", "batch"), default="batch", help="job kind"
    )
    submit.add_argument("--priority", type=int, default=0, help="higher runs first")
    submit.add_argument("--preemptible", action="store_true", help="may be preempted")
    submit.add_argument("--deadline", metavar="DURATION", help="finish within, e.g. 2h")
    submit.add_argument("--max-runtime", metavar="DURATION", help="stop an attempt after")
    submit.add_argument("--dataset", action="append", default=[], help="a dataset it reads")
    submit.add_argument("--env", action="append", default=[], metavar="K=V")
    submit.add_argument("--label", action="append", default=[], metavar="K=V")
    submit.add_argument("--checkpoint-dir", metavar="DIR")
    submit.add_argument("--retries", type=int, default=0, help="further attempts on failure")
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    submit.set_defaults(func=cmd_submit)

    jobs = sub.add_parser("jobs", help="list the mesh's jobs")
    add_connection_arguments(jobs)
    jobs.set_defaults(func=cmd_jobs)

    nodes = sub.add_parser("nodes", help="list the mesh's nodes and their GPUs")
    add_connection_arguments(nodes)
    nodes.set_defaults(func=cmd_nodes)

    logs = sub.add_parser("logs", help="show a job's output")
    add_connection_arguments(logs)
    logs.add_argument("job_id", type=_job_arg)
    logs.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    logs.add_argument("-n", "--lines", type=int, default=100, help="lines from the end")
    logs.set_defaults(func=cmd_logs)

    for name, helptext, func in (
        ("cancel", "cancel a job", cmd_cancel),
        ("migrate", "stop a job and restart it elsewhere", cmd_migrate),
    ):
        p = sub.add_parser(name, help=helptext)
        add_connection_arguments(p)
        p.add_argument("job_id", type=_job_arg)
        if name == "migrate":
            p.add_argument("--to", metavar="NODE", help="the node to move it to")
        p.set_defaults(func=func)

    for name, helptext in (
        ("cordon", "place no new work on a node"),
        ("drain", "cordon a node and move its work off"),
        ("undrain", "make a node schedulable again"),
    ):
        p = sub.add_parser(name, help=helptext)
        add_connection_arguments(p)
        p.add_argument("node", help="node id (or a unique prefix) or hostname")
        if name == "drain":
            p.add_argument("--grace", type=float, default=300.0, metavar="S", help="grace period")
        p.set_defaults(func=_node_command(name))

    revoke = sub.add_parser("revoke", help="revoke nodes' certificates; the mesh shuns them")
    add_connection_arguments(revoke)
    revoke.add_argument("node", nargs="+", help="node id (or a unique prefix) or hostname")
    revoke.set_defaults(func=cmd_revoke)
