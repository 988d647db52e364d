"""What a bootstrap run is given and gives back, and one host's run in progress.

:class:`BootstrapOptions` (everything a run needs besides the hosts), :class:`HostWiring` (where a
host sits in the mesh), :class:`HostResult` (what happened on one host, in one line), the
:class:`Reporter` progress goes to, and :class:`HostRun`: one host's connection, what was learned of
it so far, and the undo stack :func:`agent.bootstrap.runner.bootstrap_host` rolls back on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from agent.bootstrap.hosts import HostSpec
from agent.bootstrap.install import InstallSource
from agent.bootstrap.layout import RemoteLayout
from agent.bootstrap.probe import HostFacts
from agent.bootstrap.ssh import BootstrapError, Remote, SshOptions
from gossip.identity import ClusterIdentity


class Reporter(Protocol):
    """Where progress goes (the rich display, or nothing in tests)."""

    def step(self, host: str, text: str) -> None: ...


class QuietReporter:
    def step(self, host: str, text: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    """Everything a run needs besides the hosts."""

    cluster: ClusterIdentity
    source: InstallSource
    ssh: SshOptions
    join: tuple[str, ...] = ()
    """Agents of the mesh already running (``--join``, else the fleet file's)."""
    fleet_dir: Path | None = None
    """The cluster folder whose ``fleet.toml`` remembers the agents set up (None: not written)."""
    remote_dir: str | None = None
    python: str | None = None
    service: str = "auto"
    force_reinstall: bool = False
    wait: bool = True
    join_timeout_s: float = 120.0
    cert_valid_for: timedelta = timedelta(days=365)
    drain_grace_s: float = 60.0
    drain_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class HostResult:
    """What happened on one host; ``message`` is the one line shown for it."""

    host: str
    ok: bool
    action: str
    message: str
    node_id: str | None = None
    os: str | None = None
    arch: str | None = None
    python: str | None = None
    gpu_drivers: str | None = None
    gpus: str | None = None
    service: str | None = None
    base: str | None = None
    changes: tuple[str, ...] = ()
    address: str | None = None
    """Where the agent's API answers (``HOST:PORT``), as peers and the operator reach it."""
    notes: tuple[str, ...] = ()
    """Things done that the operator should know of (a host key trusted on first sight)."""
    warnings: tuple[str, ...] = ()
    """Things left that the operator should act on (an agent that will not survive a reboot)."""
    new_host_key: str | None = None
    """The fingerprint of a host key known_hosts has no entry for, which stopped this host (the
    TUI offers to trust it: ``--accept-new``)."""


@dataclass(frozen=True, slots=True)
class HostWiring:
    """Where one host sits in the mesh, decided once every host of the run is reached
    (:func:`agent.bootstrap.wiring.plan_wiring`)."""

    address: str
    """Where its API answers (``HOST:PORT``)."""
    seeds: tuple[str, ...] = ()
    """Its config's ``join``: agents of the existing mesh and other hosts of this run."""
    existing: tuple[str, ...] = ()
    """Agents of the mesh that run already (not of this run): the join is confirmed there."""
    others: tuple[str, ...] = ()
    """The other hosts of this run."""

    @property
    def mesh(self) -> tuple[str, ...]:
        """Agents to send commands through (drain, revoke), this host's own last."""
        return (*self.existing, *self.others, self.address)


@dataclass
class HostRun:
    """One host's run: its connection, the undo stack and what was learned so far."""

    spec: HostSpec
    reporter: Reporter
    remote: Remote | None = None
    undo: list[tuple[str, Callable[[], Awaitable[None]]]] = field(default_factory=list)
    facts: HostFacts | None = None
    python: str | None = None
    layout: RemoteLayout | None = None
    kind: str | None = None
    node_id: str | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def peer_ip(self) -> str | None:
        return self.remote.peer_ip if self.remote is not None else None

    def step(self, text: str) -> None:
        self.reporter.step(self.spec.name, text)

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()

    async def rollback(self) -> None:
        for what, action in reversed(self.undo):
            self.step(f"undoing: {what}")
            with contextlib.suppress(BootstrapError, OSError, asyncio.TimeoutError):
                await action()
        self.undo.clear()

    def failed(self, why: str) -> HostResult:
        facts = self.facts
        return HostResult(
            host=self.spec.name,
            ok=False,
            action="failed",
            message=why,
            node_id=self.node_id,
            os=facts.os if facts else None,
            arch=facts.arch if facts else None,
            python=self.python,
            gpu_drivers=facts.gpu_summary() if facts else None,
            base=self.layout.base if self.layout else None,
            notes=tuple(self.notes),
        )
