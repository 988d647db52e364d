"""``shoal probe``: this host's GPUs (:mod:`agent.cli.probe_view` draws them)."""

from __future__ import annotations

import argparse


def cmd_probe(args: argparse.Namespace) -> int:
    from agent.cli.probe_view import run_probe

    return run_probe(
        root=args.root,
        sim=args.sim,
        as_json=args.json,
        watch=args.watch,
        interval_s=args.interval,
    )
