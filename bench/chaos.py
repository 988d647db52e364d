"""Faults on a live mesh: ``python -m bench.chaos --nodes N --jobs J --kill K --partition-s S``.

Starts N real agent processes on loopback with simulated heterogeneous GPUs
(:class:`agent.sandbox.localmesh.LocalMesh`), submits J real jobs through the operator API (the
calls ``shoal submit`` makes), and while they run: kill -9 of K agents one after another, each
chosen for a role it holds at that moment (:data:`ROLES`: the runner of jobs, an owner, a replica,
the agent the operator submitted through, the source or the target of a checkpoint move, which the
benchmark starts with ``migrate``), each restarted once its jobs run again elsewhere; then a
partition of S seconds between two halves of the mesh, healed. Then it waits for every job to
end and checks, from the jobs' own ledger (``bench/chaosjob.py``, ``bench/chaosledger.py``) and
the mesh's records:

- every acknowledged job ended (succeeded, failed, cancelled) or waits with a reason;
- none lost (unknown to every agent, or in state ``lost``, or "succeeded" with its last step
  never written);
- none ran twice at once (processes, not records: two runs alive at one moment);
- no checkpoint resumed out of order;
- how long recovery took: from each kill until the owners ended the attempts on the killed
  agent (lost: requeued; ``requeue_s``, detection and takeover), until every job that ran there
  runs again (a new process, wherever: ``recovery_s``, which includes a wait for room on a full
  fleet; ``jobs_back`` gives each job's kind, its own times, whether the killed agent owned it
  and the reasons its record gave while it waited, the last few), and from the heal until every
  agent sees every other.

The partition is the test-only drop list (:mod:`gossip.droplist`): each agent is started with
``SHOAL_TEST_DROP_FILE`` naming ``drop`` in its own folder, and the benchmark writes the other
half's node ids there, then empties it. Every process and folder it made is removed at the end,
also on Ctrl-C or SIGTERM (``--keep`` keeps the folder: agent logs, the ledger).

The workload is :data:`KINDS`, one line per kind of job: what ``shoal submit --file`` takes
(``JobSpec.from_human``), with a weight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from agent.cli.demo import _Signals
from agent.job.jobspec import JobSpec, new_job_id
from agent.job.ownership import replica_of
from agent.operator.client import ApiClient, ApiError
from agent.sandbox.localmesh import AgentProcess, LocalMesh
from bench.chaosledger import (
    Ledger,
    Run,
)
from bench.chaosverdict import (
    LIVE,
    TERMINAL,
    disagreements,
    log_figures,
    verdict,
)
from gossip.droplist import ENV as DROP_ENV

PROFILES: tuple[str, ...] = ("h100:2", "l4:2", "mi300x:2", "a100-80gb:1", "l4:1", "h100:1")
"""Few GPUs per host, of four models, so jobs queue and preempt."""

STEP_S = 0.5
ROLES: tuple[str, ...] = ("runner", "owner", "move-source", "replica", "submitter", "move-target")
"""Kill i hits ``ROLES[(seed + i) % 6]``, so a few seeds cover them all."""
RECOVERY_WAIT_S = 40.0
"""How long a killed agent stays down at most while its jobs have not run again elsewhere."""
AGREE_WAIT_S = 10.0
"""Once every job has ended, how long the agents' listings have to agree (the last ends are
still being gossiped when the last job ends); what still differs then is reported."""
REJOIN_WAIT_S = 60.0
POLL_S = 0.2


@dataclass(frozen=True)
class Kind:
    """A kind of job in the workload: ``fields`` as ``shoal submit --file`` takes them."""

    name: str
    weight: int
    fields: Mapping[str, Any]
    steps: tuple[int, int] = (6, 14)


KINDS: tuple[Kind, ...] = (
    Kind("batch", 4, {"kind": "batch", "preemptible": True, "resources": {"gpus_per_node": 1}}),
    Kind("training", 3, {"kind": "training", "priority": 5, "resources": {"gpus_per_node": 2}}),
    Kind("inference", 2, {"kind": "inference", "priority": 5, "resources": {"gpus_per_node": 1}}),
    Kind("urgent", 1, {"kind": "batch", "priority": 10, "resources": {"gpus_per_node": 1}}),
    Kind("gang", 1, {"kind": "training", "resources": {"nodes": 2, "gpus_per_node": 1}}),
    Kind("shared", 2, {"kind": "inference", "resources": {"gpus_per_node": 0.5}}),
)


@dataclass
class Submitted:
    job_id: str
    kind: str
    through: int
    at: float
    owner: str | None


@dataclass
class Chaos:
    """One run: the mesh, the ledger and what happened, as it goes."""

    mesh: LocalMesh
    ledger: Ledger
    rng: random.Random
    seed: int
    t0: float = field(default_factory=time.time)
    submitted: dict[str, Submitted] = field(default_factory=dict)
    submit_failures: list[str] = field(default_factory=list)
    unanswered: set[str] = field(default_factory=set)
    """Job ids of submissions that got an error: not acknowledged (some may exist anyway)."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    listed: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """Each live agent's own listing, as last read."""
    clients: dict[int, ApiClient] = field(default_factory=dict)

    # -- the mesh ------------------------------------------------------------------------------

    def live_agents(self) -> list[AgentProcess]:
        return [a for a in self.mesh.agents if a.running]

    def client(self, agent: AgentProcess) -> ApiClient:
        c = self.clients.get(agent.index)
        if c is None or c.address != agent.address:
            c = self.clients[agent.index] = self.mesh.client(agent.index)
        return c

    def agent_of_node(self, node_id: str | None) -> AgentProcess | None:
        return next((a for a in self.mesh.agents if a.node_id == node_id), None)

    def agent_of_run(self, run: Run) -> AgentProcess | None:
        return next((a for a in self.mesh.agents if run.cwd.startswith(f"{a.directory}/")), None)

    async def refresh_records(self) -> None:
        """The newest record of each job any live agent lists (by ``gen``, then attempt)."""
        for agent in self.live_agents():
            try:
                listing = await self.client(agent).jobs()
            except (ApiError, OSError, TimeoutError):
                continue
            self.listed[agent.index] = {job["job_id"]: job for job in listing}
            for job in listing:
                old = self.records.get(job["job_id"])
                key = (int(job.get("gen") or 0), int(job.get("attempt") or 0))
                if old is None or key >= (int(old.get("gen") or 0), int(old.get("attempt") or 0)):
                    self.records[job["job_id"]] = job

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    # -- watching the jobs' processes ----------------------------------------------------------

    def watch_once(self) -> None:
        self.ledger.read_new()
        now = time.time()
        for run in self.ledger.live():
            self.ledger.seen(run, _alive(run), now)

    async def watch(self) -> None:
        while True:
            self.watch_once()
            await asyncio.sleep(POLL_S)

    def running_on(self, agent: AgentProcess) -> list[Run]:
        return [r for r in self.ledger.live() if self.agent_of_run(r) is agent]

    # -- the workload --------------------------------------------------------------------------

    async def submit_all(self, jobs: int, window_s: float, script: Path) -> None:
        weights = [k.weight for k in KINDS]
        python = self.mesh.job_python().executable  # as the agents' job user can run it
        for _ in range(jobs):
            kind = self.rng.choices(KINDS, weights)[0]
            steps = self.rng.randint(*kind.steps)
            command = [python, str(script), str(self.ledger.path), str(steps), str(STEP_S)]
            spec = JobSpec.from_human({**kind.fields, "command": command, "max_runtime_s": 120})
            live = self.live_agents()
            if live:
                through = self.rng.choice(live)
                job_id, at = new_job_id(), time.time()
                try:
                    answer = await self.client(through).submit(spec, job_id)
                    owner = answer.get("owner")
                    self.submitted[job_id] = Submitted(
                        job_id, kind.name, through.index, at, owner if owner else None
                    )
                except (ApiError, OSError, TimeoutError) as exc:
                    self.submit_failures.append(f"{job_id} via agent {through.index}: {exc}")
                    self.unanswered.add(job_id)
            await asyncio.sleep(self.rng.expovariate(jobs / window_s))

    # -- kills -----------------------------------------------------------------------------------

    async def roles(self) -> dict[int, set[str]]:
        """The roles each live agent holds now."""
        await self.refresh_records()
        held: dict[int, set[str]] = {a.index: set() for a in self.live_agents()}
        live_ids = [a.node_id for a in self.live_agents()]
        for run in self.ledger.live():
            a = self.agent_of_run(run)
            if a is not None and a.index in held:
                held[a.index].add("runner")
                if run.resumed_from is not None:
                    held[a.index].add("move-target")
        for job_id, rec in self.records.items():
            if rec.get("state") not in LIVE:
                continue
            owner = self.agent_of_node(rec.get("owner"))
            if owner is not None and owner.index in held:
                held[owner.index].add("owner")
            rep = self.agent_of_node(replica_of(job_id, live_ids, str(rec.get("owner"))))
            if rep is not None and rep.index in held:
                held[rep.index].add("replica")
            sub = self.submitted.get(job_id)
            if sub is not None and sub.through in held:
                held[sub.through].add("submitter")
        return held

    async def start_move(self, fault: dict[str, Any]) -> Run | None:
        """Migrate a running job that has written a checkpoint; the run it moves off."""
        runs = [r for r in self.ledger.live() if r.steps and self.agent_of_run(r) is not None]
        self.rng.shuffle(runs)
        for run in runs:
            agent = self.agent_of_run(run)
            assert agent is not None
            try:
                await self.client(self.rng.choice(self.live_agents())).migrate(run.job)
            except (ApiError, OSError, TimeoutError) as exc:
                fault.setdefault("migrate_refused", []).append(f"{run.job}: {exc}")
                continue
            fault["moved_job"], fault["move_from_agent"] = run.job, agent.index
            fault["move_at_s"] = self.rel(time.time())
            return run
        return None

    async def choose(self, role: str, fault: dict[str, Any]) -> AgentProcess | None:
        if role in ("move-source", "move-target"):
            moving = await self.start_move(fault)
            if moving is not None:
                source = self.agent_of_run(moving)
                if role == "move-source":
                    return source
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    self.watch_once()
                    for r in self.ledger.runs.values():
                        if r.job == moving.job and r.start_t > moving.start_t and not r.ended:
                            return self.agent_of_run(r)
                    await asyncio.sleep(0.05)
                fault["move_target_unseen"] = True
        held = await self.roles()
        want = role if role not in ("move-source", "move-target") else "runner"
        ranked = sorted(held.items(), key=lambda kv: (want not in kv[1], -len(kv[1]), kv[0]))
        return self.mesh.agents[ranked[0][0]] if ranked else None

    async def kill(self, number: int) -> None:
        role = ROLES[(self.seed + number) % len(ROLES)]
        fault: dict[str, Any] = {"fault": "kill", "role": role}
        victim = await self.choose(role, fault)
        if victim is None or not victim.running:
            fault["skipped"] = "no live agent held the role"
            self.faults.append(fault)
            return
        held = await self.roles()
        self.watch_once()
        there = {r.job for r in self.running_on(victim)}
        if fault.get("move_from_agent") == victim.index:
            there.add(fault["moved_job"])  # stopping for its move, or moved off already
        owned = {
            j
            for j, rec in self.records.items()
            if rec.get("state") in LIVE and rec.get("owner") == victim.node_id
        }
        killed_at = time.time()
        self.mesh.kill(victim, signal.SIGKILL)
        fault.update(
            agent=victim.index,
            roles=sorted(held.get(victim.index, set())),
            at_s=self.rel(killed_at),
            jobs_running_there=sorted(there),
            jobs_owned_there=len(owned),
        )
        self.faults.append(fault)
        deadline = time.monotonic() + RECOVERY_WAIT_S
        waited: dict[str, list[str]] = {j: [] for j in there}
        while time.monotonic() < deadline:
            self.watch_once()
            await self.refresh_records()
            for j in there:
                rec, said = self.records.get(j, {}), waited[j]
                reason = rec.get("reason")
                if rec.get("state") == "pending" and reason and (not said or said[-1] != reason):
                    said.append(str(reason))
            if all(self.restarted_after(j, killed_at) or self.ended(j) for j in there) and all(
                self.records.get(j, {}).get("owner") != victim.node_id or self.ended(j)
                for j in owned
            ):
                break
            await asyncio.sleep(0.5)
        fault["down_s"] = round(time.time() - killed_at, 3)
        kept = sorted(
            j
            for j in owned
            if self.records.get(j, {}).get("owner") == victim.node_id and not self.ended(j)
        )
        fault["owners_taken_over"] = not kept
        fault["jobs_not_taken_over"] = [
            {
                k: self.records.get(j, {}).get(k)
                for k in ("job_id", "state", "gen", "attempt", "runner")
            }
            for j in kept
        ]
        self.mesh.start_agent(victim)
        restarted_at = time.time()
        fault["rejoin_s"] = await self.converge(restarted_at)
        fault["_killed_at"], fault["_jobs"], fault["_waited"] = killed_at, there, waited
        fault["_owned"] = owned

    def restarted_after(self, job: str, t: float) -> bool:
        return any(r.job == job and r.start_t > t for r in self.ledger.runs.values())

    def ended(self, job: str) -> bool:
        return self.records.get(job, {}).get("state") in TERMINAL

    async def converge(self, since: float) -> float | None:
        """Seconds from ``since`` until every live agent sees all N members alive."""
        want = len(self.mesh.agents)
        deadline = time.monotonic() + REJOIN_WAIT_S
        while time.monotonic() < deadline:
            oks = await asyncio.gather(*(self.sees(a, want) for a in self.live_agents()))
            if all(oks):
                return round(time.time() - since, 3)
            await asyncio.sleep(0.1)
        return None

    async def sees(self, agent: AgentProcess, want: int) -> bool:
        try:
            health = await self.client(agent).health(want, wait_s=1)
        except (ApiError, OSError, TimeoutError):
            return False
        return int(health.get("members", 0)) >= want

    # -- the partition --------------------------------------------------------------------------

    async def partition(self, seconds: float) -> None:
        agents = self.mesh.agents
        half = [a for i, a in enumerate(agents) if i % 2 == 0]
        other = [a for a in agents if a not in half]
        fault: dict[str, Any] = {
            "fault": "partition",
            "halves": [[a.index for a in half], [a.index for a in other]],
        }
        for side, far in ((half, other), (other, half)):
            for a in side:
                _write_drop(a, [b.node_id for b in far])
        started = time.time()
        fault["at_s"] = self.rel(started)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.watch_once()
            await asyncio.sleep(POLL_S)
        for a in agents:
            _write_drop(a, [])
        healed = time.time()
        fault["duration_s"] = round(healed - started, 3)
        fault["heal_converged_s"] = await self.converge(healed)
        self.watch_once()
        live = Counter(r.job for r in self.ledger.live())
        fault["jobs_running_twice_after_heal"] = sorted(j for j, n in live.items() if n > 1)
        fault["_started"], fault["_healed"] = started, healed
        self.faults.append(fault)


