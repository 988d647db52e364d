"""A standalone gossip member, for operators debugging a mesh and for the process-level tests.

``python -m gossip --identity DIR [--listen HOST:PORT] [--join HOST:PORT ...] [--max-streams N]
[--probe-rings K]``

Prints one JSON object per line on stdout: first ``{"event": "listening", ...}``, then one line
per membership event, and on SIGUSR1 (or every ``--report-s``) a ``{"event": "view", ...}`` line
with the members it holds and their states, and its counters (``stats``: refusals included, as
``GossipNode.stats`` names them). SIGTERM or SIGINT leaves the mesh gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from gossip.tls import import_aiohttp_without_system_cas, shrink_tls_read_buffers

import_aiohttp_without_system_cas()  # before anything imports aiohttp: no system CA bundle

from gossip.addresses import split_address  # noqa: E402
from gossip.certtrust import CertTrust  # noqa: E402
from gossip.events import Event  # noqa: E402
from gossip.identity import IdentityError, load_identity  # noqa: E402
from gossip.node import GossipNode  # noqa: E402
from gossip.streamparts import StreamLimits  # noqa: E402


def _emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _event_line(event: Event) -> dict[str, object]:
    fields = {k: getattr(event, k) for k in getattr(event, "__slots__", ())}
    line: dict[str, object] = {"event": type(event).__name__}
    for key, value in fields.items():
        line[key] = (
            value if isinstance(value, str | int | float | bool) or value is None else str(value)
        )
    return line


def _view(node: GossipNode) -> dict[str, object]:
    return {
        "event": "view",
        "node": node.node_id,
        "members": {m.node: m.state.name.lower() for m in node.members()},
        "streams_open": node.open_streams,
        "stats": node.stats(),
    }


async def _run(args: argparse.Namespace) -> int:
    shrink_tls_read_buffers()
    identity = load_identity(args.identity)
    trust = CertTrust(identity.ca_certificate)
    host, port = split_address(args.listen, allow_any_port=True)
    limits = StreamLimits(max_streams=args.max_streams) if args.max_streams else None
    node = GossipNode(
        identity,
        trust,
        host=host,
        port=port,
        seeds=args.join,
        stream_limits=limits,
        probe_rings=args.probe_rings,
    )
    node.subscribe(lambda event: _emit(_event_line(event)))
    await node.start()
    _emit({"event": "listening", "node": node.node_id, "addr": node.address})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if hasattr(signal, "SIGUSR1"):
        loop.add_signal_handler(signal.SIGUSR1, lambda: _emit(_view(node)))
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=args.report_s)
            except TimeoutError:
                _emit(_view(node))
    finally:
        await node.stop(leave=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gossip", description=__doc__)
    parser.add_argument("--identity", type=Path, required=True, metavar="DIR")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    parser.add_argument("--join", action="append", default=[], metavar="HOST:PORT")
    parser.add_argument("--report-s", type=float, default=1.0, metavar="S")
    parser.add_argument(
        "--max-streams", type=int, default=None, metavar="N", help="streams held at most"
    )
    parser.add_argument(
        "--probe-rings",
        type=int,
        default=None,
        metavar="K",
        help="probe and gossip over K rings (0: every member in turn)",
    )
    args = parser.parse_args()
    try:
        return asyncio.run(_run(args))
    except IdentityError as exc:
        print(f"gossip: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
