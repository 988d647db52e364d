"""``shoal bootstrap``'s arguments: the command line, and the TUI's add-host form that builds one.

Kept apart from :mod:`agent.cli.bootstrap_cmd` so that building the ``shoal`` parser (which every
``shoal agent`` does) imports neither asyncssh nor rich.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from agent.bootstrap.service import SERVICE_KINDS
from agent.common.errors import UserError

DEFAULT_JOBS = 8
DEFAULT_PLATFORMS = ("manylinux2014_x86_64", "manylinux2014_aarch64")
"""The platforms ``--build-wheelhouse`` downloads wheels for unless ``--platform`` says."""
DEFAULT_PYTHON_VERSION = "3.11"


HOSTS_FILE_HELP = """\
A first fleet, from the folder of 'shoal init':
  shoal bootstrap --accept-new root@10.0.0.1 root@10.0.0.2 root@10.0.0.3
Every host's agent joins through the others (and the fleet set up before, from fleet.toml in the
cluster folder, or --join); the run succeeds once every host sees every other. The fleet's
addresses are then kept in fleet.toml, so 'shoal submit', 'shoal nodes'... need no --agent.
Shoal run from a checkout ships its own wheel and dependencies (no index needed).

--hosts-file FILE: one [[host]] table per host; every key but address is optional:
  [[host]]
  address = "root@gpu-01.lab:22"   # user@host[:port], as on the command line
  listen = "0.0.0.0:7946"          # the agent's HOST:PORT (default 0.0.0.0:7946)
  advertise = "10.0.0.21"          # what peers dial (default: the address SSH reached)
  labels = { team = "vision" }     # free-form labels, shown and used for affinity
  zone = "rack-a"                  # failure domain
  python = "/usr/bin/python3.12"   # the interpreter to build the venv from (3.11+)
  remote_dir = "/srv/shoal"        # where Shoal lives there (default ~/.local/share/shoal,
                                   #   /opt/shoal for root)
  sim = "h100:2"                   # simulated GPUs instead of probing (demos, tests)
  sim_seed = 3
"""


def add_bootstrap_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = HOSTS_FILE_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("hosts", nargs="*", metavar="user@host[:port]", help="hosts to set up")
    parser.add_argument(
        "--hosts-file", type=Path, metavar="FILE", help="a TOML file of [[host]] (below)"
    )
    parser.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="an agent already in the mesh: the new agents join through it and bootstrap "
        "confirms the join there (repeatable; default: the agents of fleet.toml, if any)",
    )
    parser.add_argument(
        "--accept-new",
        action="store_true",
        help="trust the key of a host known_hosts has no key for, and record it (as ssh's "
        "StrictHostKeyChecking=accept-new); a changed key is still refused",
    )
    parser.add_argument(
        "--identity",
        type=Path,
        metavar="DIR",
        default=None,
        help="the cluster directory of shoal init (CA and your operator identity)",
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="DIR",
        help="install from these wheels (uploaded; pip --no-index); default: Shoal run from a "
        "checkout ships its own wheel and dependencies, an installed Shoal comes from the index",
    )
    parser.add_argument(
        "--index-url", metavar="URL", help="install from this package index (even from a checkout)"
    )
    parser.add_argument(
        "--shoal-version",
        metavar="VERSION",
        default=None,
        help="the Shoal version to install (default: the version running here)",
    )
    parser.add_argument(
        "--system-site-packages",
        action="store_true",
        help="let the venv use the packages of the interpreter it is built from (even when that "
        "is itself a venv) and install Shoal alone, without its dependencies",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help=f"hosts at once (default {DEFAULT_JOBS}); also the number of running nodes "
        "upgraded at once (default 1: a rolling upgrade)",
    )
    parser.add_argument("--uninstall", action="store_true", help="remove Shoal, revoke the node")
    parser.add_argument(
        "--upgrade",
        action="store_true",
        help="reinstall and restart even when the host already runs this version",
    )
    parser.add_argument(
        "--known-hosts",
        type=Path,
        default=None,
        metavar="FILE",
        help="known_hosts file to check host keys against (default ~/.ssh/known_hosts)",
    )
    parser.add_argument(
        "--ssh-key", type=Path, action="append", default=[], metavar="FILE", help="a private key"
    )
    parser.add_argument(
        "--remote-dir",
        metavar="DIR",
        help="where Shoal lives on the hosts (default ~/.local/share/shoal, /opt/shoal for root)",
    )
    parser.add_argument(
        "--python", metavar="PATH", help="the interpreter on the hosts to build the venv from"
    )
    parser.add_argument(
        "--service",
        choices=("auto", *SERVICE_KINDS),
        default="auto",
        help="how to keep the agent running (default: systemd, launchd or a supervised process)",
    )
    parser.add_argument(
        "--no-wait", action="store_true", help="do not wait for the nodes to join the mesh"
    )
    parser.add_argument(
        "--join-timeout", type=float, default=120.0, metavar="S", help="wait this long to join"
    )
    parser.add_argument(
        "--cert-days", type=int, default=365, metavar="N", help="node certificate lifetime"
    )
    parser.add_argument(
        "--drain-grace", type=float, default=60.0, metavar="S", help="grace for draining jobs"
    )
    parser.add_argument(
        "--build-wheelhouse", type=Path, metavar="DIR", help="prepare a wheelhouse and exit"
    )
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="TAG",
        help=f"target platform for --build-wheelhouse (default {', '.join(DEFAULT_PLATFORMS)})",
    )
    parser.add_argument(
        "--target-python",
        default=DEFAULT_PYTHON_VERSION,
        metavar="X.Y",
        help="Python version the wheelhouse targets",
    )


class _WordsParser(argparse.ArgumentParser):
    """The ``shoal bootstrap`` parser for words that do not come from a shell: no ``--help``, and
    a mistake raises :class:`UserError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def parse_bootstrap_args(words: Sequence[str]) -> argparse.Namespace:
    """``shoal bootstrap``'s arguments from a list of words, exactly as the command line reads
    them (the TUI's add-host form builds such a list); a mistake raises :class:`UserError`."""
    parser = _WordsParser(prog="shoal bootstrap", add_help=False)
    add_bootstrap_arguments(parser)
    return parser.parse_args(list(words))
