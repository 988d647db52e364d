"""``shoal logs [-f] [--attempt N] JOB``: a job's output, every attempt under a header naming its
node and how it ended (a gang's: every member's, ``=== attempt N rank R on HOST (...) ===``;
followed, the members of its current attempt at once, each line after ``[rank R]``).

``-f`` on a job that has not started yet waits for it: it says on stderr why the job waits (and
again whenever the reason changes), then streams its output once it runs. A job that ends without
ever running (cancelled, failed to place) ends the wait with its reason.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from typing import Any

from agent.cli.ops_cmd import print_json_line, resolve_job, run_following
from agent.cli.tables import hostnames
from agent.common.errors import UserError
from agent.operator.client import ApiClient
from agent.operator.terminal import one_line, short

WAIT_POLL_S = 0.5
WAITING_STATES = ("pending", "placing")


def _reason(job: Mapping[str, Any]) -> str:
    state = str(job.get("state") or "?")
    why = job.get("reason")
    if state == "placing":
        return "placing: a node was chosen, the job is starting"
    return f"{state}: {one_line(str(why))}" if why else state


async def wait_until_started(client: ApiClient, job_id: str) -> dict[str, Any] | None:
    """Poll the job until it has left ``pending`` and ``placing``, saying on stderr why it waits
    (each new reason once); the job then, or None when it ended without running."""
    shown: str | None = None
    while True:
        job = await client.job(job_id)
        state = job.get("state")
        if state not in WAITING_STATES:
            if not job.get("attempts") and state != "running":
                print(f"job {short(job_id)} ended {_reason(job)} without running", file=sys.stderr)
                return None
            return job
        reason = _reason(job)
        if reason != shown:
            print(f"[shoal] job {short(job_id)} waits: {reason}", file=sys.stderr, flush=True)
            shown = reason
        await asyncio.sleep(WAIT_POLL_S)


def cmd_logs(args: argparse.Namespace) -> int:
    """Every attempt's log under a header naming its node and how it ended (or one attempt's,
    with ``--attempt``); ``-f`` waits for the job to start, then follows the current attempt."""

    async def call(client: ApiClient) -> None:
        job_id = str((await resolve_job(client, args.job))["job_id"])
        if args.follow and args.attempt is None and not await wait_until_started(client, job_id):
            return
        attempts = [a for a in (await client.job(job_id)).get("attempts") or []]
        if args.attempt is not None:
            if not any(a.get("attempt") == args.attempt for a in attempts):
                raise UserError(f"job {short(job_id)} has no attempt {args.attempt} on record")
            attempts = [a for a in attempts if a.get("attempt") == args.attempt]
        if not attempts:  # not started yet, or a job from before attempts were recorded
            await _print_log(client, job_id, args, None, None)
            return
        names = hostnames((await client.nodes()) if not args.json else [])
        newest = attempts[-1].get("attempt")
        members = [e for e in attempts if e.get("attempt") == newest and e.get("rank") is not None]
        together = args.follow and len(members) > 1  # a gang's members, followed at once
        for i, entry in enumerate(attempts):
            if together and entry in members:
                continue
            last = i == len(attempts) - 1
            await _print_log(client, job_id, args, entry, names, follow=args.follow and last)
        if together:
            await asyncio.gather(
                *(
                    _print_log(client, job_id, args, e, names, follow=True, tagged=True)
                    for e in members
                )
            )

    return run_following(args, call)


async def _print_log(
    client: ApiClient,
    job_id: str,
    args: argparse.Namespace,
    entry: Mapping[str, Any] | None,
    names: Mapping[str, str] | None,
    *,
    follow: bool = False,
    tagged: bool = False,
) -> None:
    """One attempt's log (one member's, for a gang) under its header; ``tagged``: each line
    after ``[rank R]``, as a gang's members are followed together."""
    attempt = None if entry is None else int(entry["attempt"])
    rank = None if entry is None else entry.get("rank")
    node = None if entry is None else str(entry.get("node") or "")
    if entry is not None and not args.json:
        how = entry.get("cause") or "running"
        if entry.get("cause") == "exit":
            how = f"exit {entry.get('exit_code')}"
        where = (names or {}).get(node or "", short(node))
        of = "" if rank is None else f" rank {rank}"
        print(f"=== attempt {attempt}{of} on {where} ({how}) ===", flush=True)
    member = node if rank is not None else None  # a gang's member: its node's part
    lines = client.logs(job_id, lines=args.lines, follow=follow, attempt=attempt, node=member)
    async for line in lines:
        if args.json:
            doc: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
            if rank is not None:
                doc["rank"] = rank
            doc["line"] = line
            print_json_line(doc)
        else:
            print(f"[rank {rank}] {line}" if tagged else line, flush=True)
