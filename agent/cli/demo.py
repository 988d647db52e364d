"""``shoal demo``: a local mesh of simulated heterogeneous hosts, live or as a benchmark.

Interactive: starts the agents, then opens the operator TUI on them (``--plain``: a live table
view instead) until you quit. With stdout not a terminal (a service manager, a script, ``&``) it
prints how to reach the mesh instead (``export SHOAL_AGENT=...``, the identity folder; ``--json``:
as one JSON object) and keeps the mesh up until it is told to stop. ``--headless``: submits a
mixed workload of real short processes through the operator API for ``--duration`` seconds,
waits for it to finish, and prints the live-mesh figures of BENCHMARKS.md (``--json`` for one
JSON object). ``--policy fifo|shoal`` runs every agent with that placement (``placement`` in its
config), on the placement demo's fleet (:data:`agent.sandbox.demoload.FLEET`: eight GPU generations,
fast ones a minority); headless, it submits the placement workload instead
(:mod:`agent.sandbox.demoload`: synthetic jobs as fast as the device they get, seeded, the same for
either policy) and adds its figures: job completion times, deadline misses, preemptions, migrations,
where the jobs ran.

Every mode names the mesh (``export SHOAL_AGENT=...``, ``export SHOAL_HOME=...``) as soon as its
agents are started (headless: on stderr), and whatever it writes is flushed: ``shoal demo --plain
> demo.log &`` finds the mesh in ``demo.log``, where the tables are appended every
:data:`PLAIN_LOG_EVERY_S` seconds (a live table redraws only on a terminal).

Whatever ends it (quitting, Ctrl-C, SIGTERM as ``kill`` or a service manager sends, SIGHUP when
its terminal goes), every agent it started is stopped and its folder, CA key included, removed
(``--keep`` keeps the folder: identities, agent logs, job logs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import psutil
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from agent.cli.tables import hostnames, jobs_table, nodes_table
from agent.common.errors import UserError
from agent.daemon.config import PLACEMENT_NAMES
from agent.job.jobspec import JobKind, JobSpec, Resources, new_job_id
from agent.job.jobstate import TERMINAL_JOB_STATES
from agent.operator.client import ApiError
from agent.sandbox import demoload
from agent.sandbox.demoload import percentile
from agent.sandbox.jobpython import JobPython
from agent.sandbox.localmesh import DEMO_PROFILES, LocalMesh
from probers.catalog import device_model


@dataclass
class Workload:
    """What the headless demo submitted and what became of it."""

    submitted_at: dict[str, float] = field(default_factory=dict)
    deadlines: dict[str, float] = field(default_factory=dict)
    submit_failures: int = 0


SpecMaker = Callable[[random.Random, float], JobSpec]
"""The next job of a workload, drawn from the seeded generator, submitted at an epoch time."""


def _light_spec(python: JobPython, rng: random.Random, now: float) -> JobSpec:
    """A short real process that reports progress, in one of the three job kinds."""
    kinds: tuple[JobKind, ...] = ("inference", "training", "batch")
    kind = rng.choice(kinds)
    seconds = round(rng.uniform(0.5, 3.0), 2)
    steps = 4
    code = (
        "import time\n"
        f"for i in range({steps}):\n"
        f"    time.sleep({seconds / steps})\n"
        f"    print('SHOAL_PROGRESS', (i + 1) / {steps}, flush=True)\n"
    )
    backends: tuple[Any, ...] = ()
    if kind == "training" and rng.random() < 0.5:
        backends = ("cuda", "rocm")
    return JobSpec(
        command=(python.executable, "-c", code),
        env=dict(python.env),
        kind=kind,
        resources=Resources(gpus_per_node=rng.choice((1, 1, 1, 2)), backends=backends),
        max_runtime_s=120,
    )


def _placement_spec(python: JobPython, rng: random.Random, now: float) -> JobSpec:
    """A job of the placement workload (:mod:`agent.sandbox.demoload`)."""
    return demoload.job_spec(demoload.draw_job(rng), now, python)


class Arrival(NamedTuple):
    """One submission of a workload: when, to which agent, and the seed of its job."""

    offset_s: float
    agent: int
    job_seed: int


def schedule(seed: int, duration_s: float, rate_per_s: float, agents: int) -> list[Arrival]:
    """The submissions of a run, from ``seed`` alone: Poisson arrivals at ``rate_per_s`` over
    ``duration_s``, each to a random agent, each job drawn from its own seed. However long the
    submissions take, two runs with one seed submit the same jobs in the same order."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    at = 0.0
    while at < duration_s:
        out.append(Arrival(at, rng.randrange(agents), rng.getrandbits(64)))
        at += rng.expovariate(rate_per_s)
    return out


