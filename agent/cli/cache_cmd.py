"""``shoal cache``: what each node keeps in its content store: datasets, images, Python
environments and working folders, with sizes, how much is held, pins and last use (``--json``:
each node's ``/v1/cache`` answer). Every live node is asked itself, at its own address, as the
operator; a node that cannot be reached is listed with why."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from agent.cli.ops_cmd import operator_identity, print_json, run_with_client
from agent.cli.tables import hostnames
from agent.operator.client import AgentUnreachable, ApiClient, ApiError
from agent.operator.resolve import pick_node
from agent.operator.terminal import relative, short
from agent.operator.units import fmt_bytes

KIND_TITLES = {
    "dataset": "dataset",
    "image": "image",
    "env": "environment",
    "workdir": "folder",
    "checkpoint": "checkpoint",
}


async def _one(args: argparse.Namespace, node: dict[str, Any]) -> dict[str, Any]:
    identity, _ = operator_identity(args)
    addr = node.get("addr")
    if not addr:
        return {"node": node["node_id"], "error": "no address known"}
    client = ApiClient(identity, str(addr))
    try:
        async with client:
            return await client.get("/v1/cache")
    except (AgentUnreachable, ApiError) as exc:
        return {"node": node["node_id"], "error": str(exc)}


def cmd_cache(args: argparse.Namespace) -> int:
    names: dict[str, str] = {}

    async def call(client: ApiClient) -> list[dict[str, Any]]:
        listed = await client.nodes()
        names.update(hostnames(listed))
        nodes = [
            n for n in listed if n.get("state") == "alive" and n.get("role") in (None, "agent")
        ]
        if args.node:  # an id, a prefix of one or a host name, as every command takes a node
            nodes = [dict(pick_node(nodes, args.node))]
        nodes.sort(key=lambda n: names.get(str(n["node_id"]), ""))
        return list(await asyncio.gather(*(_one(args, n) for n in nodes)))

    docs = run_with_client(args, call)
    if args.json:
        print_json({"nodes": docs})
        return 0
    now = time.time()
    for doc in docs:
        node_id = str(doc.get("node", ""))
        name = f"{names.get(node_id, short(node_id))} ({short(node_id)})"
        if "error" in doc:
            print(f"{name}  unreachable: {doc['error']}")
            continue
        print(
            f"{name}  store {fmt_bytes(doc.get('store_bytes'))}"
            f" of {fmt_bytes(doc.get('budget_bytes'))}"
        )
        for item in doc.get("items", []):
            held, total = int(item["held_bytes"]), int(item["total_bytes"])
            part = "" if held >= total else f" ({fmt_bytes(held)} held)"
            used = item.get("last_use_s")
            last = "never used" if not used else f"used {relative(min(float(used), now), now)}"
            pin = "  pinned" if item.get("pinned") else ""
            print(
                f"  {KIND_TITLES.get(item['kind'], item['kind']):<11} {item['name']:<24}"
                f" {item['digest'][:12]}  {fmt_bytes(total)}{part}  {last}{pin}"
            )
    return 0