def _write_drop(agent: AgentProcess, node_ids: list[str]) -> None:
    path = agent.directory / "drop"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{n}\n" for n in node_ids))
    os.replace(tmp, path)


def _alive(run: Run) -> bool:
    """The run's pid is the run's process, and it has not exited."""
    try:
        p = psutil.Process(run.pid)
        if abs(p.create_time() - run.start_t) > 5 or p.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    return True


class ChaosMesh(LocalMesh):
    """Agents started with the test drop list switched on (``drop`` in each one's folder)."""

    def env(self, agent: AgentProcess) -> dict[str, str]:
        return {**super().env(agent), DROP_ENV: str(agent.directory / "drop")}


# -- the run and its verdict ---------------------------------------------------------------------


async def _scenario(
    chaos: Chaos, jobs: int, kills: int, partition_s: float, settle_s: float, script: Path
) -> None:
    mesh = chaos.mesh
    chaos.faults.append({"fault": "start", "converged_s": round(await mesh.wait_converged(), 3)})
    chaos.t0 = time.time()
    watcher = asyncio.create_task(chaos.watch())
    window_s = min(60.0, max(6.0, 0.5 * jobs))
    submitting = asyncio.create_task(chaos.submit_all(jobs, window_s, script))
    try:
        deadline = time.monotonic() + 60
        while len(chaos.ledger.live()) < min(3, jobs) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        for number in range(kills):
            await chaos.kill(number)
        if partition_s > 0:
            await chaos.partition(partition_s)
        await submitting
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            await chaos.refresh_records()
            if all(chaos.ended(j) for j in chaos.submitted):
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(2 * POLL_S)
        chaos.watch_once()
        agree_by = time.monotonic() + AGREE_WAIT_S  # the last ends are still being gossiped
        while True:
            chaos.listed.clear()
            await chaos.refresh_records()
            if time.monotonic() >= agree_by or not any(disagreements(chaos)):
                break
            await asyncio.sleep(POLL_S)
    finally:
        for task in (watcher, submitting):
            task.cancel()
        await asyncio.gather(watcher, submitting, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in chaos.clients.values()))