async def _submit_workload(
    mesh: LocalMesh, duration_s: float, rate_per_s: float, seed: int, make: SpecMaker
) -> Workload:
    work = Workload()
    clients = [mesh.client(i, keepalive_s=duration_s + 60) for i in range(len(mesh.agents))]
    try:
        # Each submitter holds its connection from the start to the end, as the TUI does: the
        # clock measures the mesh, not a TLS handshake per submitter. An agent too busy to
        # answer now is connected to at its first submission (a failed one is counted).
        await asyncio.gather(*(c.health_doc() for c in clients), return_exceptions=True)
        start = time.monotonic()
        for arrival in schedule(seed, duration_s, rate_per_s, len(clients)):
            await asyncio.sleep(max(0.0, start + arrival.offset_s - time.monotonic()))
            job_id = new_job_id()
            t0 = time.time()
            spec = make(random.Random(arrival.job_seed), t0)
            try:
                await clients[arrival.agent].submit(spec, job_id)
                work.submitted_at[job_id] = t0
                if spec.deadline is not None:
                    work.deadlines[job_id] = spec.deadline
            except ApiError:
                work.submit_failures += 1
    finally:
        for c in clients:
            await c.close()
    return work


class _Footprint:
    """Samples every agent's RSS and CPU once a second while inside ``async with``."""

    def __init__(self, mesh: LocalMesh) -> None:
        self._procs = [psutil.Process(a.process.pid) for a in mesh.agents if a.process is not None]
        for p in self._procs:
            p.cpu_percent(None)
        self.rss_mb: list[float] = []
        self.cpu_pct: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def rss_mb_max(self) -> float:
        return max(self.rss_mb, default=0.0)

    def sample(self) -> None:
        for p in self._procs:
            try:
                self.rss_mb.append(p.memory_info().rss / 2**20)
                self.cpu_pct.append(p.cpu_percent(None))
            except psutil.Error:
                continue

    async def _run(self) -> None:
        """A sample every second (each CPU figure covers the second before it) until stopped."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
            self.sample()

    async def __aenter__(self) -> _Footprint:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


async def _settled(mesh: LocalMesh, work: Workload, settle_s: float) -> dict[str, dict[str, Any]]:
    """The submitted jobs as the mesh lists them, once all are final (or after ``settle_s``).
    A job no longer listed (ended and retired: ``agent.mesh.retiring``) is asked for by its id."""
    jobs: dict[str, dict[str, Any]] = {}
    retired: dict[str, dict[str, Any]] = {}
    async with mesh.client(0) as client:
        settle_deadline = time.monotonic() + settle_s
        while time.monotonic() < settle_deadline:
            listing = {j["job_id"]: j for j in await client.jobs()}
            for jid in work.submitted_at.keys() - listing.keys() - retired.keys():
                with contextlib.suppress(ApiError):
                    job = await client.job(jid)
                    if job.get("state") in TERMINAL_JOB_STATES:
                        retired[jid] = job
            listing.update(retired)
            jobs = {jid: listing[jid] for jid in work.submitted_at if jid in listing}
            if len(jobs) == len(work.submitted_at) and all(
                j.get("state") in TERMINAL_JOB_STATES for j in jobs.values()
            ):
                break
            await asyncio.sleep(0.5)
    return jobs


async def _device_models(mesh: LocalMesh) -> dict[tuple[str, str], str]:
    """``(node id, device key)`` -> the device's model, as the policy knows it."""
    async with mesh.client(0) as client:
        return {
            (node.node_id, d.static.key): device_model(d.static.name, d.static.backend)
            for node in await client.node_docs()
            for d in node.devices
        }


