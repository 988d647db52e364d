"""``shoal init``: create a cluster CA and the operator's identity."""

from __future__ import annotations

import argparse
import socket
from datetime import UTC, datetime
from pathlib import Path

from agent.common.errors import UserError
from gossip.identity import IdentityError, init_cluster


def run_init(*, directory: Path, name: str, operator: str | None) -> int:
    try:
        cluster = init_cluster(directory, name, operator or socket.gethostname(), datetime.now(UTC))
    except IdentityError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {directory}: {exc.strerror or exc}") from None
    print(f"Created cluster {cluster.name!r} in {directory}")
    print(f"  CA sha256  {cluster.ca_fingerprint}")
    print(f"  operator   {cluster.operator.node_id}")
    print("Keep this directory safe: ca.key and node.key never leave it.")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    return run_init(directory=args.dir, name=args.name, operator=args.operator)
