"""Operator commands: checked, remembered, and carried out by the agent they concern.

A command is a sealed envelope (``gossip.envelope``) an operator signed. The agent that receives
it opens it (signature, operator role, freshness, uniqueness), stores its id before acting (a
restart keeps refusing a replay), and looks its kind up in one table: each handler either acts
here or forwards the very same bytes to the agent that must act (the job's owner, the node to
drain), which checks them again itself. A forwarded command is never forwarded further.

Before it acts, the agent that executes a command checks that its signer may give it, by the
team policy this agent holds (:mod:`agent.people.rules`): the kind for their role here, and the
job's submitter and the priority ceiling where the job is (its owner). A refusal is one line,
403, counted in ``shoal_refused_total{why}``; a forwarding agent checks the kind too, so most
refusals cost no second hop, but only the executing agent's check is trusted.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from agent.common.parsing import json_loads
from agent.content.stage import StageAsk, Stager
from agent.daemon.config import AgentConfig
from agent.daemon.datastore import DataRefused, NodeData
from agent.daemon.metrics import AgentMetrics
from agent.daemon.workdirput import POLICY_UPLOAD, WorkdirHolds, WorkdirUploads
from agent.job.authority import FeaturesLacking, SubmissionRefused
from agent.job.jobspec import HOST_ONLY_FEATURES, IMAGE_HOST, check_job_id, lacking_reason
from agent.job.ownership import owner_of
from agent.mesh.context import AgentContext
from agent.mesh.mesh import GossipMesh
from agent.mesh.peers import PeerUnreachable
from agent.owning.ownedjob import OwnerError
from agent.owning.owner import Owner
from agent.people import rules
from agent.people.keeper import PolicyKeeper, PolicyRefused
from agent.people.rules import Refused, Standing
from agent.running.runner import Runner
from agent.wire.codec import ENVELOPE_CONTENT_TYPE, opt_number
from gossip import envelope, revocation
from gossip.certtrust import CertTrust
from gossip.node import GossipNode
from gossip.replay import ReplayGuard
from gossip.revocation import RevocationError

Answer = tuple[int, dict[str, Any]]
Handler = Callable[[str, dict[str, Any], bytes, bool], Awaitable[Answer]]
"""(kind, the command's JSON body, its sealed bytes, whether it was forwarded) -> answer."""

ENVELOPE_STATUS: dict[type[envelope.EnvelopeError], int] = {
    envelope.Unsigned: 401,
    envelope.Forged: 401,
    envelope.UntrustedSigner: 401,
    envelope.NotOperator: 403,
    envelope.Revoked: 403,
    envelope.Replayed: 409,
    envelope.Skewed: 400,
    envelope.Malformed: 400,
    envelope.Oversized: 413,
}
"""The HTTP status each refusal of an envelope is answered with."""


class Commands:
    def __init__(
        self,
        ctx: AgentContext,
        config: AgentConfig,
        *,
        trust: CertTrust,
        guard: ReplayGuard,
        metrics: AgentMetrics,
        owner: Owner,
        runner: Runner,
        node: GossipNode,
        mesh: GossipMesh,
        stager: Stager,
        data: NodeData,
        people: PolicyKeeper,
        take_policy: Callable[[bytes], Awaitable[bool]],
    ) -> None:
        """``people``: the team policy held here; ``take_policy``: a ``policy`` command's
        record offered (``agent.daemon.policywire``: the body read from the store, verified,
        kept and gossiped); whether it is now the held policy."""
        self._ctx = ctx
        self._config = config
        self._trust = trust
        self._guard = guard
        self._metrics = metrics
        self._owner = owner
        self._runner = runner
        self._node = node
        self._mesh = mesh
        self._stager = stager
        self._data = data
        self._people = people
        self._take_policy = take_policy
        self.rejections: Counter[str] = Counter()
        self.uploads = WorkdirUploads(data.store, Counter())
        self.policy_uploads = WorkdirUploads(data.store, self.uploads.counts, POLICY_UPLOAD)
        self.holds = WorkdirHolds(data.store, stager)
        self._handlers: dict[str, Handler] = {
            "submit": self._submit,
            "cancel": self._job_command,
            "migrate": self._job_command,
            "cordon": self._drain,
            "drain": self._drain,
            "undrain": self._drain,
            "revoke": self._revoke,
            "stage": self._stage,
            "data_add": self._data_command,
            "data_evict": self._data_command,
            "data_pin": self._data_command,
            "data_unpin": self._data_command,
            "policy": self._policy,
            "workdir_missing": self._workdir,
            "workdir_put": self._workdir,
            "policy_missing": self._workdir,
            "policy_put": self._workdir,
        }

    async def execute(self, data: bytes, *, forwarded: bool) -> Answer:
        try:
            command = envelope.open(
                data, self._trust, self._guard, time.time(), rejections=self.rejections
            )
        except envelope.EnvelopeError as exc:
            self._metrics.commands_rejected[exc.reason] += 1
            return ENVELOPE_STATUS.get(type(exc), 400), {"error": f"{exc.reason}: {exc}"}
        # Remembered before it acts: a restarted agent still refuses it as a replay.
        self._ctx.store.remember_command(
            command.command_id, command.issued_at, time.time() - self._guard.window_s
        )
        handler = self._handlers.get(command.kind)
        if handler is None:
            self._metrics.commands_rejected["unknown_kind"] += 1
            return 400, {"error": f"unknown command kind {command.kind!r}"}
        try:
            rules.check_kind(self.standing(command.operator_id), command.kind)
            body = json_loads(command.body)
            if not isinstance(body, dict):
                raise ValueError("the command body must be a JSON object")
            status, answer = await handler(command.kind, body, data, forwarded)
        except Refused as exc:
            self._metrics.refused[exc.why] += 1
            return 403, {"error": f"refused ({exc.why}): {exc}"}
        except (ValueError, KeyError, TypeError) as exc:
            self._metrics.commands_rejected["bad_body"] += 1
            return 400, {"error": f"bad {command.kind} command: {exc}"}
        except OwnerError as exc:
            return exc.status, {"error": str(exc)}
        except RevocationError as exc:
            self._metrics.commands_rejected["bad_revocations"] += 1
            return 400, {"error": f"revocation list refused: {exc}"}
        if status < 300:
            self._metrics.commands_accepted[command.kind] += 1
        return status, answer

    def standing(self, signer: str) -> Standing:
        """The signer of a command, as the team policy held here sees them (:class:`Refused`
        when they have no standing)."""
        return rules.standing(self._people.body, signer, self._trust.role_of(signer))

    async def _forward(self, node: str, data: bytes) -> Answer:
        addr = self._mesh.addr_of(node)
        if addr is None:
            return 503, {"error": f"no address for node {node}"}
        try:
            return await self._ctx.peers.post(
                addr,
                "/v1/internal/command",
                data,
                ENVELOPE_CONTENT_TYPE,
                timeout_s=self._config.rpc_timeout_s * 3,
                warm=True,
            )
        except PeerUnreachable as exc:
            return 503, {"error": f"node {node[:8]} did not answer: {exc}"}

    def _job_owner(self, job_id: str) -> str | None:
        """The live owner of a job this agent has heard of."""
        if job_id in self._owner.jobs:
            return self._ctx.node_id
        doc = self._ctx.view.jobs.get(job_id)
        if doc is not None and doc.get("owner") in self._mesh.live_agents():
            return str(doc["owner"])
        return None

    async def _submit(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> Answer:
        try:
            sub = self._ctx.authority.submission(data)
        except FeaturesLacking as exc:
            self._metrics.commands_rejected["features"] += 1
            return 400, {"error": str(exc)}
        except SubmissionRefused as exc:  # signed by an operator, but not a job (a bad spec)
            self._metrics.commands_rejected["bad_body"] += 1
            return 400, {"error": str(exc)}
        needed = frozenset(sub.spec.features)
        if needed and not any(
            needed <= self._ctx.view.node(n).features for n in self._mesh.live_agents()
        ):
            # Accepted, it would wait for agents that do not exist: refused, with the reason.
            self._metrics.commands_rejected["features"] += 1
            reason = lacking_reason(sub.spec.features)
            if needed & HOST_ONLY_FEATURES and not sub.spec.lacking:
                reason = "the job names an image and no live agent is " + IMAGE_HOST
            return 400, {"error": f"no agent of this mesh runs it: {reason}"}
        rules.check_priority(self.standing(sub.operator_id), sub.spec.priority)
        owner = self._job_owner(sub.job_id) or owner_of(sub.job_id, self._mesh.live_agents())
        if forwarded or owner in (None, self._ctx.node_id):
            if sub.spec.workdir_digest is not None:  # kept here as the submission is
                problem = await self.holds.fetch(sub.spec.workdir_digest)
                if problem is not None:
                    self._metrics.commands_rejected["workdir"] += 1
                    return 409, {"error": f"{problem}; nothing submitted"}
            return 200, await self._owner.submit(sub)
        return await self._forward(owner or "", data)

    async def _job_command(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> Answer:
        """cancel and migrate: carried out by the job's owner."""
        job_id = check_job_id(body["job_id"])
        owner = self._job_owner(job_id)
        if owner is None and not forwarded:
            # Not heard of yet here (gossip is still carrying it): ask its rendezvous owner.
            owner = owner_of(job_id, self._mesh.live_agents())
        if owner is None or (forwarded and owner != self._ctx.node_id):
            return 404, {"error": f"unknown job {job_id} here (or its owner is gone; retry)"}
        if owner != self._ctx.node_id:
            if forwarded:
                return 409, {"error": f"job {job_id} is owned by {owner[:8]}"}
            return await self._forward(owner, data)
        signer = envelope.signer_of(data)
        held = self._owner.jobs.get(job_id)
        # Verified when the job was accepted; its signer is the submitter even once revoked.
        submitter = envelope.signer_of(held.submission) if held and held.submission else ""
        rules.check_job(self.standing(signer), kind, job_id, submitter)  # "": an admin's only
        if kind == "cancel":
            return 200, await self._owner.cancel(job_id)
        target = body.get("target")
        if target is not None and not isinstance(target, str):
            raise ValueError("target must be a node id or null")
        return 200, await self._owner.migrate(job_id, target)

    async def _to_node(self, body: dict[str, Any], data: bytes, forwarded: bool) -> Answer | None:
        """``None`` when the command's ``node`` is this one; else the answer of the node it
        names (forwarded once), or a refusal."""
        node = body["node"]
        if not isinstance(node, str):
            raise ValueError("node must be a node id")
        if node == self._ctx.node_id:
            return None
        if forwarded:
            return 409, {"error": f"this is {self._ctx.node_id[:8]}, not {node[:8]}"}
        if node not in self._mesh.live_agents():
            return 404, {"error": f"no live agent {node}"}
        return await self._forward(node, data)

    async def _data_command(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> Answer:
        """data_add, data_evict, data_pin, data_unpin: carried out by the node that holds (or
        is to index) the dataset."""
        # data_add names no node when it is for the agent it was sent to
        elsewhere = await self._to_node(body, data, forwarded) if "node" in body else None
        if elsewhere is not None:
            return elsewhere
        if kind == "data_add":
            name, path = body["name"], body["path"]
            if not isinstance(name, str) or not isinstance(path, str):
                raise ValueError("name and path must be strings")
            act = functools.partial(self._data.add, name, path)
        else:
            ref = body["dataset"]
            if not isinstance(ref, str):
                raise ValueError("dataset must be NAME or NAME@DIGEST")
            if kind == "data_evict":
                act = functools.partial(self._data.evict, ref)
            else:
                act = functools.partial(self._data.pin, ref, kind == "data_pin")
        try:
            answer = await asyncio.to_thread(act)
        except DataRefused as exc:
            self._metrics.commands_rejected["data_refused"] += 1
            return exc.status, {"error": str(exc)}
        self._data.changed()
        return 200, {"node": self._ctx.node_id, **answer}

    async def _workdir(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> Answer:
        """workdir_missing, workdir_put: a working folder comes up into this agent's store;
        policy_missing, policy_put: a team policy's body, before the ``policy`` command."""
        uploads = self.policy_uploads if kind.startswith("policy_") else self.uploads
        if kind.endswith("_missing"):
            return 200, await uploads.missing(body)
        return 200, await uploads.put(body)

    async def _drain(self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool) -> Answer:
        """cordon, drain and undrain: carried out by the node itself."""
        elsewhere = await self._to_node(body, data, forwarded)
        if elsewhere is not None:
            return elsewhere
        grace = opt_number(body.get("grace_s"), "grace_s")  # bounded, as any wire number
        if grace is not None and grace < 0:
            raise ValueError("grace_s must be a non-negative number")
        state = self._runner.command(kind, grace, self._config.drain_grace_s)
        self._owner.kick()
        return 200, {"node": self._ctx.node_id, "drain": state}

    async def _policy(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> Answer:
        """A newer team policy: verified (an admin signed it), kept and gossiped."""
        try:
            record = base64.b64decode(body["policy"], validate=True)
            applied = await self._take_policy(record)
        except PolicyRefused as exc:
            self._metrics.commands_rejected["bad_policy"] += 1
            return 400, {"error": str(exc)}
        except binascii.Error as exc:
            raise ValueError(f"policy is not base64: {exc}") from None
        return 200, {"version": self._people.version, "applied": applied}

    async def _revoke(
        self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool
    ) -> Answer:
        incoming = revocation.decode(base64.b64decode(body["revocations"], validate=True))
        applied = self._node.revoke(incoming)
        return 200, {
            "version": self._node.revocations.version,
            "applied": applied,
            "revoked": sorted(self._node.revocations.node_ids),
        }

    async def _stage(self, kind: str, body: dict[str, Any], data: bytes, forwarded: bool) -> Answer:
        """stage: each named node fetches the content now; the answer is each one's stage."""
        ask = StageAsk.from_body(body)
        me = self._ctx.node_id
        if forwarded and me not in ask.nodes:
            return 409, {"error": f"this is {me[:8]}, not one of the nodes named"}
        answers: dict[str, dict[str, Any]] = {}
        if me in ask.nodes:
            if ask.cancel:
                state = await self._stager.cancel(ask.key)
            elif ask.poll:
                state = self._stager.state(ask.key)
            else:
                state = self._stager.start(ask.name, ask.digest, ask.source)
            answers[me] = state.to_wire() if state else {"error": "no such stage here"}

        async def forward(node: str) -> None:
            if node not in self._mesh.live_agents():
                answers[node] = {"error": f"no live agent {node}"}
                return
            status, answer = await self._forward(node, data)
            got = answer.get("nodes", {}).get(node) if status == 200 else None
            answers[node] = got if isinstance(got, dict) else {"error": answer.get("error", "")}

        if not forwarded:
            await asyncio.gather(*(forward(n) for n in ask.nodes if n != me))
        return 200, {"name": ask.name, "nodes": answers}
