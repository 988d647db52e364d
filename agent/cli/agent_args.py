"""``shoal agent``'s arguments, kept apart from :mod:`agent.daemon.agent_cmd` so that building the
``shoal`` parser (``shoal --help``, every argument error) imports none of the agent's modules."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML config file")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve on")
    parser.add_argument("--advertise", metavar="HOST", help="host peers should reach us at")
    parser.add_argument(
        "--join", action="append", metavar="HOST:PORT", help="a seed agent (repeatable)"
    )
    parser.add_argument("--data-dir", type=Path, metavar="DIR", help="store, jobs and logs")
    parser.add_argument("--identity", type=Path, metavar="DIR", help="node.key/node.crt/ca.crt")
    parser.add_argument("--sim", metavar="PROFILE", help="simulate GPUs (demo, h100:2, ...)")
    parser.add_argument("--sim-seed", type=int, metavar="N", help="seed of the simulated devices")
    parser.add_argument(
        "--label", action="append", metavar="KEY=VALUE", help="a label (repeatable)"
    )
    parser.add_argument("--name", metavar="NAME", help="how operators see this host")
    parser.add_argument("--zone", metavar="ZONE", help="failure domain / rack label")
    parser.add_argument(
        "--datasets-dir",
        type=Path,
        metavar="DIR",
        help="a folder whose entries are datasets this host holds (gossiped with their sizes)",
    )
    parser.add_argument(
        "--datasets-rescan-s",
        type=float,
        metavar="S",
        help="how often the datasets folder is scanned again (default 60)",
    )
    parser.add_argument(
        "--content-link-bytes-per-s",
        type=float,
        metavar="B",
        help="the most bytes/s content is fetched at from any one holder (default 0: no cap)",
    )
    parser.add_argument(
        "--no-prefetch",
        dest="prefetch",
        action="store_false",
        default=None,
        help="fetch no waiting job's datasets ahead of its start (staging at the start stays)",
    )
    parser.add_argument(
        "--job-user",
        metavar="USER",
        help='user jobs run as (root agents: default shoal-job, else nobody; "" the agent\'s own)',
    )
    parser.add_argument(
        "--container-runtime",
        choices=("podman", "docker", "none"),
        help="what runs jobs that name an image (default: podman if found, else docker)",
    )
    parser.add_argument(
        "--uv", type=Path, metavar="PATH", help="the uv that builds jobs' Python environments"
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="DIR",
        help="build jobs' Python environments from these wheels only (no index)",
    )
    parser.add_argument(
        "--index-url", metavar="URL", help="the package index jobs' environments are built from"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