async def _metrics_lines(mesh: LocalMesh) -> list[str]:
    """Every agent's ``/metrics``, as text lines."""
    lines: list[str] = []
    for i in range(len(mesh.agents)):
        async with mesh.client(i) as client:
            lines += [line async for line in client.stream("/metrics")]
    return lines


async def _headless(
    mesh: LocalMesh,
    duration_s: float,
    rate: float,
    seed: int,
    idle_s: float,
    policy: str | None,
    python: JobPython,
) -> dict[str, Any]:
    converged_s = await mesh.wait_converged(timeout_s=120)
    # A quiet spell first: idle agents to submit to, and the idle footprint over its second
    # half (the first settles what starting a mesh stirs up: handshakes, the first records).
    await asyncio.sleep(idle_s / 2)
    async with _Footprint(mesh) as idle:
        await asyncio.sleep(idle_s / 2)
    async with _Footprint(mesh) as footprint:
        if policy is None:
            spec = functools.partial(_light_spec, python)
            work = await _submit_workload(mesh, duration_s, rate, seed, spec)
            jobs = await _settled(mesh, work, 120.0)
        else:
            spec = functools.partial(_placement_spec, python)
            work = await _submit_workload(mesh, duration_s, rate, seed, spec)
            jobs = await _settled(mesh, work, demoload.SETTLE_S)
    latencies = [
        1000 * (float(j["started_at"]) - work.submitted_at[jid])
        for jid, j in jobs.items()
        if j.get("started_at") is not None
    ]
    states = [j.get("state") for j in jobs.values()]
    figures: dict[str, Any] = {
        "nodes": len(mesh.agents),
        "converged_s": round(converged_s, 3),
        "jobs_submitted": len(work.submitted_at),
        "jobs_succeeded": states.count("succeeded"),
        "jobs_failed": states.count("failed"),
        "jobs_lost": len(work.submitted_at) - len(jobs),
        "jobs_unfinished": sum(1 for s in states if s not in TERMINAL_JOB_STATES),
        "submit_failures": work.submit_failures,
        "submit_to_running_ms_p50": _round(percentile(latencies, 0.5)),
        "submit_to_running_ms_p99": _round(percentile(latencies, 0.99)),
        "agent_rss_mb_max": round(footprint.rss_mb_max, 1),
        "agent_cpu_pct_mean": _round(
            statistics.fmean(footprint.cpu_pct) if footprint.cpu_pct else None
        ),
        "agent_idle_rss_mb_mean": _round(statistics.fmean(idle.rss_mb) if idle.rss_mb else None),
        "agent_idle_rss_mb_max": round(idle.rss_mb_max, 1),
        "agent_idle_cpu_pct_mean": _round(
            statistics.fmean(idle.cpu_pct) if idle.cpu_pct else None, digits=2
        ),
    }
    if policy is not None:
        models = await _device_models(mesh)
        figures["policy"] = policy
        figures.update(demoload.placement_figures(jobs, work.submitted_at, work.deadlines, models))
        offers = demoload.offer_counts(await _metrics_lines(mesh))
        figures["offers_started"] = offers["started"]
        figures["offers_declined"] = offers["declined"]
    return figures


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def reach_lines(mesh: LocalMesh) -> list[str]:
    """How to reach the mesh from another shell: the agent's address and the identity folder."""
    address = mesh.agents[0].address
    cluster = mesh.root / "cluster"
    return [
        f"export SHOAL_AGENT={address}",
        f"export SHOAL_HOME={mesh.root}",
        f"# or: shoal nodes --agent {address} --identity {cluster}",
    ]


