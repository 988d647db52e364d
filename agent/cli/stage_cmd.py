"""``shoal data stage NAME[@DIGEST] --nodes N1,N2 [--from URL] [--wait] [--json]``: an
operator-signed ``stage`` command; each named node fetches the dataset now (``NAME`` alone: the
newest version some node holds whole, as ``GET /v1/nodes`` lists them) and answers its
stage (state, bytes held of the total, rate, holders, ETA). ``--wait`` polls every
:data:`POLL_S` (the command with ``poll``: each node answers its stage as it stands and starts
none, so one that failed is reported, not started over) until every node is done or failed,
printing each node's line as it changes."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Mapping
from typing import Any, Final

from agent.cli.ops_cmd import print_json, run_with_client
from agent.cli.tables import hostnames
from agent.common.errors import UserError
from agent.operator.client import ApiClient
from agent.operator.resolve import pick_node
from agent.operator.terminal import short

POLL_S: Final = 2.0
MAX_WAIT_S: Final = 7 * 24 * 3600.0
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


def stage_body(dataset: str, source: str | None) -> dict[str, Any]:
    """The command's body without its nodes; a mistake is a one-line :class:`UserError`."""
    name, at, digest = dataset.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise UserError(f"{dataset!r}: the digest after @ must be 64 lowercase hex digits")
    if at and source is not None:
        raise UserError("give NAME@DIGEST (from members) or --from URL, not both")
    body: dict[str, Any] = {"name": name}
    if at:
        body["digest"] = digest
    elif source is not None:
        body["source"] = source
    return body


def newest_version(nodes: list[dict[str, Any]], name: str) -> str:
    """The digest ``NAME`` alone means: the newest version of it some node holds whole."""
    found: dict[str, float] = {}
    for node in nodes:
        for v in node.get("dataset_versions") or ():
            whole = v.get("held_bytes", 0) >= v.get("total_bytes", 1)
            if v.get("name") == name and whole and isinstance(v.get("digest"), str):
                found[v["digest"]] = max(found.get(v["digest"], 0.0), float(v["created_s"]))
    if not found:
        raise UserError(
            f"no node holds all of {name!r}: give NAME@DIGEST (see 'shoal data ls') or --from URL"
        )
    return max(found, key=lambda d: (found[d], d))


def _node_texts(values: list[str]) -> list[str]:
    return [t for v in values for t in v.split(",") if t]


def _line(node: Mapping[str, Any], state: Mapping[str, Any], names: Mapping[str, str]) -> str:
    text = state.get("line") or f"error: {state.get('error', '?')}"
    return f"{names.get(str(node)) or short(str(node))}: {text}"


def _ended(answer: Mapping[str, Any]) -> bool:
    nodes = answer.get("nodes", {})
    return all(
        ("error" in s and "state" not in s) or s.get("state") in ("done", "failed", "cancelled")
        for s in nodes.values()
    )


def cmd_stage(args: argparse.Namespace) -> int:
    body = stage_body(args.dataset, args.source)
    if args.cancel:
        if args.wait:
            raise UserError("--cancel and --wait do not go together")
        body["cancel"] = True

    names: dict[str, str] = {}

    async def call(client: ApiClient) -> dict[str, Any]:
        listed = await client.nodes()
        names.update(hostnames(listed))
        body["nodes"] = [str(pick_node(listed, t)["node_id"]) for t in _node_texts(args.nodes)]
        if "digest" not in body and "source" not in body and not args.cancel:
            body["digest"] = newest_version(listed, body["name"])
        answer = await client.command("stage", body)
        if not args.wait:
            return answer
        said: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MAX_WAIT_S
        while True:
            if not args.json:
                for node, state in answer.get("nodes", {}).items():
                    line = _line(node, state, names)
                    if said.get(node) != line:
                        print(line, flush=True)
                        said[node] = line
            if _ended(answer) or loop.time() > deadline:
                return answer
            await asyncio.sleep(POLL_S)
            answer = await client.command("stage", {**body, "poll": True})

    answer = run_with_client(args, call)
    if args.json:
        print_json(answer)
    elif not args.wait:
        for node, state in answer.get("nodes", {}).items():
            print(_line(node, state, names))
    failed = any(s.get("state") == "failed" or "state" not in s for s in answer["nodes"].values())
    return 1 if args.wait and failed else 0
