"""``shoal data stage``'s arguments (argparse only, as :mod:`agent.cli.ops_args`; the command runs
in :mod:`agent.cli.stage_cmd`). :func:`add_stage_parser` adds ``stage`` to the ``data`` group's
subcommands."""

from __future__ import annotations

import argparse
from typing import Any

from agent.cli.ops_args import NODE_HELP, add_agent_and_identity_arguments, add_json_argument


def add_stage_parser(sub: Any) -> argparse.ArgumentParser:
    """``sub``: the ``data`` group's ``add_subparsers()``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "stage",
        help="have nodes fetch a dataset now: from the members that hold it, or --from a URL",
    )
    stage_arguments(p)
    return p


def stage_arguments(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)
    add_json_argument(p, "each node's stage as JSON")
    p.add_argument(
        "dataset",
        metavar="NAME[@DIGEST]",
        help="the dataset; with @DIGEST (64 hex digits), that content, from the members holding it",
    )
    p.add_argument(
        "--nodes",
        required=True,
        nargs="+",
        metavar="NODE",
        help=f"where to stage it: {NODE_HELP}; several, space- or comma-separated",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        help="an http(s):// file or index page, or s3://BUCKET/PREFIX (the agents' AWS_*"
        " environment says where and as whom)",
    )
    p.add_argument(
        "--cancel",
        action="store_true",
        help="stop the stage on those nodes instead (what they fetched stays held)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="show progress until every node has it (or failed); Ctrl-C stops waiting, not"
        " the stage",
    )
