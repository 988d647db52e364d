"""``shoal data``'s arguments: add, ls, where, evict, pin, unpin (argparse only, as
:mod:`agent.cli.ops_args`; the commands run in :mod:`agent.cli.data_cmd`)."""

from __future__ import annotations

import argparse

from agent.cli.ops_args import NODE_HELP, add_connection_arguments
from agent.cli.stage_args import add_stage_parser

REF_HELP = "NAME (every version held there) or NAME@DIGEST (one version)"


def cache_arguments(p: argparse.ArgumentParser) -> None:
    """``shoal cache``'s (:mod:`agent.cli.cache_cmd`)."""
    add_connection_arguments(p)
    p.add_argument("--node", metavar="NODE", help=f"only this node: {NODE_HELP}")


def data_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    add = sub.add_parser("add", help="index a folder or file of an agent's host as a dataset")
    add_connection_arguments(add)
    add.add_argument("name", metavar="NAME", help="the dataset's name")
    add.add_argument("path", metavar="PATH", help="an absolute path on the agent's host")
    add.add_argument(
        "--node", metavar="NODE", help=f"{NODE_HELP} (default: the agent the command reaches)"
    )
    ls = sub.add_parser("ls", help="datasets, their versions, and where each copy is")
    add_connection_arguments(ls)
    where = sub.add_parser("where", help="the nodes that hold a dataset, and how much of it")
    add_connection_arguments(where)
    where.add_argument("dataset", metavar="DATASET", help=REF_HELP)
    for name, what in (
        ("evict", "delete a dataset's cached copies on nodes"),
        ("pin", "keep a dataset on nodes whatever the cache rules say"),
        ("unpin", "let the cache rules evict a dataset again"),
    ):
        q = sub.add_parser(name, help=what)
        add_connection_arguments(q)
        q.add_argument("dataset", metavar="DATASET", help=REF_HELP)
        q.add_argument("--nodes", nargs="+", required=True, metavar="NODE", help=NODE_HELP)
    add_stage_parser(sub)
