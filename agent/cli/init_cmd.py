"""``shoal init``: create a cluster CA and the operator's identity, the cluster's first admin
(version 1 of the team policy names them, in team ``default``; :mod:`agent.operator.people`)."""

from __future__ import annotations

import argparse
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from agent.common.errors import UserError
from gossip.identity import IdentityError, init_cluster


def run_init(*, directory: Path, name: str, operator: str | None) -> int:
    from agent.operator.people import first_policy, person_name

    operator_name = operator or socket.gethostname()
    try:
        cluster = init_cluster(directory, name, operator_name, datetime.now(UTC))
        first_policy(cluster, operator_name, time.time())
    except IdentityError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {directory}: {exc.strerror or exc}") from None
    print(f"Created cluster {cluster.name!r} in {directory}")
    print(f"  CA sha256  {cluster.ca_fingerprint}")
    print(f"  operator   {cluster.operator.node_id}")
    print(f"  admin      {person_name(operator_name)} (team default; add people: shoal user add)")
    print("Keep this directory safe: ca.key and node.key never leave it.")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    return run_init(directory=args.dir, name=args.name, operator=args.operator)
