"""A simulated mesh for the TUI: :class:`SimSource`, a MeshSource without agents.

A deterministic in-process mesh of N simulated hosts (the catalog's real models through
:class:`probers.sim.SimProber`; seeded; no processes, no network) that answers the same reads as
:class:`tui.source.ApiSource` with the same JSON shapes and accepts the same actions, recording
each one in :attr:`SimSource.actions`, so pilot tests, screenshots and the 1,000-host benchmark
run without agents. Its clock stands still unless ``live`` is set or :meth:`SimSource.advance` is
called.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import time
from base64 import b32encode
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from agent.job.jobspec import SUPPORTED_FEATURES, JobSpec, new_job_id
from agent.operator.client import ApiError
from agent.operator.upload import pack_folder
from agent.wire.codec import WIRE_VERSION
from agent.wire.documents import EventDoc, EventsDoc, JobDoc, NodeDoc, sample_json, static_json
from agent.wire.history import HistoryDoc, HistoryQuery
from agent.wire.records import TELEMETRY_EVERY_S, JobStatus
from agent.wire.usage import UsageRow
from probers.records import HostInfo
from probers.sim import SimProber, parse_profile
from tui.decode import snapshot_from_json
from tui.history import simulated
from tui.model import HISTORY_POINTS, HISTORY_STEP_S
from tui.preview import offers
from tui.simdata import (
    Attempt,
    RowsByNode,
    held_versions,
    idle_when_free,
    log_line,
    usage_rows,
)
from tui.simrecords import SimHost, SimJob
from tui.source import Identity

SIM_PROFILES: Final[tuple[str, ...]] = (
    "h100:8",
    "mi300x:8",
    "a100-80gb:4",
    "arc-a770:2",
    "m2-ultra",
    "l4:4",
    "rx-7900-xtx:2",
    "workstation",
)
"""The heterogeneous mix ``SimSource`` cycles through: NVIDIA, AMD, Intel and Apple hosts."""
BENCH_PROFILES: Final[tuple[str, ...]] = ("h100:8", "mi300x:8", "a100-80gb:8", "max-1100:8")
"""Eight GPUs on every host, for the 1,000-host benchmark."""
ZONES: Final[tuple[str, ...]] = ("eu-west", "us-east", "ap-south")
SIM_EPOCH: Final = 1_767_225_600.0
"""2026-01-01T00:00Z: the frozen clock's start, so screens are the same on every run."""
LOG_STEP_S: Final = 15.0
_LOAD_BY_KIND: Final[Mapping[str, tuple[float, float]]] = {
    "training": (93.0, 0.82),
    "inference": (48.0, 0.55),
    "batch": (71.0, 0.35),
}
"""Utilization and memory fraction a simulated job of each kind puts on its GPUs."""
_PREFIX: Final[Mapping[str, str]] = {"nvidia": "nv", "amd": "amd", "intel": "xe", "apple": "mac"}
_SHORT_NAMES: Final[Mapping[str, str]] = {
    "a100-80gb": "a100",
    "m2-ultra": "m2u",
    "m3-max": "m3max",
    "rx-7900-xtx": "rx7900",
    "arc-a770": "a770",
    "arc-b580": "b580",
    "rtx-4090": "4090",
    "max-1100": "max1100",
}
_OWNERS: Final[tuple[str, ...]] = ("alice", "bob", "carol", "dmitri", "erin")


def sim_node_id(seed: int, index: int) -> str:
    """A node id shaped like a real one (lowercase base32 of a hash), stable for (seed, index)."""
    digest = hashlib.sha256(f"shoal-sim|{seed}|{index}".encode()).digest()[:10]
    return b32encode(digest).decode("ascii").lower()


def _job_id(seed: int, n: int) -> str:
    return hashlib.sha256(f"shoal-sim-job|{seed}|{n}".encode()).hexdigest()[:32]


