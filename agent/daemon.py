"""The Shoal agent: probes + gossip + owner and runner logic + the HTTP API, in one process.

Startup: load the identity (role ``agent``), open the store (count a boot, refuse another node's
file), open the probe, reconcile processes recorded before a restart (survivors are killed, all
reported lost to their owners), start the gossip member with the API on its listener, publish the
inventory, then run three loops: telemetry (sample every ``probe_interval_s``; publish on change
beyond 5 util points, 1 GiB or 3 degrees, at most once a second, at least every
``telemetry_heartbeat_s``), the owner's placement loop, and a sweep (takeovers, replicas, the
``node`` record). Owned jobs from the store resume a few seconds after joining, once gossip had a
chance to tell whether another agent took them over meanwhile.

SIGTERM: running jobs are stopped with their checkpoint signal (cause ``shutdown``) and reported,
so their owners requeue them on other nodes; then the agent leaves the mesh gracefully and the
next agent in rendezvous order takes over the jobs it owned.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import time
from collections import Counter
from typing import Any

from aiohttp import web

from agent import api
from agent.authority import Authority, SubmissionRefused
from agent.config import AgentConfig
from agent.events import EventLog
from agent.executor import ExecutorConfig, ProcessExecutor
from agent.jobspec import check_job_id
from agent.metrics import AgentMetrics
from agent.owner import LAUNCH_FAILED, Owner, OwnerError, store_replica
from agent.ownership import owner_of
from agent.peers import PeerClient, PeerError, PeerUnreachable
from agent.placement import FirstFit, Placement
from agent.runner import Declined, LaunchFailed, NotAllowed, Runner
from agent.store import Store
from agent.view import (
    STATE_NAMES,
    ClusterView,
    device_json,
    live_agents,
    pack,
    sample_to_wire,
    static_to_wire,
)
from gossip import envelope, revocation
from gossip.certtrust import CertTrust
from gossip.events import Event, MemberDead, MemberLeft, RecordChanged
from gossip.identity import IdentityError, load_identity
from gossip.messages import MemberState
from gossip.node import GossipNode
from gossip.replay import ReplayGuard
from gossip.revocation import REVOCATIONS_FILE, RevocationError, RevocationList
from gossip.transport import split_address
from probers.host import HostProbe, ProbeOptions
from probers.records import Device, ProbeReport

log = logging.getLogger("shoal.agent")

GIB = 1024**3
RESUME_AFTER_S = 3.0
SWEEP_S = 1.0
PROGRESS_EVERY_S = 2.0
"""A change in running jobs' progress alone republishes the node record at most this often;
what placement reads (drain, queue, running jobs, free devices) is republished at once."""
EVENTS_EVERY_S = 1.0
"""This node's recent events are republished at most this often (each event used to resend
them all: a third of the gossip bytes of a mesh under load)."""
_PLACEMENT_FIELDS = ("drain", "queue", "running", "free")


class Agent:
    def __init__(self, config: AgentConfig, placement: Placement | None = None) -> None:
        self.config = config
        self.identity = load_identity(config.identity_path)
        if self.identity.role != "agent":
            raise IdentityError(f"{config.identity_path} holds an {self.identity.role} identity")
        self.node_id = self.identity.node_id
        self.trust = CertTrust(self.identity.ca_certificate)
        self.rejections: Counter[str] = Counter()
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._revocations_path = config.data_dir / REVOCATIONS_FILE
        self._load_revocations()
        self.revoked = asyncio.Event()
        """Set once this node learns that its own certificate is revoked: it then stops."""
        self.store = Store(config.data_dir / "agent.sqlite")
        self.store.set_node_id(self.node_id)
        self.boot = self.store.next_boot()
        self.guard = ReplayGuard()
        now = time.time()
        self.guard.restore(self.store.seen_commands(now - self.guard.window_s), now)
        self.authority = Authority(
            self.node_id,
            self.trust,
            self.live_agents,
            self.live_for_s,
            time.time,
            heard_of=lambda node: self._started and self.node.peer.member(node) is not None,
        )
        self.view = ClusterView(self.authority)
        self.events = EventLog(self.node_id)
        self.peers = PeerClient(
            self.identity,
            timeout_s=config.rpc_timeout_s,
            shared=lambda: self.node.client_session(),
        )
        self.probe = HostProbe.from_options(ProbeOptions(sim=config.sim, sim_seed=config.sim_seed))
        self.probe.open()
        self.report: ProbeReport = self.probe.refresh()
        self._sim = next((p for p in self.probe.probers if p.source == "sim"), None)
        self.executor = ProcessExecutor(
            ExecutorConfig(
                data_dir=config.data_dir, grace_s=config.stop_grace_s, job_user=config.job_user
            ),
            on_event=lambda e: self.runner.on_exec_event(e),
        )
        self.runner = Runner(
            self.node_id,
            self.store,
            self.view,
            self.peers,
            self.events,
            self.executor,
            self.authority,
            statics=lambda: [d.static for d in self.report.devices if d.static.backend != "cpu"],
            set_load=self._set_load,
            live_agents=self.live_agents,
            addr_of=self.addr_of,
            on_change=self.node_changed,
            stop_grace_s=config.stop_grace_s,
        )
        self.owner = Owner(
            self.node_id,
            self.store,
            self.view,
            self.peers,
            self.events,
            placement or FirstFit(),
            self.authority,
            publish=self.publish,
            live_agents=self.live_agents,
            addr_of=self.addr_of,
            on_change=self.node_changed,
            stop_grace_s=config.stop_grace_s,
            is_gone=self.is_gone,
        )
        self.metrics = AgentMetrics(self._metrics_snapshot)
        host, port = split_address(config.listen, allow_any_port=True)
        self.node = GossipNode(
            self.identity,
            self.trust,
            host=host,
            port=port,
            advertise_host=config.advertise,
            seeds=config.join,
            app_setup=lambda app: api.setup(app, self),
            on_revocations=self._revocations_changed,
        )
        self.node.subscribe(self._on_gossip)
        self._tasks: list[asyncio.Task[None]] = []
        self._node_dirty = True
        self._node_doc: dict[str, Any] = {}
        self._node_at = float("-inf")
        self._events_dirty = False
        self._events_at = float("-inf")
        self._started = False
        self._stopping = False
        self._members_changed = asyncio.Event()
        self._last_telemetry: dict[str, tuple[float, float, float]] = {}
        self._telemetry_at = float("-inf")

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def is_revoked(self) -> bool:
        """Does the revocation list this agent holds name this node (or its certificate)?"""
        serial = self.identity.certificate.serial_number
        return self.trust.revocations.revokes(self.node_id, serial)

    def _load_revocations(self) -> None:
        """The list kept from before a restart: verified again, applied before anything else."""
        try:
            stored = revocation.load(self._revocations_path)
            if stored is not None:
                self.trust.apply_revocations(stored, time.time())
        except RevocationError as exc:
            log.warning("ignoring %s: %s", self._revocations_path, exc)

    def _revocations_changed(self, revocations: RevocationList) -> None:
        """Keep the newer list (0600, replaced atomically); stop if it names this node."""
        revocation.save(self._revocations_path, revocations)
        if self.is_revoked and not self.revoked.is_set():
            log.error(
                "this node's certificate is revoked (list version %d): stopping",
                revocations.version,
            )
            self.events.add("revoked", "this node is revoked: it stops its jobs and the agent")
            self._stopping = True  # from now on it takes nothing over
            self.revoked.set()

    async def start(self) -> None:
        self.runner.reconcile()
        await self.node.start()
        self._started = True
        self.events.on_own = self._events_changed
        self.node.publish_revocations()
        self.publish_inventory()
        self._publish_telemetry(force=True)
        self._publish_node(time.monotonic())
        self.owner.start()
        self._tasks = [
            asyncio.create_task(self._telemetry_loop(), name="telemetry"),
            asyncio.create_task(self._sweep_loop(), name="sweep"),
            asyncio.create_task(self._resume_later(), name="resume"),
        ]
        self.events.add(
            "agent_started",
            f"boot {self.boot} at {self.node.address} with {len(self.report.devices)} device(s)",
        )

    async def stop(self) -> None:
        """Graceful: stop and report local jobs, leave the mesh, close everything."""
        self.events.add("agent_stopping", "stopping local jobs and leaving the mesh")
        self._publish_events(time.monotonic())
        self._stopping = True
        for task in self._tasks:  # no more sweeps or resumes: the agents that stay take over
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.shutdown()
        await self.owner.close()
        await self.runner.close()
        await self.node.stop(leave=True)
        await self.peers.close()
        self.probe.close()
        self.store.close()

    # -- helpers for owner and runner ------------------------------------------------------------

    def publish(self, kind: str, payload: bytes) -> None:
        if self._started:
            self.node.publish(kind, payload)

    def live_agents(self) -> list[str]:
        """Agents alive or suspect here, this one included; never a revoked one."""
        members = self.node.members() if self._started else []
        roles = {m.node: self.trust.role_of(m.node) or "" for m in members}
        roles[self.node_id] = "agent"
        live = live_agents(members, roles)
        if self.node_id not in live:
            live.append(self.node_id)
        return live

    def live_for_s(self, node_id: str) -> float:
        """How long ``node_id`` has been alive in this agent's view (0 when it is not)."""
        member = self.node.peer.member(node_id) if self._started else None
        if member is None or member.state != MemberState.ALIVE:
            return 0.0
        return time.monotonic() - member.state_since

    def is_gone(self, node_id: str) -> bool:
        """Membership holds the node dead or left (not merely unheard of)."""
        member = self.node.peer.member(node_id) if self._started else None
        return member is not None and member.state in (MemberState.DEAD, MemberState.LEFT)

    def addr_of(self, node_id: str) -> str | None:
        if node_id == self.node_id:
            return self.node.address if self._started else None  # None until the server binds
        member = self.node.peer.member(node_id)
        return member.addr if member is not None and member.addr else None

    def member_count(self) -> int:
        return sum(
            1 for m in self.node.members() if m.state in (MemberState.ALIVE, MemberState.SUSPECT)
        )

    async def wait_members(self, count: int, timeout_s: float) -> int:
        """Until this agent counts ``count`` live members (itself included), or ``timeout_s``
        passed; the count then. Woken by membership events, so a watcher costs nothing while it
        waits (polling 32 agents every 50 ms was a fifth of a 2-core machine while a mesh forms).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._members_changed.clear()  # before counting: a change from here on wakes us
            count_now = self.member_count()
            left_s = deadline - time.monotonic()
            if count_now >= count or left_s <= 0:
                return count_now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left_s):
                    await self._members_changed.wait()

    def node_changed(self) -> None:
        self._node_dirty = True

    def _set_load(self, key: str, on: bool) -> None:
        sim: Any = self._sim
        if sim is None:
            return
        if on:
            total = next(
                (d.static.mem_total_bytes for d in self.report.devices if d.static.key == key),
                None,
            )
            sim.set_load(key, 90.0, int((total or 0) * 0.5))
        else:
            sim.clear_load(key)

    # -- gossip events ---------------------------------------------------------------------------

    def _on_gossip(self, event: Event) -> None:
        if isinstance(event, RecordChanged):
            job_id = self.view.apply(event.origin, event.kind, event.payload, time.monotonic())
            if job_id is not None:
                self.runner.on_job_record(job_id)
            elif event.kind == "events":
                self.events.merge(event.origin, self.view.events.get(event.origin, []))
            elif event.kind == "node":
                self.owner.kick()
            return
        self._members_changed.set()  # a membership event: wake the /healthz watches
        for job_id in self.view.membership_changed():
            self.runner.on_job_record(job_id)
        if isinstance(event, MemberDead | MemberLeft) and event.node != self.node_id:
            how = "dead" if isinstance(event, MemberDead) else "left"
            self.events.add("member_" + how, f"{event.node[:8]} is {how}")
            if not self._stopping:  # leaving: the agents that stay take over, not us
                self.owner.member_gone(event.node)

    # -- publishing ------------------------------------------------------------------------------

    def publish_inventory(self) -> None:
        devices = [static_to_wire(d.static) for d in self.report.devices]
        host = self.report.host
        if self.config.name:
            host = dataclasses.replace(host, hostname=self.config.name)
        doc: dict[str, Any] = {
            "host": host.to_json(),
            "api": self.node.address,
            "labels": self.config.all_labels(),
            "devices": devices,
            "boot": self.boot,
        }
        payload = pack(doc)
        while len(payload) > 4096 and doc["devices"]:
            doc["devices"] = doc["devices"][:-1]
            payload = pack(doc)
        self.publish("inventory", payload)

    def _publish_telemetry(self, *, force: bool = False) -> None:
        now = time.monotonic()
        current = {
            d.static.key: (
                d.sample.util_pct or 0.0,
                float(d.sample.mem_used_bytes or 0),
                d.sample.temp_c or 0.0,
            )
            for d in self.report.devices
        }
        changed = any(
            key not in self._last_telemetry
            or abs(u - self._last_telemetry[key][0]) >= 5
            or abs(m - self._last_telemetry[key][1]) >= GIB
            or abs(t - self._last_telemetry[key][2]) >= 3
            for key, (u, m, t) in current.items()
        )
        heartbeat = now - self._telemetry_at >= self.config.telemetry_heartbeat_s
        if not force and not heartbeat and not (changed and now - self._telemetry_at >= 1.0):
            return
        self._last_telemetry = current
        self._telemetry_at = now
        rows = [sample_to_wire(d.sample) for d in self.report.devices]
        self.publish("telemetry", pack({"at": time.time(), "s": rows}))

    def _publish_node(self, now: float) -> None:
        """The node record, when it says something new (see :data:`PROGRESS_EVERY_S`)."""
        progress = {
            j: [f, eta] for j, (f, eta) in self.runner.progress.items() if j in self.runner.runs
        }
        doc: dict[str, Any] = {
            "drain": self.runner.drain.value,
            "queue": self.owner.queue_length(),
            "running": sorted(self.runner.runs),
            "free": self.runner.free_devices(),
            "progress": progress,
        }
        if all(doc[k] == self._node_doc.get(k) for k in _PLACEMENT_FIELDS):
            if progress == self._node_doc.get("progress"):
                self._node_dirty = False  # an owner's save that changed nothing others read
                return
            if now - self._node_at < PROGRESS_EVERY_S:
                return  # still dirty: the progress goes out when the interval is up
        self._node_dirty = False
        self._node_doc, self._node_at = doc, now
        self.publish("node", pack(doc))

    def _events_changed(self) -> None:
        self._events_dirty = True

    def _publish_events(self, now: float) -> None:
        self._events_dirty = False
        self._events_at = now
        payload = pack(self.events.gossip_payload())
        if len(payload) <= 4096:
            self.publish("events", payload)

    async def _telemetry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            if self._sim is None:
                self.report = await asyncio.to_thread(self.probe.refresh)
            else:
                self.report = self.probe.refresh()
            self._publish_telemetry()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if self._node_dirty:
                self._publish_node(now)
            if self._events_dirty and now - self._events_at >= EVENTS_EVERY_S:
                self._publish_events(now)
            if now - getattr(self, "_swept", 0.0) >= SWEEP_S:
                self._swept = now
                self.owner.sweep()

    async def _resume_later(self) -> None:
        await asyncio.sleep(RESUME_AFTER_S)
        log.info("resumed %d job(s) owned before this start", self.owner.resume())

    # -- commands --------------------------------------------------------------------------------

    async def execute_command(self, data: bytes, *, forwarded: bool) -> tuple[int, dict[str, Any]]:
        try:
            command = envelope.open(
                data, self.trust, self.guard, time.time(), rejections=self.rejections
            )
        except envelope.EnvelopeError as exc:
            self.metrics.commands_rejected[exc.reason] += 1
            status = api.ENVELOPE_STATUS.get(type(exc), 400)
            return status, {"error": f"{exc.reason}: {exc}"}
        # Remembered before it acts: a restarted agent still refuses it as a replay.
        self.store.remember_command(
            command.command_id, command.issued_at, time.time() - self.guard.window_s
        )
        try:
            body = json.loads(command.body)
            if not isinstance(body, dict):
                raise ValueError("the command body must be a JSON object")
            status, answer = await self._dispatch(command.kind, body, data, forwarded)
        except (ValueError, KeyError, TypeError) as exc:
            self.metrics.commands_rejected["bad_body"] += 1
            return 400, {"error": f"bad {command.kind} command: {exc}"}
        except OwnerError as exc:
            return exc.status, {"error": str(exc)}
        except RevocationError as exc:
            self.metrics.commands_rejected["bad_revocations"] += 1
            return 400, {"error": f"revocation list refused: {exc}"}
        if status < 300:
            self.metrics.commands_accepted[command.kind] += 1
        return status, answer

    async def _forward(self, node: str, data: bytes) -> tuple[int, dict[str, Any]]:
        addr = self.addr_of(node)
        if addr is None:
            return 503, {"error": f"no address for node {node}"}
        try:
            return await self.peers.post(
                addr,
                "/v1/internal/command",
                data,
                "application/octet-stream",
                timeout_s=self.config.rpc_timeout_s * 3,
                warm=True,
            )
        except PeerUnreachable as exc:
            return 503, {"error": f"node {node[:8]} did not answer: {exc}"}

    def _job_owner(self, job_id: str) -> str | None:
        live = self.live_agents()
        if job_id in self.owner.jobs:
            return self.node_id
        doc = self.view.jobs.get(job_id)
        if doc is not None and doc.get("owner") in live:
            return str(doc["owner"])
        return None

    async def _dispatch(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> tuple[int, dict[str, Any]]:
        if kind == "submit":
            sub = self.authority.submission(data)
            owner = self._job_owner(sub.job_id) or owner_of(sub.job_id, self.live_agents())
            if forwarded or owner in (None, self.node_id):
                return 200, await self.owner.submit(sub)
            return await self._forward(owner or "", data)
        if kind in ("cancel", "migrate"):
            job_id = check_job_id(body["job_id"])
            owner = self._job_owner(job_id)
            if owner is None and not forwarded:
                # Not heard of yet here (gossip is still carrying it): ask its rendezvous owner.
                owner = owner_of(job_id, self.live_agents())
            if owner is None or (forwarded and owner != self.node_id):
                return 404, {"error": f"unknown job {job_id} here (or its owner is gone; retry)"}
            if owner != self.node_id:
                if forwarded:
                    return 409, {"error": f"job {job_id} is owned by {owner[:8]}"}
                return await self._forward(owner, data)
            if kind == "cancel":
                return 200, await self.owner.cancel(job_id)
            target = body.get("target")
            if target is not None and not isinstance(target, str):
                raise ValueError("target must be a node id or null")
            return 200, await self.owner.migrate(job_id, target)
        if kind in ("cordon", "drain", "undrain"):
            node = body["node"]
            if not isinstance(node, str):
                raise ValueError("node must be a node id")
            if node != self.node_id:
                if forwarded:
                    return 409, {"error": f"this is {self.node_id[:8]}, not {node[:8]}"}
                if node not in self.live_agents():
                    return 404, {"error": f"no live agent {node}"}
                return await self._forward(node, data)
            grace = body.get("grace_s")
            if grace is not None and (not isinstance(grace, int | float) or grace < 0):
                raise ValueError("grace_s must be a non-negative number")
            state = self.runner.command(kind, grace, self.config.drain_grace_s)
            self.owner.kick()
            return 200, {"node": self.node_id, "drain": state}
        if kind == "revoke":
            incoming = revocation.decode(base64.b64decode(body["revocations"], validate=True))
            applied = self.node.revoke(incoming)
            return 200, {
                "version": self.node.revocations.version,
                "applied": applied,
                "revoked": sorted(self.node.revocations.node_ids),
            }
        return 400, {"error": f"unknown command kind {kind!r}"}

    # -- internal RPC ----------------------------------------------------------------------------

    async def internal(self, op: str, body: dict[str, Any], caller: str) -> dict[str, Any]:
        try:
            return await self._internal(op, body, caller)
        except (NotAllowed, SubmissionRefused) as exc:
            self.metrics.internal_refused[op] += 1
            log.warning("refused %s from %s: %s", op, caller[:8], exc)
            raise api.ApiError(403, str(exc)) from None
        except OwnerError as exc:
            if exc.status == 403:
                self.metrics.internal_refused[op] += 1
                log.warning("refused %s from %s: %s", op, caller[:8], exc)
            raise api.ApiError(exc.status, str(exc)) from None
        except LaunchFailed as exc:
            raise api.ApiError(LAUNCH_FAILED, str(exc)) from None
        except Declined as exc:
            raise api.ApiError(409, str(exc)) from None

    async def _internal(self, op: str, body: dict[str, Any], caller: str) -> dict[str, Any]:
        if op == "replicate":
            store_replica(self.store, body, caller, self.authority)
            return {"ok": True}
        if op == "adopt":
            return self.owner.adopt_wire(body, caller)
        if op == "start":
            return await self.runner.start(body, caller)
        if op == "stop":
            return await self.runner.stop(body, caller)
        if op == "status":
            return self.runner.status(str(body["job_id"]))
        if op == "report":
            return self.owner.report(caller, body)
        if op == "job":
            job = self.owner.jobs.get(str(body["job_id"]))
            if job is None:
                raise api.ApiError(404, "not owned here")
            return job.to_json()
        raise api.ApiError(404, f"unknown internal call {op!r}")

    # -- reads -----------------------------------------------------------------------------------

    def _job_from_doc(self, doc: dict[str, Any]) -> dict[str, Any]:
        job_id = str(doc.get("job_id"))
        runner = doc.get("runner")
        progress = eta = None
        if runner is not None and doc.get("state") == "running":
            status = self.view.node(str(runner)).status or {}
            p = status.get("progress", {}).get(job_id)
            if isinstance(p, list) and len(p) == 2:
                progress, eta = p
        elif doc.get("state") == "succeeded":
            progress, eta = 1.0, 0.0
        return {
            "job_id": job_id,
            "state": doc.get("state"),
            "attempt": doc.get("attempt"),
            "owner": doc.get("owner"),
            "runner": runner,
            "devices": doc.get("devices", []),
            "spec": doc.get("spec"),
            "submitted_at": doc.get("submitted_at"),
            "started_at": doc.get("started_at"),
            "finished_at": doc.get("finished_at"),
            "exit_code": doc.get("exit_code"),
            "reason": doc.get("reason"),
            "progress": progress,
            "eta_s": eta,
        }

    def jobs_json(self) -> list[dict[str, Any]]:
        docs = sorted(self.view.jobs.values(), key=lambda d: d.get("submitted_at") or 0.0)
        return [self._job_from_doc(d) for d in docs]

    async def job_json(self, job_id: str) -> dict[str, Any] | None:
        owned = self.owner.jobs.get(job_id)
        if owned is not None:
            return self._job_from_doc(owned.to_json())
        doc = self.view.jobs.get(job_id)
        if doc is None:
            return None
        out = self._job_from_doc(doc)
        owner = doc.get("owner")
        if out["spec"] is None and isinstance(owner, str):
            addr = self.addr_of(owner)
            if addr is not None:
                with contextlib.suppress(PeerError):
                    full = await self.peers.call(addr, "job", {"job_id": job_id})
                    out["spec"] = full.get("spec")
        return out

    def nodes_json(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for m in sorted(self.node.members(), key=lambda m: m.node):
            view = self.view.nodes.get(m.node)
            inv = (view.inventory if view else None) or {}
            status = (view.status if view else None) or {}
            devices = []
            if view is not None:
                devices = [
                    device_json(i, s, view.samples.get(s.key)) for i, s in enumerate(view.statics)
                ]
            age = (
                now - view.telemetry_received_at
                if view is not None and view.telemetry_received_at is not None
                else None
            )
            out.append(
                {
                    "node_id": m.node,
                    "addr": m.addr,
                    "state": STATE_NAMES.get(m.state, "unknown"),
                    "role": self.trust.role_of(m.node)
                    or ("agent" if m.node == self.node_id else None),
                    "drain": status.get("drain") if status else None,
                    "labels": inv.get("labels", {}),
                    "host": inv.get("host"),
                    "devices": devices,
                    "telemetry_age_s": age,
                    "running_jobs": status.get("running", []),
                    "queue": status.get("queue", 0),
                }
            )
        return out

    # -- logs ------------------------------------------------------------------------------------

    async def logs(
        self, request: web.Request, job_id: str, lines: int, follow: bool
    ) -> web.StreamResponse:
        check_job_id(job_id)
        owned = self.owner.jobs.get(job_id)
        doc = owned.to_json() if owned is not None else self.view.jobs.get(job_id)
        if doc is None:
            return api.error(404, f"unknown job {job_id}")
        runner = doc.get("runner") or self._last_runner(job_id)
        if runner is None or runner == self.node_id:
            return await self.local_logs(request, job_id, lines, follow)
        addr = self.addr_of(str(runner))
        if addr is None:
            return api.error(503, f"runner {str(runner)[:8]} is unreachable")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        path = f"/v1/internal/logs/{job_id}?lines={lines}&follow={int(follow)}"
        try:
            async for chunk in self.peers.stream(addr, path):
                await response.write(chunk)
        except PeerError as exc:
            await response.write(f"[shoal] log stream ended: {exc}\n".encode())
        await response.write_eof()
        return response

    def _last_runner(self, job_id: str) -> str | None:
        if self.store.results(job_id) or job_id in self.runner.runs:
            return self.node_id
        return None

    async def local_logs(
        self, request: web.Request, job_id: str, lines: int, follow: bool
    ) -> web.StreamResponse:
        check_job_id(job_id)
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        if not follow:
            async with contextlib.aclosing(self.runner.tail(job_id, lines)) as blocks:
                async for block in blocks:
                    await response.write(block)  # waits while the reader lags: nothing piles up
        else:
            async for line in self.runner.follow(job_id, lines):
                await response.write((line + "\n").encode())
        await response.write_eof()
        return response

    # -- metrics ---------------------------------------------------------------------------------

    def _metrics_snapshot(self) -> dict[str, Any]:
        jobs: Counter[str] = Counter(str(d.get("state")) for d in self.view.jobs.values())
        members: Counter[str] = Counter(
            STATE_NAMES.get(m.state, "unknown") for m in self.node.members()
        )
        devices: list[Device] = list(self.report.devices)
        return {
            "node": self.node_id,
            "devices": devices,
            "jobs_by_state": dict(jobs),
            "members_by_state": dict(members),
            "running_here": len(self.runner.runs),
            "queue": self.owner.queue_length(),
            "gossip": self.node.stats(),
            "records_refused": self.view.refused,
        }
