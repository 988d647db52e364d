"""``shoal agent``: run the agent daemon in the foreground until SIGTERM or Ctrl-C.

Prints one JSON line on stdout once it listens (``{"event": "listening", "node": ..., "addr":
...}``) so supervisors and tests can find it; everything else goes to the log on stderr, one line
per lifecycle event. Services run it as ``python -m agent.cli agent --config FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import signal
import sys

from agent.common.errors import UserError
from agent.daemon.config import AgentConfig, load_config, parse_label, with_overrides
from agent.storage.store import StoreError
from gossip.identity import IdentityError
from gossip.tls import shrink_tls_read_buffers


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    config = load_config(args.config) if args.config else AgentConfig()
    labels = dict(config.labels)
    for text in args.label or ():
        key, value = parse_label(text)
        labels[key] = value
    return with_overrides(
        config,
        listen=args.listen,
        advertise=args.advertise,
        join=tuple(args.join) if args.join else None,
        data_dir=args.data_dir,
        identity_dir=args.identity,
        sim=args.sim,
        sim_seed=args.sim_seed,
        name=args.name,
        zone=args.zone,
        datasets_dir=args.datasets_dir,
        datasets_rescan_s=args.datasets_rescan_s,
        content_link_bytes_per_s=args.content_link_bytes_per_s,
        prefetch=args.prefetch,
        job_user=args.job_user,
        container_runtime=args.container_runtime,
        uv=getattr(args, "uv", None),
        wheelhouse=getattr(args, "wheelhouse", None),
        index_url=getattr(args, "index_url", None),
        labels=labels,
    )


async def _serve(config: AgentConfig) -> int:
    from agent.daemon.daemon import Agent

    agent = Agent(config)
    if agent.is_revoked:
        # Exit 0: a service manager restarts a failed agent, and this one must stay down.
        sys.stderr.write(
            f"shoal agent: node {agent.node_id} is revoked (its kept revocation list says so); "
            "enroll it again with a new key to bring it back\n"
        )
        return 0
    await agent.start()
    # Everything made so far (modules, config, identity, the probe's inventory) lives as long as
    # the agent: out of the collector's sight, a full collection while the mesh forms costs ~1 ms
    # instead of ~25 ms of a busy moment.
    gc.freeze()
    sys.stdout.write(
        json.dumps({"event": "listening", "node": agent.node_id, "addr": agent.node.address}) + "\n"
    )
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:  # Windows
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    waiters = {asyncio.create_task(stop.wait()), asyncio.create_task(agent.revoked.wait())}
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    await agent.stop()
    if agent.revoked.is_set():
        sys.stderr.write(f"shoal agent: node {agent.node_id} was revoked; its jobs are stopped\n")
    return 0


def run_agent(args: argparse.Namespace) -> int:
    """The ``shoal agent`` command (its arguments: :mod:`agent.cli.agent_args`)."""
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    config = config_from_args(args)
    from agent.execution.executor import use_pidfd_child_watcher

    shrink_tls_read_buffers()
    use_pidfd_child_watcher()
    try:
        return asyncio.run(_serve(config))
    except (IdentityError, StoreError, ValueError) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:  # the listen address is taken or not ours
        raise UserError(f"cannot listen on {config.listen}: {exc.strerror or exc}") from None
