"""``shoal usage``: GPU-hours and energy by day and by team, user or GPU model, summed over
every live agent's own rows (:mod:`agent.operator.usage`)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
import time
from typing import Any

from agent.cli.ops_cmd import operator_identity, run_with_client
from agent.common.errors import UserError
from agent.operator.client import ApiClient, ApiError
from agent.operator.usage import grand_total, since_s, totals
from agent.wire.codec import WireError
from agent.wire.usage import UsageDoc, UsageRow
from gossip.identity import NodeIdentity


async def _gather(
    client: ApiClient, args: argparse.Namespace, since: float
) -> tuple[list[UsageRow], list[str]]:
    identity, _ = operator_identity(args)
    return await gather_usage(client, identity, since)


async def gather_usage(
    client: ApiClient, identity: NodeIdentity, since: float
) -> tuple[list[UsageRow], list[str]]:
    """Every live agent's rows since ``since`` (the one asked answers for itself), and the
    agents that did not answer, one line each (the TUI's usage view reads the same)."""
    nodes = await client.nodes()
    live = [
        n
        for n in nodes
        if n.get("state") in ("alive", "suspect") and n.get("role") in ("agent", None)
    ]
    params = {"since": str(int(since))}

    async def ask(addr: str) -> UsageDoc:
        async with ApiClient(identity, addr) as other:
            return UsageDoc.decode(await other.get("/v1/usage", params))

    answers = await asyncio.gather(
        *(ask(str(n["addr"])) for n in live if n.get("addr")), return_exceptions=True
    )
    rows: list[UsageRow] = []
    missing: list[str] = []
    for node, answer in zip([n for n in live if n.get("addr")], answers, strict=True):
        if isinstance(answer, ApiError | WireError | OSError):
            missing.append(f"{str(node['node_id'])[:8]}: {answer}")
        elif isinstance(answer, BaseException):
            raise answer
        else:
            rows += answer.rows
            if answer.truncated:
                missing.append(f"{str(node['node_id'])[:8]}: answered its newest rows only")
    return rows, missing


def cmd_usage(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since = since_s(args.since, now)
    except ValueError as exc:
        raise UserError(str(exc)) from None

    async def call(client: ApiClient) -> tuple[list[UsageRow], list[str]]:
        return await _gather(client, args, since)

    rows, missing = run_with_client(args, call)
    found = totals(rows, args.by, since, now)
    total = grand_total(found)
    for line in missing:
        print(f"shoal: usage without {line}", file=sys.stderr)
    key = args.by or "all"
    if args.json:
        doc: dict[str, Any] = {
            "since": since,
            "until": now,
            "by": key,
            "rows": [t.to_wire() for t in found],
            "total": total.to_wire(),
            "missing": missing,
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    if args.csv:
        out = csv.writer(sys.stdout)
        out.writerow(["day", key, "gpu_hours", "energy_kwh", "attempts"])
        for t in found:
            w = t.to_wire()
            energy = "" if w["energy_kwh"] is None else w["energy_kwh"]
            out.writerow([t.day, t.key, w["gpu_hours"], energy, t.attempts])
        return 0
    # The table: a key column only when grouped (--by), and the last row named as the total.
    head = ["DAY", *([key.upper()] if args.by else []), "GPU-HOURS", "ENERGY kWh", "ATTEMPTS"]
    table = [
        [
            "total" if t is total else t.day,
            *([("" if t is total else t.key)] if args.by else []),
            f"{t.gpu_s / 3600:.2f}",
            _kwh(t.energy_j),
            str(t.attempts),
        ]
        for t in [*found, total]
    ]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    for r in [head, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _kwh(energy_j: float | None) -> str:
    return "N/A" if energy_j is None else f"{energy_j / 3.6e6:.3f}"
