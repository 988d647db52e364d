"""The operator commands' arguments: submit, jobs, nodes, events, logs, cancel, migrate, cordon,
drain, undrain, revoke, and the manual enrollment (enroll, certify).

Only argparse and the standard library here: ``shoal --help`` and every argument error build
these parsers without loading aiohttp, cryptography or rich (:mod:`agent.cli`). The commands
themselves live in :mod:`agent.cli.ops_cmd`, :mod:`agent.cli.events_cmd` and
:mod:`agent.cli.enroll_cmd`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agent.common.paths import default_cluster_dir

AGENT_ENV = "SHOAL_AGENT"
JOB_HELP = "a job id or a unique prefix of one (as 'shoal jobs' shows it)"
NODE_HELP = "a node id, a unique prefix of one, or a host name (as 'shoal nodes' shows it)"


def add_agent_and_identity_arguments(
    parser: argparse.ArgumentParser, agent_flag: str = "--agent"
) -> None:
    """Which agent to talk to, and as which operator (shared with ``shoal tui``)."""
    parser.add_argument(
        agent_flag,
        dest="agent",
        metavar="HOST:PORT",
        default=os.environ.get(AGENT_ENV),
        help=f"any agent of the mesh (default: ${AGENT_ENV})",
    )
    parser.add_argument(
        "--identity",
        type=Path,
        metavar="DIR",
        default=None,
        help="your operator identity (default: the cluster directory of shoal init)",
    )


def add_json_argument(
    parser: argparse.ArgumentParser, what: str = "JSON instead of a table"
) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what}")


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(parser)
    add_json_argument(parser)


def submit_arguments(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)
    add_json_argument(p, "the agent's answer as JSON")
    p.add_argument("--file", type=Path, metavar="JOB.toml", help="a TOML job file")
    p.add_argument(
        "--gpus",
        type=_gpu_count,
        default=None,
        metavar="N",
        help="GPUs per node (default: none, the job runs on any host; 1 when --mem or a GPU "
        "--backend says what each GPU must be); a fraction such as 0.5 asks for that share of "
        "one GPU's memory, on a GPU other shares may use too; a range such as 2-8 makes an "
        "elastic job on one node, given as many as fit",
    )
    p.add_argument(
        "--gpu-mem",
        metavar="SIZE",
        help="a share of one GPU by its memory, e.g. 10GiB (instead of a fractional --gpus)",
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes for a gang job")
    p.add_argument("--mem", metavar="SIZE", help="least memory per GPU, e.g. 40GiB")
    p.add_argument("--backend", metavar="LIST", help="accepted backends, e.g. cuda,rocm")
    p.add_argument(
        "--kind", choices=("training", "inference", "batch"), default="batch", help="job kind"
    )
    p.add_argument("--priority", type=int, default=0, help="higher runs first")
    p.add_argument("--preemptible", action="store_true", help="may be preempted")
    p.add_argument("--deadline", metavar="DURATION", help="finish within, e.g. 2h")
    p.add_argument(
        "--on-late",
        choices=("queue", "refuse"),
        default=None,
        help="a deadline the mesh cannot meet: queue with a warning (default) or refuse",
    )
    p.add_argument("--max-runtime", metavar="DURATION", help="stop an attempt after")
    p.add_argument("--dataset", action="append", default=[], help="a dataset it reads")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--label", action="append", default=[], metavar="K=V")
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="a checkpoint folder you manage on shared storage (not copied); default: Shoal's "
        "own, moved with the job",
    )
    p.add_argument(
        "--image",
        metavar="REF",
        help="run the command in this container image (podman or docker on the runner; "
        "e.g. registry.example:5000/team/train:1.2)",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        type=Path,
        help="send this folder with the job (less .git and what .gitignore and .shoalignore "
        "leave out): the job starts inside its copy on the runner",
    )
    p.add_argument(
        "--workdir-max",
        metavar="SIZE",
        default="512MiB",
        help="refuse a --workdir folder larger than this (default 512MiB)",
    )
    p.add_argument(
        "--python-lock",
        metavar="FILE",
        help="a uv.lock in --workdir (its pyproject.toml beside it): the runner builds its "
        "environment once per node and runs the job with it activated",
    )
    p.add_argument(
        "--python-requirements",
        metavar="FILE",
        help="a requirements file in --workdir, built into the job's environment likewise",
    )
    p.add_argument("--retries", type=int, default=0, help="further attempts on failure")
    p.add_argument(
        "--anyway",
        action="store_true",
        help="submit even when no node of the mesh could run it (it waits for such a host)",
    )
    p.add_argument(
        "--job-id",
        metavar="ID",
        help="submit under this id (32 hex digits): a submission whose answer was lost is sent "
        "again without making a second job",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def listing_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p)


def jobs_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p)
    p.add_argument(
        "job",
        metavar="JOB",
        nargs="?",
        help=JOB_HELP + "; shows that job in detail (a gang: its members)",
    )


def events_arguments(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)
    add_json_argument(p, "one JSON object per event (JSON lines)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events")


def logs_arguments(p: argparse.ArgumentParser) -> None:
    add_agent_and_identity_arguments(p)
    add_json_argument(p, 'one JSON object per line of output ({"line": ...})')
    p.add_argument("job", metavar="JOB", help=JOB_HELP)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    p.add_argument("-n", "--lines", type=int, default=100, help="lines from the end")
    p.add_argument(
        "--attempt",
        type=int,
        metavar="N",
        help="only attempt N (default: every attempt, each under a header)",
    )


def cancel_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p)
    p.add_argument("job", metavar="JOB", help=JOB_HELP)


def migrate_arguments(p: argparse.ArgumentParser) -> None:
    cancel_arguments(p)
    p.add_argument("--to", metavar="NODE", help=f"where to move it: {NODE_HELP}")


def node_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p)
    p.add_argument("node", metavar="NODE", help=NODE_HELP)


def drain_arguments(p: argparse.ArgumentParser) -> None:
    node_arguments(p)
    p.add_argument("--grace", type=float, default=300.0, metavar="S", help="grace period")


def revoke_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p)
    p.add_argument("node", metavar="NODE", nargs="+", help=f"{NODE_HELP}, or a full node id")


def enroll_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir", type=Path, required=True, metavar="DIR", help="this node's identity folder"
    )
    p.add_argument(
        "--name", metavar="NAME", help="this host's DNS name in the certificate (default: hostname)"
    )
    p.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="HOST",
        help="an address peers reach this host at (an IP or a DNS name; repeatable)",
    )
    p.add_argument(
        "--install", type=Path, metavar="CERT", help="install the certificate shoal certify made"
    )
    p.add_argument(
        "--ca",
        type=Path,
        metavar="CA.crt",
        help="the cluster's CA certificate (needed unless CERT bundles it)",
    )
    add_json_argument(p, "one JSON object")


def certify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("request", type=Path, metavar="REQUEST", help="a node.csr from shoal enroll")
    p.add_argument(
        "--out",
        type=Path,
        metavar="CERT",
        help="where to write the certificate and the CA's (default: REQUEST with .crt)",
    )
    p.add_argument("--days", type=int, default=365, metavar="N", help="lifetime (default 365)")
    p.add_argument(
        "--identity",
        type=Path,
        metavar="DIR",
        default=default_cluster_dir(),
        help="the cluster directory of shoal init, with the CA (default: %(default)s)",
    )
    add_json_argument(p, "one JSON object")


def _gpu_count(text: str) -> int | float | str:
    """``--gpus``: a whole number of GPUs, a fraction of one (``0.5``), or a range (``2-8``: an
    elastic job, which the spec reads)."""
    if "-" in text.strip().lstrip("-"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of GPUs: {text!r}") from None
    return int(value) if value.is_integer() else value
