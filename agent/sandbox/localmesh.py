"""A mesh of real agent processes on this machine: the demo, the benchmarks and the tests use it.

Creates a throwaway cluster (CA, an operator identity, one enrolled identity per agent) under a
folder, starts each agent as its own ``shoal agent`` process on a loopback port with a simulated
GPU profile, and stops every process it started, whatever happens.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

from agent.common.paths import source_root
from agent.execution.spawn import death_signal_launcher
from agent.operator.client import ApiClient, ApiError
from agent.sandbox.jobpython import JobPython, job_python
from gossip.identity import NodeIdentity, enroll_node, init_cluster

SEES_WAIT_S = 5
"""How long the agent holds one convergence watch (``/healthz?members=N``) before answering."""

DEMO_PROFILES: tuple[str, ...] = (
    "linux-a100",
    "linux-arm64-rx7900",
    "macos-m2-ultra",
    "windows-arc-a770",
    "h100:8",
    "mi300x:8",
    "l4:2",
    "h100:4",
)
"""The mix the demo cycles through: the four reference hosts with their OS and CPU architecture
(Linux x86-64 with 2x A100 in MIG mode, Linux arm64 with 4x RX 7900 XTX, macOS arm64 with an M2
Ultra, Windows x86-64 with an Arc A770: ``probers.sim.REFERENCE_HOSTS``), then 8-GPU NVLink and
xGMI baseboards and smaller NVIDIA hosts."""


SOURCE_ROOT = source_root()
"""The folder holding Shoal's packages (``agent``, ``gossip``, ``probers``)."""


@cache
def compile_sources(root: Path = SOURCE_ROOT) -> None:
    """Write the bytecode of the packages an agent imports under ``root``, once per process.

    The agents a mesh starts then read it instead of each compiling every module: where
    ``PYTHONDONTWRITEBYTECODE`` is set, or when they all start at once before any has written
    it. Compiling costs an agent ~0.15 s of CPU at start and ~1.4 MiB of resident memory for as
    long as it runs (the compiler's leftovers). A folder that cannot be written is left as is.
    """
    for package in ("agent", "gossip", "probers"):
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=2, workers=1)