def run(
    *,
    nodes: int,
    jobs: int,
    kills: int,
    partition_s: float,
    seed: int,
    settle_s: float = 180.0,
    keep: bool = False,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="shoal-chaos-"))
    root.chmod(0o711)  # jobs run as the job user when the agents run as root
    script = root / "chaosjob.py"
    shutil.copyfile(Path(__file__).with_name("chaosjob.py"), script)
    script.chmod(0o644)
    ledger_path = root / "ledger.jsonl"
    ledger_path.touch()
    ledger_path.chmod(0o666)
    mesh = ChaosMesh(root, nodes, profiles=PROFILES)
    chaos = Chaos(mesh, Ledger(ledger_path), random.Random(seed), seed)
    started = time.monotonic()
    with _Signals() as signals:
        try:
            mesh.start()
            asyncio.run(_scenario(chaos, jobs, kills, partition_s, settle_s, script))
            figures = verdict(chaos)
            figures.update(log_figures(mesh))
            figures["invariants"]["no_report_not_owned_at_info"] = (
                figures["report_not_owned_lines"] == 0
            )
        finally:
            signals.hold()
            mesh.stop()
            _kill_leftovers(chaos.ledger)
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
    figures.update(seed=seed, kills=kills, partition_s=partition_s)
    figures["wall_s"] = round(time.monotonic() - started, 1)
    if keep:
        figures["kept"] = str(root)
    return figures


def _kill_leftovers(ledger: Ledger) -> None:
    """Any job process still alive once the agents are gone (none should be)."""
    ledger.read_new()
    for run in ledger.live():
        if _alive(run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--jobs", type=int, default=30)
    p.add_argument("--kill", type=int, default=2, help="agents to kill -9, one after another")
    p.add_argument("--partition-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--settle-s", type=float, default=180.0, help="the longest wait at the end")
    p.add_argument("--keep", action="store_true", help="keep the folder (logs, the ledger)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.nodes < 2 or args.jobs < 1 or args.kill < 0 or args.partition_s < 0:
        p.error("--nodes must be at least 2, --jobs at least 1, --kill and --partition-s >= 0")
    try:
        figures = run(
            nodes=args.nodes,
            jobs=args.jobs,
            kills=args.kill,
            partition_s=args.partition_s,
            seed=args.seed,
            settle_s=args.settle_s,
            keep=args.keep,
        )
    except KeyboardInterrupt:
        print("stopped; every agent and job process it started is gone", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:32} {value}")
    return 0 if all(figures["invariants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
