"""The agent's TOML config as bootstrap writes it (the keys of
``agent.daemon.config.AgentConfig``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tomli_w

from agent.bootstrap.hosts import DEFAULT_AGENT_PORT, HostSpec
from agent.bootstrap.layout import RemoteLayout

HEADER = "# Written by shoal bootstrap; rerunning it rewrites this file.\n"


def agent_config(
    spec: HostSpec, layout: RemoteLayout, join: Sequence[str], peer_ip: str | None = None
) -> dict[str, Any]:
    """The ``[agent]`` table for this host; ``join`` its seeds, ``peer_ip`` the address SSH
    reached it at."""
    table: dict[str, Any] = {
        "listen": spec.listen or f"0.0.0.0:{DEFAULT_AGENT_PORT}",
        "data_dir": layout.data_dir,
        "identity_dir": layout.identity_dir,
    }
    advertise = advertised_host(spec, peer_ip)
    if advertise:
        table["advertise"] = advertise
    if join:
        table["join"] = list(join)
    if spec.zone:
        table["zone"] = spec.zone
    if spec.sim:
        table["sim"] = spec.sim
    if spec.sim_seed is not None:
        table["sim_seed"] = spec.sim_seed
    if spec.labels:
        table["labels"] = dict(sorted(spec.labels.items()))
    return {"agent": table}


def _listen(spec: HostSpec) -> tuple[str, str]:
    host, _, port = (spec.listen or f"0.0.0.0:{DEFAULT_AGENT_PORT}").rpartition(":")
    return host.strip("[]"), port


def advertised_host(spec: HostSpec, peer_ip: str | None) -> str | None:
    """What peers dial to reach the agent, when it differs from the listen host: the hosts
    file's ``advertise``; else, for an agent listening on every interface, the address SSH
    connected to, resolved (an ``~/.ssh/config`` alias or a name only the operator's machine
    resolves would strand the node); None when ``listen`` names the host itself."""
    if spec.advertise:
        return spec.advertise
    listen_host, _ = _listen(spec)
    if listen_host and listen_host not in ("0.0.0.0", "::"):
        return None
    return peer_ip or spec.host


def render_config(
    spec: HostSpec, layout: RemoteLayout, join: Sequence[str], peer_ip: str | None = None
) -> bytes:
    return (HEADER + tomli_w.dumps(agent_config(spec, layout, join, peer_ip))).encode("utf-8")


def agent_address(spec: HostSpec, peer_ip: str | None = None) -> str:
    """``HOST:PORT`` where peers and the operator reach this agent's API."""
    listen_host, port = _listen(spec)
    host = advertised_host(spec, peer_ip) or listen_host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
