"""The fleet the CLI talks to, remembered in the cluster folder as ``fleet.toml``.

As kubectl keeps its contexts, ``shoal bootstrap`` writes down every agent it set up and saw in
the mesh, and every command uses them when neither ``--agent`` nor ``$SHOAL_AGENT`` names one,
trying them in order until one answers (:mod:`agent.operator.failover`)::

    # Written by shoal bootstrap: the agents of this cluster's fleet.
    [[agent]]
    address = "198.18.0.1:7946"   # where its API answers (HOST:PORT)
    node = "bbcoyqcykzzz52yipbn7kkc37h52sjr5"
    ssh = "root@198.18.0.1"       # how bootstrap reached the host

Only ``address`` is required; the file may be edited by hand. ``--uninstall`` removes a host's
entry. Standard library only: every command reads this file before it loads anything else.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.common.errors import UserError
from agent.common.parsing import toml_loads

FLEET_FILE = "fleet.toml"
HEADER = (
    "# Written by shoal bootstrap: the agents of this cluster's fleet. Commands talk to the first\n"
    "# that answers when neither --agent nor $SHOAL_AGENT names one.\n"
)


@dataclass(frozen=True, slots=True)
class FleetAgent:
    """One agent of the fleet: where its API answers, its node id, the SSH target of its host."""

    address: str
    node_id: str | None = None
    ssh: str | None = None

    def same_host(self, other: FleetAgent) -> bool:
        """The same agent: by node id when both know it, else by address or SSH target."""
        if self.node_id and other.node_id:
            return self.node_id == other.node_id
        return self.address == other.address or bool(self.ssh and self.ssh == other.ssh)


@dataclass(frozen=True, slots=True)
class Fleet:
    agents: tuple[FleetAgent, ...] = ()

    @property
    def addresses(self) -> list[str]:
        return [a.address for a in self.agents]

    def merged(self, new: Iterable[FleetAgent]) -> Fleet:
        """This fleet with ``new`` agents added, each replacing the entry of the same host."""
        agents = list(self.agents)
        for agent in new:
            agents = [a for a in agents if not a.same_host(agent)]
            agents.append(agent)
        return Fleet(tuple(agents))

    def without(self, gone: Iterable[FleetAgent]) -> Fleet:
        gone = list(gone)
        return Fleet(tuple(a for a in self.agents if not any(a.same_host(g) for g in gone)))


def fleet_path(cluster_dir: Path) -> Path:
    return cluster_dir / FLEET_FILE


def _agent(doc: object, where: str) -> FleetAgent:
    if not isinstance(doc, dict) or not isinstance(doc.get("address"), str):
        raise UserError(f'{where}: each [[agent]] needs address = "HOST:PORT"')
    unknown = sorted(set(doc) - {"address", "node", "ssh"})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} in [[agent]]")
    node, ssh = doc.get("node"), doc.get("ssh")
    if not isinstance(node, str | None) or not isinstance(ssh, str | None):
        raise UserError(f"{where}: node and ssh are strings")
    return FleetAgent(address=doc["address"], node_id=node, ssh=ssh)


def load_fleet(cluster_dir: Path) -> Fleet:
    """The fleet of ``cluster_dir``; empty when it has none yet. A broken file is a UserError."""
    path = fleet_path(cluster_dir)
    try:
        doc = toml_loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return Fleet()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    entries = doc.get("agent", [])
    if not isinstance(entries, list):
        raise UserError(f"{path}: agents are [[agent]] entries")
    return Fleet(tuple(_agent(e, str(path)) for e in entries))


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_fleet(agents: Sequence[FleetAgent]) -> str:
    lines = [HEADER.rstrip("\n")]
    for agent in agents:
        lines += ["", "[[agent]]", f"address = {_quoted(agent.address)}"]
        if agent.node_id:
            lines.append(f"node = {_quoted(agent.node_id)}")
        if agent.ssh:
            lines.append(f"ssh = {_quoted(agent.ssh)}")
    return "\n".join(lines) + "\n"


def save_fleet(cluster_dir: Path, fleet: Fleet) -> Path:
    """Write the fleet file atomically (a temporary name, then rename); returns its path."""
    path = fleet_path(cluster_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render_fleet(fleet.agents), "utf-8")
    tmp.replace(path)
    return path