def _agents(mesh: LocalMesh) -> str:
    n = len(mesh.agents)
    return f"{n} agent{'s' * (n != 1)}"


def _say_reach(mesh: LocalMesh, console: Console) -> None:
    """The reach lines, as soon as the agents are started (before they converge): whatever the
    mode and wherever the output goes (``shoal demo --plain > demo.log &``), it names the mesh.
    Each line whole, however narrow the output (a file's console is 80 columns), and all of
    them in one write, so a reader of the file never finds half of them."""
    console.print("\n".join(reach_lines(mesh)), markup=False, highlight=False, soft_wrap=True)


def reach_json(mesh: LocalMesh, converged_s: float) -> dict[str, Any]:
    return {
        "agent": mesh.agents[0].address,
        "agents": [a.address for a in mesh.agents],
        "identity": str(mesh.root / "cluster"),
        "home": str(mesh.root),
        "converged_s": round(converged_s, 3),
    }


PLAIN_LOG_EVERY_S = 10.0
"""``--plain`` with stdout not a terminal: the tables are appended this often, not redrawn."""


async def _live(mesh: LocalMesh, console: Console) -> None:
    console.print(f"starting {_agents(mesh)}...")
    converged_s = await mesh.wait_converged(timeout_s=120)
    hint = Text(
        f"mesh of {_agents(mesh)} converged in {converged_s:.1f} s. In another "
        f"terminal: {'; '.join(reach_lines(mesh)[:2])}; shoal submit -- sleep 5. "
        "Ctrl-C stops everything.",
        style="dim",
    )
    async with mesh.client(0) as client:

        async def view() -> Group:
            nodes, jobs = await client.nodes(), await client.jobs()
            width = console.width
            return Group(
                nodes_table(nodes, width),
                jobs_table(jobs[-15:], hostnames(nodes), time.time(), width),
                hint,
            )

        if not console.is_terminal:  # a file or a pipe: a Live draws only when it stops
            while True:
                console.print(await view())  # each print is flushed
                await asyncio.sleep(PLAIN_LOG_EVERY_S)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(await view(), refresh=True)
                await asyncio.sleep(1.0)


def _serve(mesh: LocalMesh, as_json: bool) -> None:
    """Not on a terminal: say how to reach the mesh, then keep it up until told to stop."""
    print(f"starting {_agents(mesh)}...", file=sys.stderr, flush=True)
    converged_s = asyncio.run(mesh.wait_converged(timeout_s=120))
    if as_json:
        print(json.dumps(reach_json(mesh, converged_s)), flush=True)
    else:
        print(
            f"mesh of {_agents(mesh)} converged in {converged_s:.1f} s; "
            f"Ctrl-C, SIGTERM or SIGHUP stops every agent and removes {mesh.root}"
        )
        print("\n".join(reach_lines(mesh)), flush=True)
    while any(a.running for a in mesh.agents):
        time.sleep(1.0)
    raise UserError("every agent of the demo exited (--keep keeps their logs)")


