"""The agent's TOML config as bootstrap writes it (the keys of ``agent.config.AgentConfig``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tomli_w

from agent.bootstrap.hosts import DEFAULT_AGENT_PORT, HostSpec
from agent.bootstrap.layout import RemoteLayout

HEADER = "# Written by shoal bootstrap; rerunning it rewrites this file.\n"


def agent_config(spec: HostSpec, layout: RemoteLayout, join: Sequence[str]) -> dict[str, Any]:
    """The ``[agent]`` table for this host."""
    table: dict[str, Any] = {
        "listen": spec.listen or f"0.0.0.0:{DEFAULT_AGENT_PORT}",
        "data_dir": layout.data_dir,
        "identity_dir": layout.identity_dir,
    }
    advertise = spec.advertise or _advertise_default(spec)
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


def _advertise_default(spec: HostSpec) -> str | None:
    """Peers reach the agent by the name the operator used for SSH, unless listen names a host."""
    listen_host = (spec.listen or "").rpartition(":")[0].strip("[]")
    if listen_host and listen_host not in ("0.0.0.0", "::"):
        return None
    return spec.host


def render_config(spec: HostSpec, layout: RemoteLayout, join: Sequence[str]) -> bytes:
    return (HEADER + tomli_w.dumps(agent_config(spec, layout, join))).encode("utf-8")


def agent_address(spec: HostSpec) -> str:
    """``HOST:PORT`` where the operator can reach this agent's API."""
    listen = spec.listen or f"0.0.0.0:{DEFAULT_AGENT_PORT}"
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if spec.advertise:
        host = spec.advertise
    elif host in ("", "0.0.0.0", "::"):
        host = spec.host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
