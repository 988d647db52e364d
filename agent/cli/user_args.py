"""``shoal user`` and ``shoal team`` arguments (argparse only, as :mod:`agent.cli.ops_args`).

On a person's own machine::

    shoal user request --dir DIR --name NAME     # their key + DIR/node.csr (the key stays)
    shoal user install --dir DIR NAME.crt        # then: shoal submit --identity DIR ...

On the admin's machine (the cluster directory with the CA)::

    shoal user add NAME --team TEAM --role admin|user|viewer --request node.csr
    shoal user ls | set NAME [--team T] [--role R] | revoke NAME | push
    shoal team set TEAM [--ceiling N|none] [--quota CLASS=GUARANTEED:MAX ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.cli.ops_args import add_agent_and_identity_arguments, add_json_argument
from agent.common.paths import default_cluster_dir

ROLES = ("admin", "user", "viewer")


def _json(p: argparse.ArgumentParser, what: str = "JSON instead of text") -> None:
    """``--json`` before or after the action (``shoal user --json ls``, ``shoal user ls
    --json``): the action's flag leaves the value alone when it is not given."""
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=f"print {what}")


def _cluster(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)  # --identity: the cluster directory of shoal init
    _json(p)


def user_arguments(p: argparse.ArgumentParser) -> None:
    add_json_argument(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    request = actions.add_parser("request", help="on your machine: your key and a request")
    request.add_argument("--dir", type=Path, required=True, metavar="DIR", help="your folder")
    request.add_argument("--name", required=True, metavar="NAME", help="your user name")
    _json(request, "one JSON object")

    install = actions.add_parser("install", help="on your machine: the certificate you were given")
    install.add_argument("--dir", type=Path, required=True, metavar="DIR", help="your folder")
    install.add_argument("install", type=Path, metavar="CERT", help="what 'shoal user add' wrote")
    install.add_argument("--ca", type=Path, metavar="CA.crt", help="unless CERT bundles it")
    _json(install, "one JSON object")

    add = actions.add_parser("add", help="admin: certify a person and add them to the policy")
    _cluster(add)
    add.add_argument("name", metavar="NAME")
    add.add_argument("--team", required=True, metavar="TEAM")
    add.add_argument("--role", required=True, choices=ROLES)
    add.add_argument(
        "--request", type=Path, required=True, metavar="CSR", help="their 'shoal user request'"
    )
    add.add_argument("--out", type=Path, metavar="CERT", help="default: NAME.crt")
    add.add_argument("--days", type=int, default=365, metavar="N", help="lifetime (default 365)")

    ls = actions.add_parser("ls", help="the people and teams of the policy the mesh holds")
    _cluster(ls)

    set_ = actions.add_parser("set", help="admin: change a person's team or role")
    _cluster(set_)
    set_.add_argument("name", metavar="NAME")
    set_.add_argument("--team", metavar="TEAM")
    set_.add_argument("--role", choices=ROLES)

    revoke = actions.add_parser("revoke", help="admin: revoke a person everywhere")
    _cluster(revoke)
    revoke.add_argument("name", metavar="NAME")

    push = actions.add_parser("push", help="admin: offer the saved policy to the mesh again")
    _cluster(push)


def _ceiling(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a priority: {text!r}") from None


def team_arguments(p: argparse.ArgumentParser) -> None:
    add_json_argument(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    set_ = actions.add_parser("set", help="admin: a team's priority ceiling and GPU quotas")
    _cluster(set_)
    set_.add_argument("name", metavar="TEAM")
    set_.add_argument(
        "--ceiling",
        type=_ceiling,
        metavar="N",
        default=argparse.SUPPRESS,
        help="highest priority its people submit at ('none': no team ceiling)",
    )
    set_.add_argument(
        "--quota",
        action="append",
        metavar="CLASS=G:M",
        help="GPUs guaranteed and at most, of a model class or 'any' (repeatable; replaces all)",
    )


def usage_arguments(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)
    p.add_argument(
        "--by", choices=("team", "user", "model"), help="one row per day and team, user or model"
    )
    p.add_argument(
        "--since",
        default="30d",
        metavar="WHEN",
        help="how far back: 30d, 12h, 90m or a date YYYY-MM-DD (default: 30d)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    out.add_argument("--csv", action="store_true", help="print CSV instead of a table")


__all__ = ["default_cluster_dir", "team_arguments", "usage_arguments", "user_arguments"]
