"""Talking to the mesh during bootstrap: is the node alive there, drain it before an upgrade."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from agent.operator.client import ApiClient, ApiError
from agent.operator.failover import NoAgentAnswered, first_answering
from gossip.identity import NodeIdentity

POLL_S = 0.5


async def find_node(client: ApiClient, node_id: str) -> dict[str, Any] | None:
    """The node's entry in the mesh as ``client``'s agent sees it, or None."""
    try:
        nodes = await client.nodes()
    except ApiError:
        return None
    return next((n for n in nodes if n.get("node_id") == node_id), None)


async def wait_alive(client: ApiClient, node_id: str, timeout_s: float) -> dict[str, Any] | None:
    """Poll until the node is alive in the mesh and has reported its inventory; None on timeout.

    Returns the last entry seen alive (devices may be empty on a host without GPUs) when the
    inventory does not arrive in time but the node is alive.
    """
    deadline = time.monotonic() + timeout_s
    alive: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        node = await find_node(client, node_id)
        if node is not None and node.get("state") == "alive":
            alive = node
            if node.get("host") is not None:
                return node
        await asyncio.sleep(POLL_S)
    return alive


async def wait_alive_via(
    identity: NodeIdentity, addresses: Sequence[str], node_id: str, timeout_s: float
) -> tuple[dict[str, Any] | None, str]:
    """:func:`wait_alive` through the first of ``addresses`` that answers (asked again until
    one does: a new agent may still be starting). Returns the node, or None and why not."""
    deadline = time.monotonic() + timeout_s
    why = f"asked {', '.join(addresses)}"
    while time.monotonic() < deadline:
        try:
            client = await first_answering(identity, addresses, what="the mesh")
        except NoAgentAnswered as exc:
            why = str(exc)
            await asyncio.sleep(POLL_S)
            continue
        async with client:
            node = await wait_alive(client, node_id, deadline - time.monotonic())
        if node is not None:
            return node, client.address
        why = f"{client.address} does not see it alive"
    return None, why


async def drain(client: ApiClient, node_id: str, grace_s: float, timeout_s: float) -> bool:
    """Drain the node and wait until it reports ``drained``; False when it did not in time."""
    await client.drain(node_id, grace_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node = await find_node(client, node_id)
        if node is not None and node.get("drain") == "drained":
            return True
        await asyncio.sleep(POLL_S)
    return False


async def undrain(client: ApiClient, node_id: str) -> None:
    await client.undrain(node_id)


def describe_devices(node: dict[str, Any]) -> str:
    """``2x NVIDIA H100 80GB HBM3, 1x Apple M2 Ultra``, or ``CPU only`` (a host's CPU, which
    the agent reports when it finds no accelerator, is no GPU)."""
    counts: dict[str, int] = {}
    devices = node.get("devices") or []
    for device in devices:
        if device.get("backend") == "cpu":
            continue
        name = str(device.get("name") or "?")
        counts[name] = counts.get(name, 0) + 1
    if not counts:
        return "CPU only" if devices else "no GPUs"
    return ", ".join(f"{n}x {name}" for name, n in counts.items())