def starting_max_here() -> int:
    """How many agents a machine starts at once: four a core. An agent's start (imports, keys,
    the first probe) costs ~0.3 s of a core, and 128 agents started at once on two cores kept
    both busy for as long as formation lasted, each new member slowing those already probing."""
    return 4 * (os.cpu_count() or 1)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (all held open while choosing)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class AgentProcess:
    index: int
    directory: Path
    address: str
    profile: str
    node_id: str
    process: subprocess.Popen[bytes] | None = None
    log_offset: int = 0
    """Where this start's part of ``agent.log`` begins (a restart appends to the same file)."""
    listened: bool = False
    """This start printed its listening line (once seen, its log is not read for it again)."""

    @property
    def log_path(self) -> Path:
        return self.directory / "agent.log"

    @property
    def datasets_dir(self) -> Path:
        """The datasets this simulated host holds: one entry per dataset."""
        return self.directory / "datasets"

    @property
    def config_path(self) -> Path:
        return self.directory / "agent.toml"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalMesh:
    """``nodes`` agents under ``root``; use as a context manager or call start/stop."""

    root: Path
    nodes: int
    profiles: Sequence[str] = DEMO_PROFILES
    host: str = "127.0.0.1"
    extra_args: Sequence[str] = ()
    placement: str | None = None
    """Every agent's ``placement`` (``fifo``, ``shoal``), through its config file; ``None``: the
    agents' default."""
    preempt_min_run_s: float | None = None
    """Every agent's ``preempt_min_run_s`` (with ``placement``); ``None``: the default."""
    starting_max: int = 0
    """At most this many agents starting at once (started, not yet listening); the rest start
    as those listen (:meth:`wait_listening`). 0: :func:`starting_max_here`."""
    agents: list[AgentProcess] = field(default_factory=list)
    operator: NodeIdentity | None = None
    started_at: float = 0.0
    last_up_at: float = 0.0
    _job_python: JobPython | None = field(default=None, repr=False)
    _unstarted: dict[int, AgentProcess] = field(default_factory=dict, repr=False)
    """Agents :meth:`start` has yet to start, by index, in order."""

    def job_python(self) -> JobPython:
        """The interpreter this mesh's jobs can run, as the agents' job user (found once:
        :func:`agent.sandbox.jobpython.job_python`)."""
        if self._job_python is None:
            self._job_python = job_python(self.root)
        return self._job_python

    def create(self) -> None:
        """The cluster CA, the operator identity and every agent's identity (no process yet)."""
        now = datetime.now(UTC)
        cluster = init_cluster(self.root / "cluster", "shoal-demo", "operator", now)
        self.operator = cluster.operator
        ports = free_ports(self.nodes, self.host)
        for i in range(self.nodes):
            directory = self.root / f"agent-{i:02d}"
            identity = enroll_node(
                cluster.ca, directory / "identity", "agent", [self.host], timedelta(days=7), now
            )
            self.agents.append(
                AgentProcess(
                    index=i,
                    directory=directory,
                    address=f"{self.host}:{ports[i]}",
                    profile=self.profiles[i % len(self.profiles)],
                    node_id=identity.node_id,
                )
            )
        if self.placement is not None:
            config = f'placement = "{self.placement}"\n'
            if self.preempt_min_run_s is not None:
                config += f"preempt_min_run_s = {self.preempt_min_run_s}\n"
            for agent in self.agents:
                agent.config_path.write_text(config)

    def command(self, agent: AgentProcess) -> list[str]:
        """How ``agent`` starts: where setpriv exists, armed to get SIGTERM (and leave the mesh,
        stopping its jobs) when the process that started it dies, however it dies: a demo or a
        benchmark killed with SIGKILL leaves no agent behind."""
        seeds = [a.address for a in self.agents[:2] if a is not agent]
        argv = [*death_signal_launcher("TERM"), sys.executable, "-m", "agent.cli", "agent"]
        argv += ["--listen", agent.address]
        if self.placement is not None:
            argv += ["--config", str(agent.config_path)]
        for seed in seeds:
            argv += ["--join", seed]
        argv += [
            "--data-dir",
            str(agent.directory),
            "--identity",
            str(agent.directory / "identity"),
            "--datasets-dir",
            str(agent.datasets_dir),
        ]
        model = agent.profile.split(":")[0].split(",")[0]
        argv += ["--sim", agent.profile, "--sim-seed", str(agent.index)]
        argv += ["--name", f"{model}-{agent.index:02d}", "--zone", f"rack-{'ab'[agent.index % 2]}"]
        argv += self.extra_args
        return argv

    def env(self, agent: AgentProcess) -> dict[str, str]:
        """The environment ``agent`` starts with (a benchmark may add to it)."""
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start_agent(self, agent: AgentProcess) -> None:
        """Start (or restart) one agent; its log is appended to."""
        compile_sources()
        agent.datasets_dir.mkdir(parents=True, exist_ok=True)
        with agent.log_path.open("ab") as log:
            agent.log_offset = log.tell()
            agent.listened = False
            agent.process = subprocess.Popen(
                self.command(agent),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(agent),
                start_new_session=True,
            )

    def start(self) -> None:
        """Start the agents: at most :attr:`starting_max` now, the others from
        :meth:`wait_listening` as those listen."""
        if not self.agents:
            self.create()
        self._unstarted = {a.index: a for a in self.agents}
        self._start_more()
        self.started_at = time.monotonic()

    def _start_more(self) -> None:
        """Start agents not started yet while fewer than :attr:`starting_max` are starting."""
        most = self.starting_max or starting_max_here()
        starting = sum(1 for a in self.agents if a.running and not _listening(a))
        while self._unstarted and starting < most:
            self.start_agent(self._unstarted.pop(next(iter(self._unstarted))))
            starting += 1

    def kill(self, agent: AgentProcess, sig: int = signal.SIGKILL) -> None:
        if agent.process is not None and agent.process.poll() is None:
            agent.process.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=10)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every agent, then SIGKILL whatever is left after ``grace_s``."""
        for agent in self.agents:
            if agent.running and agent.process is not None:
                agent.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for agent in self.agents:
            if agent.process is None:
                continue
            try:
                agent.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.process.pid, signal.SIGKILL)
                agent.process.wait(timeout=10)

    def __enter__(self) -> LocalMesh:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, index: int = 0, *, keepalive_s: float = 15.0) -> ApiClient:
        assert self.operator is not None, "create() first"
        return ApiClient(
            self.operator, self.agents[index].address, timeout_s=5.0, keepalive_s=keepalive_s
        )

    async def wait_listening(self, timeout_s: float | None = None) -> None:
        """Until every running agent has printed its ``listening`` line; sets ``last_up_at``.
        ``timeout_s`` (``None``: 120 s) runs from the last agent that began to listen: a large
        mesh, started a few agents at a time, takes as long as this machine needs, and a start
        that stalls fails.

        Ports are chosen before the agents bind them: an agent that found its port taken
        meanwhile (by any process's outgoing connection) is started again on another port.
        """
        stall_s = 120.0 if timeout_s is None else timeout_s
        deadline = time.monotonic() + stall_s
        pending = [a for a in self.agents if a.process is not None and not _listening(a)]
        pending += self._unstarted.values()  # never started: none is in pending yet
        restarts, most = 0, 3 * len(self.agents)

        def waits(a: AgentProcess) -> bool:
            """Still to listen: not started yet, running, or exited for its port with a restart
            left (it may exit between the restarts below and this look: it is restarted at the
            next)."""
            if a.index in self._unstarted:
                return True
            return not _listening(a) and (a.running or (_port_taken(a) and restarts < most))

        while pending and time.monotonic() < deadline:
            self._start_more()
            for a in pending:
                if a.index in self._unstarted:
                    continue
                if not a.running and _port_taken(a) and restarts < most:
                    restarts += 1
                    a.address = f"{self.host}:{free_ports(1, self.host)[0]}"
                    self.start_agent(a)
            still = [a for a in pending if waits(a)]
            if len(still) < len(pending):
                deadline = time.monotonic() + stall_s  # progress: the clock starts again
            pending = still
            if pending:
                await asyncio.sleep(0.05)
        if pending:
            raise TimeoutError(
                f"agents {[a.index for a in pending]} did not start listening"
                f" (none began to for {stall_s:g} s)"
            )
        self.last_up_at = time.monotonic()

    async def wait_converged(self, timeout_s: float = 60.0) -> float:
        """Seconds from the last agent listening until every agent sees every agent alive.

        Each agent is watched on its own from the moment it starts (``/healthz`` held open by the
        agent until it sees everyone, on a connection opened early; retried every 50 ms until the
        agent listens), so the measurement neither waits for the slowest agent's answer in rounds
        nor adds its own TLS handshakes or polling load after the last start. When the last one
        sees everyone, all are asked once more at once; any that lost someone meanwhile is
        watched again.
        """
        started = [a for a in self.agents if a.process is not None or a.index in self._unstarted]
        want = len([a for a in started if a.running or a.index in self._unstarted])
        clients: dict[int, ApiClient] = {}

        async def watch(agent: AgentProcess) -> None:
            """Until this agent sees everyone."""
            while True:
                client = clients.get(agent.index)
                if client is None or client.address != agent.address:  # restarted elsewhere
                    if client is not None:
                        await client.close()
                    client = clients[agent.index] = self.client(agent.index)
                if agent.running and await _sees(client, want):
                    return
                await asyncio.sleep(0.05)

        async def converge() -> float:
            lagging = started
            while True:
                await asyncio.gather(*(watch(a) for a in lagging))
                at = time.monotonic()
                still = await asyncio.gather(
                    *(_sees(clients[a.index], want, wait_s=0) for a in started)
                )
                lagging = [a for a, ok in zip(started, still, strict=True) if not ok]
                if not lagging:
                    return at

        converging = asyncio.create_task(converge())
        try:
            await self.wait_listening()
            try:
                async with asyncio.timeout(timeout_s):
                    converged_at = await converging
            except TimeoutError:
                dead = [a.index for a in self.agents if a.process is not None and not a.running]
                hint = f"; agents that exited: {dead} (see their agent.log)" if dead else ""
                raise TimeoutError(
                    f"the mesh did not converge within {timeout_s:.0f} s{hint}"
                ) from None
            return max(0.0, converged_at - self.last_up_at)
        finally:
            converging.cancel()
            await asyncio.gather(converging, return_exceptions=True)
            await asyncio.gather(*(c.close() for c in clients.values()))


def _log_since_start(agent: AgentProcess) -> bytes:
    """What the agent logged since its last start."""
    try:
        with agent.log_path.open("rb") as log:
            log.seek(agent.log_offset)
            return log.read()
    except OSError:
        return b""


def _listening(agent: AgentProcess) -> bool:
    """The agent printed the line ``shoal agent`` prints once it serves (since its last start).
    Asked of every agent many times a second while a mesh starts: read until seen, then not."""
    if not agent.listened:
        agent.listened = b'{"event": "listening"' in _log_since_start(agent)
    return agent.listened


def _port_taken(agent: AgentProcess) -> bool:
    """The agent exited because its address was in use (EADDRINUSE)."""
    return b"address already in use" in _log_since_start(agent)


async def _sees(client: ApiClient, members: int, wait_s: int = SEES_WAIT_S) -> bool:
    """The agent counts ``members`` live members (``/healthz`` held open by the agent until it
    does, for up to ``wait_s``: a waiting watcher costs the mesh nothing)."""
    try:
        health = await client.health(members, wait_s=wait_s)
    except ApiError:
        return False
    return int(health.get("members", 0)) >= members