class SimSource:
    """``hosts`` simulated hosts; deterministic for a given ``seed`` (see the module doc).

    ``profiles`` are :mod:`probers.sim` profiles cycled over the hosts. With ``live`` the clock
    follows real time; otherwise it stands at :data:`SIM_EPOCH` until :meth:`advance`.
    ``latency_s`` delays every action, as a real round trip would (for demos).
    """

    def __init__(
        self,
        hosts: int = 12,
        *,
        seed: int = 0,
        profiles: Sequence[str] = SIM_PROFILES,
        live: bool = False,
        latency_s: float = 0.0,
        workload: bool = True,
        mesh_name: str = "sim-mesh",
    ) -> None:
        if hosts < 1:
            raise ValueError("a simulated mesh needs at least one host")
        self.seed = seed
        self.live = live
        self.latency_s = latency_s
        self._start_mono = time.monotonic()
        self._offset_s = 0.0
        self.identity = Identity(
            mesh_name=mesh_name,
            node_id=sim_node_id(seed, -1),
            role="operator",
            address="sim",
        )
        self.actions: list[tuple[str, dict[str, Any]]] = []
        """Every action received, in order: ``(kind, arguments)``."""
        self._events: list[EventDoc] = []
        self._jobs: dict[str, SimJob] = {}
        self._job_counter = 0
        self._held = RowsByNode()
        self._hosts = [self._make_host(i, profiles[i % len(profiles)]) for i in range(hosts)]
        self._by_id = {h.node_id: h for h in self._hosts}
        self._mark_unhealthy()
        if workload:
            self._seed_workload()
            # Two minutes on: temperatures have settled under the seeded load.
            self._offset_s += 120.0
        self._event("mesh", None, None, f"simulated mesh of {hosts} host{'s' * (hosts != 1)} ready")

    # -- clock ---------------------------------------------------------------------------------

    def now(self) -> float:
        live = time.monotonic() - self._start_mono if self.live else 0.0
        return SIM_EPOCH + self._offset_s + live

    def _mono(self) -> float:
        return self.now() - SIM_EPOCH

    def advance(self, seconds: float) -> None:
        """Move the simulated clock forward (jobs progress and finish, drains complete)."""
        self._offset_s += seconds
        self._settle()

    # -- building ------------------------------------------------------------------------------

    def _make_host(self, i: int, profile: str) -> SimHost:
        groups = parse_profile(profile)
        model = groups[0][0]
        apple = model.vendor == "apple"
        width = 4 if i >= 1000 else 3
        name_key = _SHORT_NAMES.get(model.key, model.key)
        hostname = f"{_PREFIX.get(model.vendor, 'gpu')}-{name_key}-{i:0{width}d}"
        node_id = sim_node_id(self.seed, i)
        prober = SimProber(profile, seed=self.seed * 100_003 + i, clock=self._mono, host_id=node_id)
        statics = list(prober.discover())
        ref = prober.host_info()
        host = HostInfo(
            hostname=hostname,
            os=ref.os if ref else "darwin" if apple else "linux",
            arch=ref.arch if ref else "arm64" if apple else "x86_64",
            cpu_count=ref.cpu_count if ref else 24 if apple else (64 if len(statics) < 8 else 192),
            mem_total_bytes=ref.mem_total_bytes
            if ref
            else (192 if apple else 512 if len(statics) < 8 else 2048) * 1024**3,
        )
        return SimHost(
            index=i,
            node_id=node_id,
            hostname=hostname,
            addr=f"10.{i // 250}.{i % 250}.{10 + i % 7}:7946",
            prober=prober,
            statics=statics,
            host=host,
            zone=ZONES[(i // 2) % len(ZONES)],
            age_s=round(0.4 + (i % 5) * 0.6, 1),
        )

    def _mark_unhealthy(self) -> None:
        """One suspect and one dead host in any mesh of six or more, to show staleness."""
        n = len(self._hosts)
        if n >= 6:
            self._hosts[4].state = "suspect"
            self._hosts[4].age_s = 38.0
        if n >= 8:
            self._hosts[n - 1].state = "dead"
            self._hosts[n - 1].age_s = 312.0
        if n >= 4:
            self._hosts[3].drain = "cordoned"

    def _seed_workload(self) -> None:
        now = self.now()
        kinds = ("training", "inference", "batch")
        for host in self._hosts:
            i = host.index
            if i % 3 == 2 or not host.statics:
                continue
            kind = kinds[i % 3 if i % 7 else 2]
            gpus = max(1, len(host.statics) // (2 if i % 2 else 1))
            if i % 5 == 4:
                gpus = 1
            command = {
                "training": ["python", "train.py", "--model", "llama-8b"],
                "inference": ["vllm", "serve", "mistral-7b"],
                "batch": ["python", "embed.py", "--shard", str(i)],
            }[kind]
            spec = JobSpec(
                command=tuple(command),
                kind=kind,  # type: ignore[arg-type]
                priority=(i % 3) * 10,
                datasets=("imagenet",) if kind == "training" else (),
            )
            spec = _with_gpus(spec, gpus)
            job = self._new_job(spec, user=_OWNERS[i % len(_OWNERS)], at=now - 600 - 37 * i)
            job.duration_s = 1800.0 + 300.0 * (i % 9)
            self._start(job, host, [d.key for d in host.statics[:gpus]], at=now - 240 - 41 * i)
        # A job nothing can hold, a finished one and a failed one.
        big = _with_gpus(JobSpec(command=("python", "pretrain.py"), kind="training"), 16)
        pending = self._new_job(big, user="alice", at=now - 90)
        pending.reason = self._fits(big)[1]
        done = self._new_job(
            _with_gpus(JobSpec(command=("python", "eval.py")), 1), user="bob", at=now - 3000
        )
        done.state, done.runner = "succeeded", self._hosts[0].node_id
        done.started_at, done.finished_at, done.exit_code = now - 2900, now - 1200, 0
        failed = self._new_job(
            _with_gpus(JobSpec(command=("./bench.sh", "--fp8")), 2), user="carol", at=now - 2000
        )
        failed.state, failed.runner = "failed", self._hosts[min(1, len(self._hosts) - 1)].node_id
        failed.started_at, failed.finished_at, failed.exit_code = now - 1990, now - 1900, 3

    def _new_job(self, spec: JobSpec, *, user: str, at: float, job_id: str | None = None) -> SimJob:
        self._job_counter += 1
        job_id = job_id or _job_id(self.seed, self._job_counter)
        owner = self._hosts[self._job_counter % len(self._hosts)].node_id
        job = SimJob(job_id=job_id, spec=spec, owner=owner, submitted_at=at, user=user)
        self._jobs[job_id] = job
        return job

    def _start(self, job: SimJob, host: SimHost, keys: list[str], *, at: float) -> None:
        job.state, job.runner, job.devices = "running", host.node_id, keys
        job.started_at, job.reason = at, None
        util, mem_frac = _LOAD_BY_KIND.get(job.spec.kind, (70.0, 0.4))
        for key in keys:
            total = next((d.mem_total_bytes for d in host.statics if d.key == key), None)
            mem = int((total or 0) * mem_frac)
            host.prober.set_load(key, util, mem)

    def _stop(self, job: SimJob, state: str, exit_code: int | None) -> None:
        host = self._by_id.get(job.runner or "")
        if host is not None:
            for key in job.devices:
                host.prober.clear_load(key)
        job.state, job.exit_code = state, exit_code
        job.finished_at = self.now()

    def _event(self, kind: str, node: str | None, job_id: str | None, message: str) -> None:
        self._events.append(
            EventDoc(len(self._events) + 1, self.now(), kind, node, job_id, message)
        )

    # -- the passing of time -------------------------------------------------------------------

    def _progress(self, job: SimJob) -> float | None:
        if job.state not in ("running", "migrating") or job.started_at is None:
            return 1.0 if job.state == "succeeded" else None
        done = job.done_before_s + max(0.0, self.now() - job.started_at)
        return min(1.0, done / job.duration_s)

    def _settle(self) -> None:
        now = self.now()
        for job in list(self._jobs.values()):
            progress = self._progress(job)
            if job.state == "running" and progress is not None and progress >= 1.0:
                self._stop(job, "succeeded", 0)
                self._event("job", job.runner, job.job_id, "succeeded (exit 0)")
        for host in self._hosts:
            if host.drain != "draining":
                continue
            running = [j for j in self._jobs.values() if j.live_on(host.node_id)]
            if running and host.drain_deadline is not None and now >= host.drain_deadline:
                for job in running:
                    self._move(job, None, reason="drain grace period over")
                running = [j for j in self._jobs.values() if j.live_on(host.node_id)]
            if not running:
                host.drain, host.drain_deadline = "drained", None
                self._event("drain", host.node_id, None, f"{host.hostname} drained")

    # -- reads ---------------------------------------------------------------------------------

    def backfill(self) -> Mapping[str, Sequence[float]]:
        out: dict[str, list[float]] = {}
        now = self.now()
        busy = {
            (j.runner, k): j for j in self._jobs.values() if j.state == "running" for k in j.devices
        }
        for host in self._hosts:
            for index, d in enumerate(host.statics):
                job = busy.get((host.node_id, d.key))
                phase = (host.index * 7 + index) % 11
                values: list[float] = []
                for p in range(HISTORY_POINTS):
                    at = now - (HISTORY_POINTS - 1 - p) * HISTORY_STEP_S
                    if job is not None and job.started_at is not None and at >= job.started_at:
                        base = _LOAD_BY_KIND.get(job.spec.kind, (70.0, 0.4))[0]
                        wobble = 6.0 * math.sin(p * 0.35 + phase) + 2.0 * math.sin(p * 1.7)
                        values.append(round(min(100.0, max(0.0, base + wobble)), 1))
                    else:
                        values.append(round(abs(math.sin(p * 0.9 + phase)), 1))
                out[f"{host.node_id}/{d.key}"] = values
        return out

    def _devices(self, host: SimHost) -> list[dict[str, Any]]:
        now = self.now()
        if host.frozen is not None and (host.state != "alive" or host.frozen_at == now):
            return host.frozen
        if host.static_json is None:  # made once, shared by every read, as a GPU's facts are
            host.static_json = [static_json(i, d) for i, d in enumerate(host.statics)]
        samples = {s.key: s for s in host.prober.sample()}
        devices = [
            {**static, **sample_json(samples[d.key])}
            for static, d in zip(host.static_json, host.statics, strict=True)
        ]
        host.frozen, host.frozen_at = devices, now
        return devices

    def nodes_now(self) -> list[dict[str, Any]]:
        """:meth:`nodes` without the await (for the benchmark and the placement preview)."""
        self._settle()
        running: dict[str, list[str]] = {}
        queued: dict[str, int] = {}
        for job in self._jobs.values():
            if job.runner is not None and job.state in ("running", "migrating", "placing"):
                running.setdefault(job.runner, []).append(job.job_id)
            if job.state == "pending":
                queued[job.owner] = queued.get(job.owner, 0) + 1
        out: list[dict[str, Any]] = []
        for host in self._hosts:
            doc = NodeDoc(
                node_id=host.node_id,
                addr=host.addr,
                state=host.state,
                role="agent",
                drain=host.drain,
                labels={"zone": host.zone, "os": host.host.os},
                host=host.host,
                devices=(),
                telemetry_age_s=host.age_s,
                telemetry_every_s=TELEMETRY_EVERY_S,  # a small mesh's heartbeat, as agents say it
                running_jobs=tuple(running.get(host.node_id, ())),
                queue=queued.get(host.node_id, 0),
                wire_version=WIRE_VERSION,
                features=tuple(sorted(SUPPORTED_FEATURES)),
                dataset_versions=held_versions(host.index, len(self._hosts), self.now()),
            )
            # the devices' documents are kept between reads (their facts do not change)
            out.append({**doc.to_wire(), "devices": self._devices(host)})
        return out

    def jobs_now(self) -> list[dict[str, Any]]:
        self._settle()
        out: list[dict[str, Any]] = []
        for job in self._jobs.values():
            progress = self._progress(job)
            eta = None
            if job.state == "running" and progress is not None and job.started_at is not None:
                eta = max(0.0, job.duration_s * (1.0 - progress))
            status = JobStatus(
                job_id=job.job_id,
                state=job.state,
                attempt=job.attempt,
                owner=job.owner,
                runner=job.runner,
                devices=tuple(job.devices),
                submitted_at=job.submitted_at,
                started_at=job.started_at,
                finished_at=job.finished_at,
                exit_code=job.exit_code,
                reason=job.reason,
            )
            spec = {**job.spec.to_dict(), "labels": {"user": job.user}}
            done = None if progress is None else round(progress, 4)
            out.append(JobDoc(status, spec, done, None if eta is None else round(eta)).to_wire())
        return out

    async def nodes(self) -> list[dict[str, Any]]:
        return self.nodes_now()

    async def jobs(self) -> list[dict[str, Any]]:
        return self.jobs_now()

    def events_now(self, since: int = 0) -> dict[str, Any]:
        new = tuple(e for e in self._events if e.seq > since)
        return EventsDoc(new, self._events[-1].seq if self._events else since).to_wire()

    async def events(self, since: int = 0) -> dict[str, Any]:
        return self.events_now(since)

    async def history(self, query: HistoryQuery, address: str) -> HistoryDoc:
        host = self._host(query.node or "")
        keys = tuple(d.key for d in host.statics if query.device in (None, d.key))
        jobs = (query.job,) if query.job else ()
        subjects = {"gpu": keys, "job": jobs}
        doc = simulated(query, {n: subjects.get(n.split(".")[0], ("",)) for n in query.series})
        key = (self.now(), query.from_s, len(self.actions), self._job_counter)
        held = self._held.get(key, lambda: self._usage(query.from_s), host.node_id)
        return idle_when_free(doc, held, [d.key for d in host.statics])

    def _usage(self, since: float) -> list[UsageRow]:
        now = self.now()
        model = {h.node_id: h.statics[0].name if h.statics else "cpu" for h in self._hosts}
        attempts = [
            Attempt(j.job_id, j.attempt, j.runner, j.user, model.get(j.runner, "cpu"),
                    len(j.devices), j.started_at, j.finished_at)
            for j in self._jobs.values()
            if j.runner is not None and j.started_at is not None
        ]  # fmt: skip
        hosts = [(h.node_id, model[h.node_id], len(h.statics)) for h in self._hosts]
        return usage_rows(attempts, hosts, now, since)

    async def usage(self, since: float) -> tuple[list[UsageRow], list[str]]:
        return self._usage(since), []

    async def logs(self, job_id: str, lines: int = 100, follow: bool = False) -> AsyncIterator[str]:
        job = self._jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"no job {job_id}")
        host = self._by_id.get(job.runner or "")
        header = [
            f"[shoal] job {job_id[:8]} attempt {job.attempt}: {' '.join(job.spec.command)}",
            f"[shoal] runner {host.hostname if host else '-'} devices {', '.join(job.devices)}",
        ]

        def steps_done() -> int:
            return int((self._progress(job) or 0.0) * job.duration_s / LOG_STEP_S)

        shown = steps_done()
        body = [log_line(s) for s in range(max(0, shown - lines), shown)]
        for text in (header + body)[-lines:]:
            yield text
        while follow and job.state in ("running", "migrating", "pending", "placing"):
            await asyncio.sleep(0.2)
            now_steps = steps_done()
            for s in range(shown, now_steps):
                yield log_line(s)
            shown = max(shown, now_steps)
        if job.state in ("succeeded", "failed", "cancelled"):
            yield f"[shoal] job {job.state} (exit {job.exit_code})"

    # -- actions -------------------------------------------------------------------------------

    async def _act(self, kind: str, **arguments: Any) -> None:
        self.actions.append((kind, arguments))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

    def _host(self, node: str) -> SimHost:
        host = self._by_id.get(node)
        if host is None:
            raise ApiError(404, f"no node {node}")
        return host

    def _job(self, job_id: str) -> SimJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"no job {job_id}")
        return job

    def _fits(
        self, spec: JobSpec, exclude: frozenset[str] = frozenset()
    ) -> tuple[list[tuple[str, tuple[str, ...]]], str]:
        """Where the agents' policy would start ``spec`` now, best first; else why it waits."""
        snapshot = snapshot_from_json(self.now(), self.nodes_now(), self.jobs_now())
        rows, answer = offers(spec, snapshot, exclude=exclude)
        return [(f.node_id, f.devices) for f in rows], answer.line

    def _move(self, job: SimJob, target: str | None, *, reason: str) -> bool:
        """Restart a running job elsewhere (``target`` or the best fit); False when none fits."""
        source = job.runner
        fits, _ = self._fits(job.spec, exclude=frozenset({source or ""}))
        if target is not None:
            fits = [f for f in fits if f[0] == target]
        if not fits:
            return False
        node, keys = fits[0]
        done = job.done_before_s + max(0.0, self.now() - (job.started_at or self.now()))
        self._stop(job, "migrating", None)
        job.finished_at, job.exit_code = None, None
        job.done_before_s = done
        job.attempt += 1
        self._start(job, self._by_id[node], list(keys), at=self.now())
        self._event(
            "job",
            node,
            job.job_id,
            f"migrated from {self._hostname(source)} to {self._by_id[node].hostname} ({reason})",
        )
        return True

    def _hostname(self, node: str | None) -> str:
        host = self._by_id.get(node or "")
        return host.hostname if host else (node or "-")[:8]

    async def submit(
        self, spec: JobSpec, job_id: str | None = None, workdir: Path | None = None
    ) -> dict[str, Any]:
        job_id = job_id or new_job_id()
        if workdir is not None:  # packed as for a real mesh (its refusals), sent nowhere
            try:
                _, packed = await pack_folder(workdir)
            except (ValueError, OSError) as exc:
                raise ApiError(400, f"workdir {workdir}: {exc}; nothing submitted") from None
            spec = dataclasses.replace(spec, workdir_digest=packed.manifest.digest)
        await self._act("submit", job_id=job_id, spec=spec.to_dict())
        job = self._new_job(spec, user=self.identity.role, at=self.now(), job_id=job_id)
        fits, why = self._fits(spec)
        if fits:
            node, keys = fits[0]
            self._start(job, self._by_id[node], list(keys), at=self.now())
            self._event("job", node, job_id, f"submitted, running on {self._hostname(node)}")
        else:
            job.reason = why
            self._event("job", None, job_id, f"submitted, pending: {job.reason}")
        return {"job_id": job_id, "state": job.state, "runner": job.runner}

    async def cancel(self, job_id: str) -> dict[str, Any]:
        await self._act("cancel", job_id=job_id)
        job = self._job(job_id)
        if job.state not in ("pending", "placing", "running", "migrating"):
            raise ApiError(409, f"job {job_id[:8]} is already {job.state}")
        self._stop(job, "cancelled", None)
        self._event("job", job.runner, job_id, "cancelled by the operator")
        return {"job_id": job_id, "state": job.state}

    async def migrate(self, job_id: str, target: str | None = None) -> dict[str, Any]:
        await self._act("migrate", job_id=job_id, target=target)
        job = self._job(job_id)
        if job.state != "running":
            raise ApiError(409, f"job {job_id[:8]} is {job.state}, not running")
        if target is not None:
            self._host(target)
        if not self._move(job, target, reason="operator"):
            where = self._hostname(target) if target else "any other host"
            raise ApiError(409, f"job {job_id[:8]} does not fit on {where}")
        return {"job_id": job_id, "state": job.state, "runner": job.runner}

    async def cordon(self, node: str) -> dict[str, Any]:
        await self._act("cordon", node=node)
        return self._set_drain(node, "cordoned", None, "cordoned")

    async def drain(self, node: str, grace_s: float = 300.0) -> dict[str, Any]:
        await self._act("drain", node=node, grace_s=grace_s)
        deadline = self.now() + grace_s
        return self._set_drain(node, "draining", deadline, f"draining (grace {grace_s:g} s)")

    async def undrain(self, node: str) -> dict[str, Any]:
        await self._act("undrain", node=node)
        return self._set_drain(node, "schedulable", None, "schedulable again")

    def _set_drain(
        self, node: str, drain: str, deadline: float | None, said: str
    ) -> dict[str, Any]:
        host = self._host(node)
        host.drain, host.drain_deadline = drain, deadline
        self._event("drain", node, None, f"{host.hostname} {said}")
        return {"node": node, "drain": host.drain}

    async def close(self) -> None:
        return None

    # -- for tests -----------------------------------------------------------------------------

    def node_id_of(self, hostname: str) -> str:
        for host in self._hosts:
            if host.hostname == hostname:
                return host.node_id
        raise KeyError(hostname)

    def drain_of(self, node: str) -> str:
        return self._host(node).drain

    def job_state(self, job_id: str) -> str:
        return self._job(job_id).state


def _with_gpus(spec: JobSpec, gpus: int) -> JobSpec:
    from dataclasses import replace

    return replace(spec, resources=replace(spec.resources, gpus_per_node=gpus))
