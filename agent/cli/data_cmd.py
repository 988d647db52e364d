"""``shoal data``: datasets as the mesh sees them, and the operator's commands on them.

``ls`` and ``where`` read ``GET /v1/nodes`` (each node's ``dataset_versions``, from its gossiped
``place`` record); ``add``, ``evict``, ``pin`` and ``unpin`` are signed commands (``data_add``...)
carried out by the node they name, one command per node.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from agent.cli.ops_cmd import print_json, run_with_client
from agent.cli.tables import hostnames
from agent.common.errors import UserError
from agent.operator.client import ApiClient, ApiError
from agent.operator.resolve import pick_node
from agent.operator.terminal import short
from agent.operator.units import fmt_bytes
from agent.wire.place import dataset_name_problem, parse_dataset_ref


def cmd_data(args: argparse.Namespace) -> int:
    run = {
        "add": _add,
        "ls": _ls,
        "where": _where,
        "evict": _on_nodes,
        "pin": _on_nodes,
        "unpin": _on_nodes,
        "stage": _stage,
    }[args.data_command]
    return run(args)


def _stage(args: argparse.Namespace) -> int:
    from agent.cli.stage_cmd import cmd_stage

    return cmd_stage(args)


def _ref(text: str) -> str:
    try:
        return str(parse_dataset_ref(text))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _add(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "path": args.path}
    names: dict[str, str] = {}

    async def call(client: ApiClient) -> dict[str, Any]:
        listed = await client.nodes()
        names.update(hostnames(listed))
        if args.node is not None:
            body["node"] = str(pick_node(listed, args.node)["node_id"])
        return await client.command("data_add", body)

    if (problem := dataset_name_problem(args.name)) is not None:
        raise UserError(problem)
    answer = run_with_client(args, call)
    if args.json:
        print_json(answer)
    else:
        print(
            f"{answer['name']}@{answer['digest'][:12]}: {fmt_bytes(answer['total_bytes'])}"
            f" indexed on {names.get(str(answer['node'])) or short(str(answer['node']))}"
        )
    return 0


def copies(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, version, node): the mesh's copies, largest datasets first."""
    names = hostnames(nodes)
    rows: list[dict[str, Any]] = []
    for node in nodes:
        node_id = str(node["node_id"])
        versions = node.get("dataset_versions") or []
        for v in versions:
            rows.append(
                {
                    "name": v["name"],
                    "digest": v["digest"],
                    "node": node_id,
                    "host": names.get(node_id, node_id[:8]),
                    "total_bytes": v["total_bytes"],
                    "held_bytes": v["held_bytes"],
                    "created_s": v["created_s"],
                }
            )
        if not versions:  # an agent that predates versions: names and sizes only
            for name, size in (node.get("datasets") or {}).items():
                rows.append(
                    {
                        "name": name,
                        "digest": None,
                        "node": node_id,
                        "host": names.get(node_id, node_id[:8]),
                        "total_bytes": size,
                        "held_bytes": size,
                        "created_s": None,
                    }
                )
    rows.sort(key=lambda r: (r["name"], -(r["created_s"] or 0), r["digest"] or "", r["host"]))
    return rows


def by_version(
    rows: Sequence[dict[str, Any]],
) -> dict[tuple[str, str | None], list[dict[str, Any]]]:
    """The rows of :func:`copies` grouped by (dataset, version), in their order."""
    out: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["name"], r["digest"]), []).append(r)
    return out


def held_pct(row: Mapping[str, Any]) -> str:
    """How much of a version a copy holds: ``100%``, ``40%``."""
    total = int(row["total_bytes"])
    return "100%" if total <= 0 else f"{100 * int(row['held_bytes']) // total}%"


def _ls(args: argparse.Namespace) -> int:
    rows = copies(run_with_client(args, lambda c: c.nodes()))
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no datasets")
        return 0
    print(f"{'DATASET':<20} {'VERSION':<12} {'SIZE':>9}  COPIES")
    for (name, digest), held in by_version(rows).items():
        size = max(int(r["total_bytes"]) for r in held)
        where = ", ".join(f"{r['host']} {held_pct(r)}" for r in held)
        print(f"{name:<20} {(digest or '-')[:12]:<12} {fmt_bytes(size):>9}  {where}")
    return 0


def _where(args: argparse.Namespace) -> int:
    ref = parse_dataset_ref(_ref(args.dataset))
    rows = [
        r
        for r in copies(run_with_client(args, lambda c: c.nodes()))
        if r["name"] == ref.name and ref.digest in (None, r["digest"])
    ]
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        raise UserError(f"{ref}: no node holds it")
    for r in rows:
        held = f"{fmt_bytes(r['held_bytes'])} of {fmt_bytes(r['total_bytes'])}"
        print(f"{r['host']:<20} {(r['digest'] or '-')[:12]:<12} {held} ({held_pct(r)})")
    return 0


def _on_nodes(args: argparse.Namespace) -> int:
    ref = _ref(args.dataset)
    kind = f"data_{args.data_command}"

    names: dict[str, str] = {}

    async def call(client: ApiClient) -> list[dict[str, Any]]:
        nodes = await client.nodes()
        names.update(hostnames(nodes))
        targets = [str(pick_node(nodes, n)["node_id"]) for n in args.nodes]
        out: list[dict[str, Any]] = []
        for node in dict.fromkeys(targets):
            try:
                out.append(await client.command(kind, {"node": node, "dataset": ref}))
            except ApiError as exc:
                out.append({"node": node, "error": str(exc)})
        return out

    answers = run_with_client(args, call)

    def name(node: object) -> str:
        return names.get(str(node)) or short(str(node))

    if args.json:
        print_json(answers)
    else:
        for a in answers:
            if "error" not in a:
                done = next(v for k, v in a.items() if k != "node")
                print(f"{name(a['node'])}: {args.data_command} {len(done)} version(s)")
    refused = [f"{name(a['node'])}: {a['error']}" for a in answers if "error" in a]
    if refused:
        raise UserError("; ".join(refused))
    return 0
