"""``shoal history``'s arguments (argparse and the standard library only: see :mod:`agent.cli`)."""

from __future__ import annotations

import argparse
import re

from agent.cli.ops_args import add_agent_and_identity_arguments

_SPAN = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
MAX_SINCE_S = 366 * 86_400


def span_s(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``1h``, ``2d``, ``1w`` as seconds (at least 1, at most a year)."""
    match = _SPAN.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a span: say 90s, 15m, 1h, 2d or 1w")
    seconds = int(float(match.group(1)) * _UNIT_S[match.group(2)])
    if not 1 <= seconds <= MAX_SINCE_S:
        raise argparse.ArgumentTypeError(f"{text!r}: between 1 second and a year (366d)")
    return seconds


def history_arguments(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)
    p.add_argument(
        "target",
        metavar="NODE|JOB",
        nargs="?",
        help="a node (id, prefix or host name) or a job (id or prefix): whose history",
    )
    p.add_argument(
        "--fleet",
        action="store_true",
        help="every node instead: GPU utilization (busy, allocated) by vendor and by model, and "
        "the GPU-hours left idle while jobs that could use them waited",
    )
    p.add_argument(
        "--series",
        action="append",
        metavar="NAME",
        help="a series or a prefix of series (gpu, gpu.util_pct, host.cpu_pct, job); repeatable "
        "or comma-separated; default all",
    )
    p.add_argument("--device", metavar="KEY|INDEX", help="one device of the node")
    p.add_argument(
        "--since", type=span_s, default=3600, metavar="SPAN", help="how far back (default 1h)"
    )
    p.add_argument("--step", type=span_s, metavar="SPAN", help="between points (default: fits)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the agent's answer as JSON")
    out.add_argument("--csv", action="store_true", help="one row per point: CSV for scripts")
