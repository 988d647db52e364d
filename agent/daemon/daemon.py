"""The Shoal agent: probes + gossip + owner and runner logic + the HTTP API, in one process.

This module wires the parts together and starts their loops (``agent.daemon.loops``); each part
lives in its own module:
``agent.mesh.mesh`` (membership as the agent reads it), ``agent.daemon.devices`` and
``agent.daemon.publisher`` (what the agent says of itself), ``agent.owning.owner`` and
``agent.running.runner`` (the job protocol, sharing one ``agent.mesh.context.AgentContext``),
``agent.daemon.commands`` and ``agent.daemon.calls`` (operator commands and calls between agents,
each a table), ``agent.daemon.reads`` (what the API reads), ``agent.daemon.api`` (routes),
``agent.daemon.policywire`` (the team policy held, gossiped and learnt).

Startup: load the identity (role ``agent``) and the revocation list kept from before, open the
store (count a boot, refuse another node's file, restore the replay memory), open the probe,
reconcile processes recorded before a restart (survivors are killed, all reported lost to their
owners), start the gossip member with the API on its listener, publish the inventory, then run
loops: telemetry (sample every ``probe_interval_s``, publish per ``agent.daemon.publisher``), the
owner's placement loop, and a sweep (the node record and events when due, takeovers, handovers,
replicas). Owned jobs from the store resume a few seconds after joining, once gossip had a
chance to tell whether another agent took them over meanwhile.

SIGTERM: running jobs are stopped with their checkpoint signal (cause ``shutdown``) and reported,
so their owners requeue them on other nodes; then the agent leaves the mesh gracefully and the
next agent in rendezvous order takes over the jobs it owned. A revoked agent does the same and
exits (see ``revoked``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections import Counter
from typing import Any

from agent.checkpoints.ckptstore import KIND as CHECKPOINT
from agent.checkpoints.ckptstore import Checkpoints
from agent.common.eachjob import one_job
from agent.content.fetch import SLOT_BYTES, PeerHolder
from agent.content.routes import ContentServer
from agent.content.stage import Stager
from agent.content.swarm import SwarmLimits
from agent.daemon import api, jobenvs, loops
from agent.daemon.calls import Calls
from agent.daemon.commands import Commands
from agent.daemon.config import AgentConfig
from agent.daemon.datastore import NodeData
from agent.daemon.devices import HostDevices
from agent.daemon.metrics import AgentMetrics
from agent.daemon.policywire import PolicyWire
from agent.daemon.publisher import Publisher
from agent.daemon.reads import Reads
from agent.execution.containers import find_runtime
from agent.execution.executor import ProcessExecutor
from agent.execution.launch import ExecutorConfig
from agent.history.history_hints import GpuFacts
from agent.history.history_sample import NodeSampler
from agent.history.history_store import open_history
from agent.history.usage_book import UsageBook
from agent.job.authority import Authority
from agent.job.jobspec import HOST_ONLY_FEATURES, SUPPORTED_FEATURES
from agent.job.jobstate import TERMINAL_JOB_STATES
from agent.mesh.context import AgentContext
from agent.mesh.events import EventLog
from agent.mesh.mesh import GossipMesh
from agent.mesh.peers import PeerClient
from agent.mesh.view import STATE_NAMES, ClusterView
from agent.owning.owner import Owner
from agent.owning.placement import PLACEMENTS, Placement
from agent.people.keeper import PolicyKeeper
from agent.running.admission import NodeFacts
from agent.running.confirming import Placed
from agent.running.datastage import JobData, holders_of, places_unheard
from agent.running.peerimages import PeerImages
from agent.running.prefetch import Prefetches
from agent.running.runner import Runner
from agent.storage.store import Store
from agent.wire.policy import POLICY, POLICY_FILE
from agent.wire.records import EVENTS, NODE, NodeRecord
from gossip import revocation
from gossip.addresses import split_address
from gossip.certtrust import CertTrust
from gossip.events import Event, MemberDead, MemberLeft, RecordChanged
from gossip.identity import IdentityError, load_identity
from gossip.incarnation import INCARNATION_FILE
from gossip.node import GossipNode
from gossip.replay import ReplayGuard
from gossip.revocation import REVOCATIONS_FILE, RevocationError, RevocationList
from gossip.vivaldi import Coordinate, VivaldiConfig

log = logging.getLogger("shoal.agent")

RESUME_AFTER_S = 3.0


class Agent:
    def __init__(self, config: AgentConfig, placement: Placement | None = None) -> None:
        self.config = config
        self.identity = load_identity(config.identity_path)
        if self.identity.role != "agent":
            raise IdentityError(f"{config.identity_path} holds an {self.identity.role} identity")
        self.node_id = self.identity.node_id
        self.trust = CertTrust(self.identity.ca_certificate)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._revocations_path = config.data_dir / REVOCATIONS_FILE
        self._load_revocations()
        self.people = PolicyKeeper(self.trust, config.data_dir / POLICY_FILE)
        """The team policy (:mod:`agent.people.keeper`), kept from before a restart."""
        self.people.load(time.time())
        self.revoked = asyncio.Event()
        """Set once this node learns that its own certificate is revoked: it then stops."""
        self.store = Store(config.data_dir / "agent.sqlite")
        self.store.set_node_id(self.node_id)
        self.boot = self.store.next_boot()
        self.guard = ReplayGuard()
        now = time.time()
        self.guard.restore(self.store.seen_commands(now - self.guard.window_s), now)
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
            may_revoke=lambda signer: self.policy_wire.may_revoke(signer),
            incarnation_path=config.data_dir / INCARNATION_FILE,
        )
        self.mesh = GossipMesh(self.node_id, self.node, self.trust)
        self.authority = Authority(
            self.node_id,
            self.trust,
            self.mesh.live_agents,
            self.mesh.live_for_s,
            time.time,
            heard_of=self.mesh.heard_of,
        )
        self.view = ClusterView(self.authority)
        self.events = EventLog(self.node_id, boot=self.boot)
        self.disk_stops = 0
        """Jobs stopped for filling this agent's disk (``agent.running.diskguard``)."""
        self.peers = PeerClient(
            self.identity,
            timeout_s=config.rpc_timeout_s,
            shared=lambda: self.node.client_session(),
            streams=self.node,
        )
        self.devices = HostDevices(config.sim, config.sim_seed)
        window_s = max(1, round(config.hints_window_s))
        self.history = open_history(config.data_dir, time.time(), window_s)
        self.sampler = NodeSampler()
        self.ctx = AgentContext(
            node_id=self.node_id,
            store=self.store,
            view=self.view,
            peers=self.peers,
            events=self.events,
            authority=self.authority,
            mesh=self.mesh,
            publish=self.publish,
            changed=lambda: self.publisher.node_changed(),
            stop_grace_s=config.stop_grace_s,
            preempt_min_run_s=config.preempt_min_run_s,
            elastic_grow_idle_s=config.elastic_grow_idle_s,
            policy=lambda: self.people.body,
        )
        host_os = self.devices.report.host.os
        self.container_runtime = runtime = find_runtime(
            config.container_runtime,
            conf=config.containers_conf,
            root=config.container_root,
            insecure_registries=config.insecure_registries,
            platform=sys.platform if host_os in (None, "linux") else host_os,
        )
        """What runs this node's jobs that name an image (``None``: they are not placed here)."""
        features = SUPPORTED_FEATURES
        if self.container_runtime is None:
            features -= HOST_ONLY_FEATURES
        self.images = PeerImages(config.data_dir)
        self.images.runtime = self.container_runtime
        self.executor = ProcessExecutor(
            ExecutorConfig(
                data_dir=config.data_dir,
                grace_s=config.stop_grace_s,
                job_user=config.job_user,
                container_runtime=self.container_runtime,
                images=self.images,
            ),
            on_event=lambda e: self.runner.on_exec_event(e),
        )
        placement = placement or PLACEMENTS[config.placement](
            self.node_id, config.preempt_min_run_s, config.objective
        )
        self.runner = Runner(
            self.ctx,
            self.executor,
            self.devices,
            NodeFacts(os=host_os, labels=config.all_labels(), features=features),
            rebind=placement.rebind,
        )
        self.owner = Owner(self.ctx, placement)
        self.publisher = Publisher(
            self.publish,
            config,
            self.devices,
            self.events,
            self._node_doc,
            self._coordinate,
            features=features,
            container_runtime=None if runtime is None else runtime.kind,
            live_agents=lambda: len(self.mesh.live_agents()),
        )
        self.data = NodeData(config, self._datasets_in_use, self._kept_content)
        self.datasets = self.data.scanner
        self.data.changed = self.datasets_changed
        self.metrics = AgentMetrics(self._metrics_snapshot)
        self.content_counts: Counter[str] = Counter()
        """``shoal_content_total`` and ``shoal_content_fetched_bytes_total`` (``bytes_<kind>``)."""
        self.content_store = self.data.store
        self.content = ContentServer(self.content_store, self.content_counts)
        self.stager = Stager(
            self.node_id,
            self.peers,
            self.mesh,
            self.content_store,
            config.data_dir / "staging",
            self.content_counts,
            SwarmLimits(
                link_bytes_per_s=int(config.content_link_bytes_per_s), slot_bytes=SLOT_BYTES
            ),
        )
        self.stager.changed = self.datasets_changed
        self.policy_wire = PolicyWire(
            self.people, self.publish, self.content_store, self.stager.fetcher, self._holder_at
        )
        """Gossips the team policy held here, fetches the body of a newer one and believes it
        once verified (``agent.daemon.policywire``)."""
        self.policy_wire.keep_held_body()
        self.commands = Commands(
            self.ctx,
            config,
            trust=self.trust,
            guard=self.guard,
            metrics=self.metrics,
            owner=self.owner,
            runner=self.runner,
            node=self.node,
            mesh=self.mesh,
            stager=self.stager,
            data=self.data,
            people=self.people,
            take_policy=self.policy_wire.offer,
        )
        self.checkpoints = Checkpoints(
            self.ctx,
            self.content_store,
            self.stager.fetcher,
            self.runner,
            None if sys.platform == "win32" else self.executor.user.uid,
            self.metrics.internal_refused,
            config.data_dir,
        )
        self.content.gates[CHECKPOINT] = self.checkpoints.gate
        self.runner.checkpoints = self.owner.checkpoints = self.checkpoints
        self.usage = UsageBook(
            config.data_dir / "usage.sqlite", self.node_id, self.policy_wire.person
        )
        self.runner.usage = self.usage
        self.data_counts: Counter[str] = Counter()
        """``shoal_job_data_total``: datasets jobs found here (hits), staged (misses), failed."""
        self.runner.data = JobData(
            self.view, self.data.store, self.stager, self.data_counts, self.ctx.changed
        )
        self.runner.confirmer.owned = self._owned_placed
        self.publisher.rates = self.stager.fetcher.rates.snapshot
        self.stager.listed = functools.partial(holders_of, self.view)
        self.stager.view_filling = functools.partial(
            places_unheard, self.view, self.mesh.live_agents, self.node_id
        )
        self.prefetches = Prefetches(self.runner, self.runner.data, enabled=config.prefetch)
        self.calls = Calls(self.ctx, self.owner, self.runner, self.metrics, self.prefetches)
        self.reads = Reads(
            self.ctx,
            self.owner,
            self.runner,
            self.node,
            self.mesh,
            self.trust,
            people=self.people,
            refused=self.metrics.refused,
        )
        jobenvs.wire(self)
        self.node.subscribe(self._on_gossip)
        self.node.serve_calls(api.stream_calls(self))
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    # -- revocation ------------------------------------------------------------------------------

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

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self.runner.reconcile()
        await self.node.start()
        self.events.on_own = self.publisher.events_changed
        self.node.publish_revocations()
        self.policy_wire.publish_policy()
        self.publisher.inventory(self.node.address, self.boot)
        self.publisher.telemetry(force=True)
        self.publisher.node(time.monotonic())
        self.owner.start()
        self._tasks = [
            asyncio.create_task(loops.telemetry(self), name="telemetry"),
            asyncio.create_task(loops.sweep(self), name="sweep"),
            asyncio.create_task(self._resume_later(), name="resume"),
            asyncio.create_task(self.runner.watch_checkpoints(), name="checkpoints"),
            asyncio.create_task(loops.purge(self), name="purge"),
            asyncio.create_task(loops.disk(self), name="disk"),
            asyncio.create_task(loops.history(self), name="history"),
            asyncio.create_task(loops.hints(self), name="hints"),
            # the store is always there: what it holds is published, a datasets folder or not
            asyncio.create_task(loops.datasets(self), name="datasets"),
        ]
        devices = len(self.devices.report.devices)
        self.events.add(
            "agent_started", f"boot {self.boot} at {self.node.address} with {devices} device(s)"
        )

    async def stop(self) -> None:
        """Graceful: stop and report local jobs, leave the mesh, close everything."""
        self.events.add("agent_stopping", "stopping local jobs and leaving the mesh")
        self.publisher.events(time.monotonic())
        self._stopping = True
        for task in self._tasks:  # no more sweeps or resumes: the agents that stay take over
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.shutdown()
        await self.owner.close()
        await self.runner.close()
        await self.stager.close()
        await self.policy_wire.close()
        await self.node.stop(leave=True)
        await self.peers.close()
        self.devices.probe.close()
        self.history.close(time.time())
        self.usage.close()
        self.store.close()
        self.data.store.close()

    def publish(self, kind: str, payload: bytes) -> None:
        if self.node.started:
            self.node.publish(kind, payload)

    def _node_doc(self) -> NodeRecord:
        runner = self.runner
        return NodeRecord(
            drain=runner.drain.value,
            queue=self.owner.queue_length(),
            running=tuple(sorted(runner.runs)),
            free=tuple(runner.free_devices()),
            progress={j: p for j, p in runner.progress.items() if j in runner.runs},
            shares=runner.shares(),
            saved={j: at for j, at in runner.saved_at.items() if j in runner.runs},
            staging={
                **(runner.data.lines() if runner.data is not None else {}),
                **(runner.envs.building if runner.envs is not None else {}),
                **self.images.lines(),
            },
        )

    def device_keys(self) -> dict[int, str]:
        return {d.index: d.static.key for d in self.devices.report.devices}

    def gpu_facts(self) -> dict[str, GpuFacts]:
        free = set(self.runner.free_devices())
        holder = {k: job_id for job_id, run in self.runner.runs.items() for k in run.devices}
        link = {d.static.key: d.sample.pcie_link_bytes_per_s for d in self.devices.report.devices}
        return {
            s.key: GpuFacts(
                s.key not in free, s.temp_slowdown_c, holder.get(s.key), link.get(s.key)
            )
            for s in self.devices.statics()
        }

    # -- gossip events ---------------------------------------------------------------------------

    def _on_gossip(self, event: Event) -> None:
        if isinstance(event, RecordChanged):
            if event.kind == POLICY:
                if event.origin != self.node_id:
                    self.policy_wire.learn_policy(event.origin, event.payload)
                return
            job_id = self.view.apply(event.origin, event.kind, event.payload, time.monotonic())
            if job_id is not None:
                self.runner.on_job_record(job_id)
            elif event.kind == EVENTS:
                self.events.merge(event.origin, self.view.events.get(event.origin, ()))
            elif event.kind == NODE:
                self.owner.kick()
            return
        self.mesh.membership_changed()  # wakes the /healthz watches, recounts the live
        for job_id in self.view.membership_changed():  # one job's error stops neither the
            with one_job(self.owner.job_errors, "fence", job_id):  # others nor member_gone
                self.runner.on_job_record(job_id)
        if isinstance(event, MemberDead | MemberLeft) and event.node != self.node_id:
            how = "dead" if isinstance(event, MemberDead) else "left"
            told = self.mesh.gone(event.node, how)  # one agent tells the mesh; each logs it
            for node, node_how in told:
                if node == event.node or not self.events.told("member_" + node_how, node[:8]):
                    self.events.add("member_" + node_how, f"{node[:8]} is {node_how}")
            if all(node != event.node for node, _ in told):
                log.info("member_%s: %s is %s", how, event.node[:8], how)
            self.calls.gang_desk.owner_gone(event.node)
            if not self._stopping:  # leaving: the agents that stay take over, not us
                self.owner.member_gone(event.node)

    # -- loops (agent.daemon.loops) --------------------------------------------------------------

    async def datasets_rescan(self) -> None:
        """Index this host's datasets again (off the loop) and publish what is held."""
        await loops.datasets_rescan(self)

    def datasets_changed(self) -> None:
        """A data command changed what is held: published at the next tick."""
        self.publisher.datasets_scanned(self.data.sizes(), self.data.versions())

    def _kept_content(self) -> set[str]:
        """Content never evicted here: the working folders and the checkpoints of the jobs not
        ended, and the team policy's body."""
        kept = self._workdirs_of_unended_jobs() | self._checkpoints_of_unended_jobs()
        return kept | self.policy_wire.kept()

    def _holder_at(self, node_id: str) -> PeerHolder | None:
        """A member as a holder of content, over the agents' channel."""
        addr = self.mesh.addr_of(node_id)
        return None if addr is None else PeerHolder(self.peers, node_id, addr)

    def _checkpoints_of_unended_jobs(self) -> set[str]:
        """Every checkpoint held here (whole, or being fetched) of a job the view does not hold
        ended: once it ended, its copies are forgotten (``Checkpoints.forget``)."""
        ended = {s.value for s in TERMINAL_JOB_STATES}
        return {
            digest
            for job_id, digests in self.checkpoints.by_job().items()
            if (self.view.jobs.get(job_id) or {}).get("state") not in ended
            for digest in digests
        }

    def _workdirs_of_unended_jobs(self) -> set[str]:
        """The working folders of the jobs the view holds not ended, whoever owns them: kept
        wherever they are (the owner's and the replica's copies are what the runner stages)."""
        ended = {s.value for s in TERMINAL_JOB_STATES}
        return {
            digest
            for job_id, sub in self.view.submissions.items()
            if (digest := sub.spec.workdir_digest) is not None
            and (self.view.jobs.get(job_id) or {}).get("state") not in ended
        }

    def _datasets_in_use(self) -> list[tuple[str, str]]:
        """(job id, dataset ref) of the jobs running here or holding devices here to start:
        their versions are never evicted; nor those of jobs starting or pre-fetched here (under
        the job id ``""``)."""
        data = self.runner.data
        out = [] if data is None else [("", f"{v.name}@{v.digest}") for v in data.protected()]
        for job_id in dict.fromkeys([*self.runner.runs, *self.runner.holds.job_ids()]):
            spec = (self.view.jobs.get(job_id) or {}).get("spec")
            if isinstance(spec, dict):
                datasets = spec.get("datasets") or ()
                out.extend((job_id, d) for d in datasets if isinstance(d, str))
        return out

    def _coordinate(self) -> Coordinate | None:
        """This node's network coordinate once it has measured a round trip (before that it
        is the origin with the largest error, which says nothing)."""
        if not self.node.started:
            return None
        coord = self.node.peer.coordinate
        return coord if coord.error < VivaldiConfig().error_max else None

    async def _resume_later(self) -> None:
        await asyncio.sleep(RESUME_AFTER_S)
        log.info("resumed %d job(s) owned before this start", self.owner.resume())
        config = self.config
        ends = self.owner.republish_ended(config.ended_jobs_keep_s, config.ended_jobs_kept)
        if ends:
            log.info("published again the end of %d job(s) owned before this start", ends)

    def _owned_placed(self, job_id: str) -> Placed | None:
        """The current attempt of a job this agent owns (``agent.running.confirming``)."""
        job = self.owner.jobs.get(job_id)
        if job is None:
            return None
        return Placed.at(job.owner, job.attempt, job.state, job.runner, job.members)

    # -- metrics ---------------------------------------------------------------------------------

    def _metrics_snapshot(self) -> dict[str, Any]:
        jobs: Counter[str] = Counter(str(d.get("state")) for d in self.view.jobs.values())
        members: Counter[str] = Counter(
            STATE_NAMES.get(m.state, "unknown") for m in self.node.members()
        )
        return {
            "node": self.node_id,
            "devices": list(self.devices.report.devices),
            "jobs_by_state": dict(jobs),
            "members_by_state": dict(members),
            "running_here": len(self.runner.runs),
            "queue": self.owner.queue_length(),
            "gossip": self.node.stats(),
            "records_refused": self.view.refused,
            "policy_refused": self.people.refused,
            "records_refused_kinds": self.view.refused_kinds,
            "placements": self.owner.offers,
            "deadline_misses": self.owner.deadline_misses,
            "disk_stops": self.disk_stops,
            "job_step_errors": {
                **self.owner.job_errors,
                "unreadable_row": self.store.unreadable_jobs,
            },
            "preemptions": self.runner.preemptions.counts,
            "gang_holds": self.runner.holds.counts,
            "start_confirmations": self.runner.confirmer.counts,
            "quota": self.runner.teams.counts,
            "checkpoint": self.checkpoints.counts,
            "content": self.content_counts,
            "datasets_refused": self.datasets.refused,
            "store": self.data.metrics(),
            "job_data": self.data_counts,
            "env_builds": self.runner.envs.counts if self.runner.envs is not None else {},
            "image_pulls": self.images.counts,
            "workdir_uploads": self.commands.uploads.counts,
            "prefetch": self.owner.prefetcher.counts,
            "job_data_wait": self.runner.data.waits if self.runner.data is not None else None,
            "history_dropped": self.history.dropped(),
        }
