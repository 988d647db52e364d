"""``shoal events [-f] [--json]``: the mesh-wide event log, from ``GET /v1/events?since=N``.

The agent answers ``{"events": [...], "next": N}``, oldest first, at most a page at a time;
``next`` is the cursor to ask from. Its sequence numbers are that agent's own, so one command
polls one agent. ``-f`` keeps polling every :data:`POLL_S` seconds until Ctrl-C (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from agent.cli.ops_cmd import print_json_line, run_following
from agent.cli.tables import event_header, event_row, hostnames
from agent.operator.client import ApiClient
from agent.operator.terminal import line_width

POLL_S = 1.0
MAX_PAGES = 1000
"""Pages read at once before printing (an agent keeps at most a few pages of events)."""


async def read_new(client: ApiClient, since: int) -> tuple[list[dict[str, Any]], int]:
    """Every event after ``since`` and the cursor to ask from next."""
    events: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        answer = await client.events(since)
        page = list(answer.get("events") or [])
        since = int(answer.get("next", since))
        events += page
        if not page:
            break
    return events, since


class _Printer:
    """Prints events as table rows or JSON lines; looks up node names as new nodes appear."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.width = line_width()
        self.names: dict[str, str] = {}
        self.header_done = False

    async def names_for(self, client: ApiClient, events: Sequence[Mapping[str, Any]]) -> None:
        if any(str(e.get("node")) not in self.names for e in events):
            self.names.update(hostnames(await client.nodes()))

    def print(self, events: Sequence[Mapping[str, Any]]) -> None:
        if self.as_json:
            for event in events:
                print_json_line(event)
            return
        if not self.header_done:
            print(event_header(self.width))
            self.header_done = True
        for event in events:
            print(event_row(event, self.names, self.width))
        print(end="", flush=True)


def cmd_events(args: argparse.Namespace) -> int:
    printer = _Printer(args.json)

    async def call(client: ApiClient) -> None:
        events, since = await read_new(client, 0)
        if not args.json and not events and not args.follow:
            print("no events")
            return
        await printer.names_for(client, events)
        printer.print(events)
        while args.follow:
            await asyncio.sleep(POLL_S)
            events, since = await read_new(client, since)
            if events:
                await printer.names_for(client, events)
                printer.print(events)

    return run_following(args, call)
