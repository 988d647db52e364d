"""The data benchmark's staging runs: throughput from 1 and 3 holders, and the faults.

Both run on their own fresh mesh on the lab of ``python -m bench.data`` (:class:`DataMesh`), each
with datasets made for it (seeded bytes, laid out in the holders' datasets folders, which the
agents index in place and serve from).

- :func:`throughput`: one dataset staged onto an empty host (the last) from 1 holder, then
  another of the same size from 3, by the operator's ``stage`` command; bytes per second from
  the command until the stage is done. Every host sends at ``--link-mbit``; while it runs the
  stager's own receive side is widened to 4 links, so what bounds the stage is the holders'
  links (as for a node pulling from storage hosts with narrower links), the same for 1 and 3.
- :func:`faults`: three jobs, each naming a dataset no host that can run it holds (the holders
  are cordoned), while a holder is killed mid-stage, while a holder serves corrupt chunks
  (started with ``SHOAL_TEST_CORRUPT_CHUNKS=1``, the agents' test hook), and while the stager is
  killed mid-stage and started again. Each must end with the job's own check of every byte
  passing and the job having run once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from agent.content.manifest import DEFAULT_CHUNK_BYTES
from agent.job.jobspec import JobSpec, new_job_id
from agent.operator.client import ApiClient, ApiError
from agent.sandbox.localmesh import AgentProcess
from bench.datamesh import PROFILE, DataMesh, lay_out, write_dataset, write_plan
from bench.netlab import Lab

STAGE_WAIT_S: Final = 600.0
JOB_WAIT_S: Final = 300.0
POLL_S: Final = 0.2
WIDE_LINKS: Final = 4


@dataclass
class Probe:
    """A staging run's lab and folder; the datasets it made (name -> each file's SHA-256)."""

    lab: Lab
    root: Path
    link_mbit: float
    seed: int
    made: dict[str, dict[str, str]] = field(default_factory=dict)

    def dataset(self, name: str, size_bytes: int) -> dict[str, str]:
        """Dataset ``name`` of ``size_bytes`` seeded bytes in two files, made once."""
        if name not in self.made:
            half = size_bytes // 2
            folder = self.root / "probe-data" / name
            self.made[name] = write_dataset(
                folder, f"{self.seed}/{name}", (half, size_bytes - half)
            )
        return self.made[name]

    def mesh(
        self,
        name: str,
        holdings: Sequence[Mapping[str, int]],
        config_text: str = "",
        corrupt: Sequence[int] = (),
    ) -> DataMesh:
        """A created, unstarted mesh in folder ``name`` whose host i holds ``holdings[i]``
        (dataset name -> bytes) in its datasets folder."""
        folder = self.root / name
        folder.mkdir()
        folder.chmod(0o711)
        mesh = DataMesh(
            folder,
            self.lab.hosts,
            profiles=(PROFILE,),
            lab=self.lab,
            config_text=config_text,
            corrupt=corrupt,
        )
        mesh.create()
        for agent, held in zip(mesh.agents, holdings, strict=True):
            for ds, size in held.items():
                self.dataset(ds, size)
            lay_out(self.root / "probe-data", agent.datasets_dir, held)
        return mesh


async def _until(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


async def _digest(client: ApiClient, name: str, holders: int) -> str:
    """The digest of ``name`` once ``holders`` nodes hold it whole (as ``client``'s agent sees)."""

    async def held() -> str | None:
        try:
            nodes = await client.nodes()
        except (ApiError, OSError, TimeoutError):
            return None
        whole = [
            v["digest"]
            for n in nodes
            for v in n.get("dataset_versions") or ()
            if v["name"] == name and v["held_bytes"] == v["total_bytes"]
        ]
        return whole[0] if len(whole) >= holders else None

    return str(await _until(f"{name} held whole by {holders}", held, 120))


async def _stage_of(client: ApiClient, digest: str) -> dict[str, Any] | None:
    try:
        stages = (await client.get("/v1/content/stages"))["stages"]
    except (ApiError, OSError, TimeoutError):
        return None
    return next((s for s in stages if s.get("digest") == digest), None)


async def _timed_stage(client: ApiClient, agent: AgentProcess, name: str, digest: str) -> float:
    """Bytes per second of staging ``digest`` onto ``agent``, from the command to done."""
    started = time.monotonic()
    await client.command("stage", {"name": name, "digest": digest, "nodes": [agent.node_id]})

    async def ended() -> dict[str, Any] | None:
        s = await _stage_of(client, digest)
        return s if s is not None and s["state"] in ("done", "failed", "cancelled") else None

    s = await _until(f"{name} staged", ended, STAGE_WAIT_S)
    seconds = time.monotonic() - started
    if s["state"] != "done":
        raise RuntimeError(f"staging {name} ended {s['state']}: {s.get('error')}")
    return float(s["total_bytes"]) / seconds


def throughput(probe: Probe, size_bytes: int) -> dict[str, Any]:
    """``{"1": T1, "3": T3}`` (``"3"`` ``None`` below 4 hosts), with how it was measured."""
    lab = probe.lab
    target = lab.hosts - 1
    three = lab.hosts >= 4
    holdings: list[dict[str, int]] = [{} for _ in range(lab.hosts)]
    holdings[0]["tp1"] = size_bytes
    if three:
        for i in range(3):
            holdings[i]["tp3"] = size_bytes
    mesh = probe.mesh("throughput", holdings)
    out: dict[str, Any] = {"1": None, "3": None}
    lab.shape(target, probe.link_mbit, down_mbit=probe.link_mbit * WIDE_LINKS)
    try:
        mesh.start()

        async def measure() -> None:
            await mesh.wait_converged()
            client = mesh.client(target)
            try:
                agent = mesh.agents[target]
                out["1"] = round(
                    await _timed_stage(client, agent, "tp1", await _digest(client, "tp1", 1))
                )
                if three:
                    digest = await _digest(client, "tp3", 3)
                    out["3"] = round(await _timed_stage(client, agent, "tp3", digest))
            finally:
                await client.close()

        asyncio.run(measure())
    finally:
        mesh.stop()
        lab.shape(target, probe.link_mbit)
    return {
        "stage_throughput_bytes_per_s": out,
        "stage_throughput_dataset_bytes": size_bytes,
        "stage_throughput_stager_down_mbit": probe.link_mbit * WIDE_LINKS,
    }


# -- faults -----------------------------------------------------------------------------------

FAULTS: Final = ("holder_killed", "corrupt_holder", "stager_restarted")
FAULT_CHUNKS: Final = 8
"""The fewest chunks in each fault's dataset."""


def faults(probe: Probe, size_bytes: int, script: Path) -> Any:
    """Each fault's outcome (``ok``: the job's check passed and it ran once)."""
    lab = probe.lab
    if lab.hosts < 5:
        return {"missing": "the faults need 5 hosts (3 holders, 2 to run jobs)"}
    # A link's burst is one chunk, so each holder's first chunk comes at once: a dataset of two
    # chunks from two holders is whole before a fault can hit it. Eight chunks leave six to go.
    size_bytes = max(size_bytes, FAULT_CHUNKS * DEFAULT_CHUNK_BYTES)
    holdings: list[dict[str, int]] = [{} for _ in range(lab.hosts)]
    for name, holders in (("f1", (0, 1)), ("f2", (2, 1)), ("f3", (1,))):
        for h in holders:
            holdings[h][name] = size_bytes
    # A holder's link gives a stage about 8 s (4 s from two): long enough to hit it mid-way.
    config = f"content_link_bytes_per_s = {max(64 << 10, size_bytes // 8)}.0\n"
    mesh = probe.mesh("faults", holdings, config, corrupt=(2,))
    ledger = probe.root / "faults" / "ledger.jsonl"
    ledger.touch()
    ledger.chmod(0o666)
    plan = write_plan(
        probe.root / "faults" / "plan.json",
        {n: {"files": probe.made[n], "sources": []} for n in ("f1", "f2", "f3")},
    )
    try:
        mesh.start()
        return asyncio.run(_faults(mesh, ledger, plan, script, probe.seed))
    finally:
        mesh.stop()


async def _faults(mesh: DataMesh, ledger: Path, plan: Path, script: Path, seed: int) -> Any:
    await mesh.wait_converged()
    client = mesh.client(1)  # a holder never killed
    results = []
    try:
        for a in mesh.agents[:3]:
            await client.cordon(a.node_id)
        digests = {n: await _digest(client, n, k) for n, k in (("f1", 2), ("f2", 2), ("f3", 1))}
        run = _FaultRun(mesh, client, ledger, plan, script, random.Random(seed))
        for fault, name in zip(FAULTS, ("f1", "f2", "f3"), strict=True):
            result: dict[str, Any] = {"fault": fault, "dataset": name}
            try:
                await run.one(fault, name, digests[name], result)
            except (ApiError, OSError, TimeoutError, RuntimeError) as exc:
                result.update(ok=False, error=" ".join(str(exc).split())[:200])
            results.append(result)
    finally:
        await client.close()
        await mesh.close_clients()
    return results


@dataclass
class _FaultRun:
    mesh: DataMesh
    client: ApiClient
    ledger: Path
    plan: Path
    script: Path
    rng: random.Random

    async def one(self, fault: str, name: str, digest: str, result: dict[str, Any]) -> None:
        """Submit a job reading ``name``; do ``fault`` while it stages; wait for its end."""
        mesh = self.mesh
        started = time.monotonic()
        python = mesh.job_python().executable
        command = [python, str(self.script), str(self.ledger), str(self.plan), "stage", name]
        spec = JobSpec.from_human(
            {"command": [*command, "0.5"], "resources": {"gpus_per_node": 1}, "datasets": [name]}
        )
        job_id = new_job_id()
        await self.client.submit(spec, job_id)
        if fault != "corrupt_holder":
            stager = await _staging_on(mesh, mesh.agents, digest)
            victim = mesh.agents[0] if fault == "holder_killed" else stager
            mesh.kill(victim)
            result["killed_agent"] = victim.index
            if fault == "stager_restarted":
                await asyncio.sleep(1.0)
                mesh.start_agent(victim)
        lines = await _until(
            f"{fault}: the job's end", functools.partial(_ended, self.ledger, job_id), JOB_WAIT_S
        )
        checks = [x for x in lines if x["kind"] == "verified"]
        result.update(
            dataset_verified=bool(checks) and all(x["ok"] for x in checks),
            job_runs=sum(1 for x in lines if x["kind"] == "start"),
            seconds=round(time.monotonic() - started, 1),
        )
        result["ok"] = result["dataset_verified"] and result["job_runs"] == 1
        if fault == "holder_killed":
            mesh.start_agent(mesh.agents[0])
            await mesh.wait_listening()
            back = functools.partial(_cordon, self.client, mesh.agents[0])
            await _until("the holder back, cordoned", back, 60)


async def _cordon(client: ApiClient, agent: AgentProcess) -> bool:
    try:
        await client.cordon(agent.node_id)
    except (ApiError, OSError, TimeoutError):
        return False
    return True


async def _staging_on(mesh: Any, runners: list[AgentProcess], digest: str) -> AgentProcess:
    """The runner staging ``digest``, once it holds a quarter of it."""

    async def find() -> AgentProcess | None:
        for a in runners:
            s = await _stage_of(mesh.client_of(a), digest)
            if s and s["state"] == "staging" and s["held_bytes"] * 4 >= s["total_bytes"] > 0:
                return a
        return None

    found: AgentProcess = await _until("a runner a quarter through its stage", find, 120)
    return found


async def _ended(ledger: Path, job_id: str) -> list[dict[str, Any]] | None:
    """The job's ledger lines once it has ended (``end``, or a failed check)."""
    lines = []
    with ledger.open() as f:
        for raw in f:
            line = json.loads(raw)
            if line["job"] == job_id:
                lines.append(line)
    done = any(
        x["kind"] in ("end", "failed") or (x["kind"] == "verified" and not x["ok"]) for x in lines
    )
    return lines if done else None