class _Stop(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP: the way a live demo ends, through one cleanup."""


STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class _Signals:
    """Inside ``with``: the first of Ctrl-C, SIGTERM and SIGHUP raises :class:`_Stop`; from then
    on (and under :meth:`hold`) they are ignored, so a second Ctrl-C cannot interrupt the
    cleanup that stops the agents.

    Ctrl-C is handled here, not by ``asyncio.run`` (which leaves a handler other than Python's
    default in place): its second Ctrl-C, pressed while the loop cancelled the live table's
    tasks, left the demo hung and its agents running."""

    def __enter__(self) -> _Signals:
        self._previous = {sig: signal.signal(sig, self._raise) for sig in STOP_SIGNALS}
        return self

    def _raise(self, signum: int, _frame: FrameType | None) -> None:
        self.hold()
        raise _Stop(signal.Signals(signum).name)

    def hold(self) -> None:
        for sig in self._previous:
            signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_demo(
    *,
    nodes: int,
    headless: bool,
    duration_s: float | None,
    rate: float | None,
    seed: int,
    as_json: bool,
    keep: bool,
    plain: bool = False,
    idle_s: float = 20.0,
    policy: str | None = None,
) -> int:
    """``duration_s`` and ``rate`` ``None``: the workload's own (30 s at 4 jobs/s; the placement
    workload, with ``policy``: 60 s at 0.5 jobs/s)."""
    if duration_s is None:
        duration_s = 30.0 if policy is None else 60.0
    if rate is None:
        rate = 4.0 if policy is None else 0.5
    if policy is not None and policy not in PLACEMENT_NAMES:
        raise UserError(f"--policy must be one of {', '.join(PLACEMENT_NAMES)}")
    if nodes < 1:
        raise UserError("--nodes must be at least 1")
    if idle_s < 0:
        raise UserError("--idle must not be negative")
    if duration_s <= 0 or rate <= 0:
        raise UserError("--duration and --rate must be positive")
    if plain and as_json:
        raise UserError("--plain draws tables; --json goes with --headless or a piped stdout")
    serve = not headless and not plain and (as_json or not sys.stdout.isatty())
    root = Path(tempfile.mkdtemp(prefix="shoal-demo-"))
    # Jobs may run as another user than the agents (root agents: nobody): they pass through the
    # folder to their own checkpoint and progress files. Nothing in it can be listed or read so:
    # the agents' folders are theirs, the cluster CA's is the agent user's alone.
    root.chmod(0o711)
    profiles = DEMO_PROFILES if policy is None else demoload.FLEET
    mesh = LocalMesh(
        root,
        nodes,
        profiles=profiles,
        placement=policy,
        preempt_min_run_s=None if policy is None else demoload.PREEMPT_MIN_RUN_S,
    )
    console = Console(stderr=as_json or serve)
    failed = False
    with _Signals() as signals:
        try:
            mesh.create()
            if headless and policy is not None:
                demoload.lay_out_datasets([a.datasets_dir for a in mesh.agents])
            mesh.start()
            if not serve:  # serving says it once converged, in the form scripts read
                _say_reach(mesh, console if not headless else Console(stderr=True))
            if headless:
                python = mesh.job_python()
                figures = asyncio.run(
                    _headless(mesh, duration_s, rate, seed, idle_s, policy, python)
                )
                if as_json:
                    print(json.dumps(figures))
                else:
                    for key, value in figures.items():
                        console.print(f"{key:28} {value}", markup=False, highlight=False)
            elif serve:
                _serve(mesh, as_json)
            elif plain:
                asyncio.run(_live(mesh, console))
            else:
                console.print(f"starting {_agents(mesh)}...")
                converged_s = asyncio.run(mesh.wait_converged(timeout_s=120))
                console.print(f"mesh converged in {converged_s:.1f} s; opening the TUI")
                from tui.cli import open_tui  # the TUI loads only for the interactive demo

                open_tui(mesh.agents[0].address, mesh.root / "cluster")
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the way a live demo ends
            pass
        except (TimeoutError, ApiError) as exc:  # a mesh that did not form, an agent gone
            failed = True  # the logs tell why: the folder stays for them
            raise UserError(f"{exc}; agent logs are in {root}") from None
        finally:
            signals.hold()
            mesh.stop()
            if keep:
                console.print(f"kept {root}")
            elif not failed:
                shutil.rmtree(root, ignore_errors=True)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(
        nodes=args.nodes,
        headless=args.headless,
        duration_s=args.duration,
        rate=args.rate,
        seed=args.seed,
        idle_s=args.idle,
        as_json=args.json,
        keep=args.keep,
        plain=args.plain,
        policy=args.policy,
    )
