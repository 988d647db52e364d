"""What the API reads of an agent: jobs and nodes as this agent sees the mesh, and job logs.

Jobs come from the view's believed records (and, for the jobs this agent owns, its own copy:
fresher by a gossip round); their progress and ETA from the runner's ``node`` record. A job's
log is read where it runs, or ran last: here, or streamed from that agent over the internal API.
A person's read of a log is checked first by the team policy held here
(:func:`agent.people.rules.check_read_logs`: a user reads the logs of their own jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent.common.errors import ApiError
from agent.execution.logfiles import MAX_TAIL_LINES, lines_of_attempt
from agent.job.jobspec import check_job_id
from agent.job.jobstate import TERMINAL_JOB_STATES
from agent.job.ownership import rank
from agent.mesh.context import AgentContext
from agent.mesh.mesh import GossipMesh
from agent.mesh.peers import PeerError
from agent.mesh.view import STATE_NAMES
from agent.owning.ownedjob import stored_job
from agent.owning.owner import Owner
from agent.people import rules
from agent.people.keeper import PolicyKeeper
from agent.running.runner import Runner
from agent.wire.records import JobStatus
from gossip import envelope
from gossip.certtrust import CertTrust
from gossip.node import GossipNode
from gossip.transport import request_peer
from probers.records import DeviceSample

if TYPE_CHECKING:
    from agent.wire.documents import JobDoc, NodeDoc

_TEXT = {"Content-Type": "text/plain; charset=utf-8"}
STORED_ASKED_FIRST = 2
"""A retired job's stored copy is asked first of the agents ranked first for it (owner and
replica), then of the next ones in its order, up to :data:`STORED_ASKED_AT_MOST`."""
STORED_ASKED_AT_MOST = 8
"""The agents asked for a retired job's copy, at most. It is held by the two agents first in the
job's order over the agents live when it ended (or handed on to the first since); each agent
that joined since and ranks ahead of them moves them down one place. So a lookup finds it
after six such joins, and an id nobody knows costs 8 calls, not one per agent in the mesh (a
lookup anyone who may read can repeat)."""


def job_doc(record: Mapping[str, Any], ctx: AgentContext) -> JobDoc:
    """The API's document of a job from its record (``OwnedJob.to_json`` or a believed one)."""
    from agent.wire.documents import JobDoc  # loaded on the first read

    status = JobStatus.from_wire(record)
    progress = eta = None
    if status.runner is not None and status.state == "running":
        node = ctx.view.nodes.get(status.runner)
        pair = node.status.progress.get(status.job_id) if node and node.status else None
        if pair is not None:
            progress, eta = pair
    elif status.state == "succeeded":
        progress, eta = 1.0, 0.0
    spec = record.get("spec")
    return JobDoc(status, spec if isinstance(spec, dict) else {}, progress, eta)


def newest_ended(found: list[Any]) -> Mapping[str, Any] | None:
    """Of the stored copies agents answered with, the ended job's newest (the last owner's:
    a job's records only grow in generation). A job not ended is one some agent's view has yet
    to hear of, not a retired one: the agent asked does not know it yet, as before retiring."""
    ended = [d for d in found if isinstance(d, dict) and d.get("state") in TERMINAL_JOB_STATES]
    return max(ended, key=lambda d: int(d.get("gen") or 0), default=None)


class Reads:
    def __init__(
        self,
        ctx: AgentContext,
        owner: Owner,
        runner: Runner,
        node: GossipNode,
        mesh: GossipMesh,
        trust: CertTrust,
        people: PolicyKeeper | None = None,
        refused: Counter[str] | None = None,
    ) -> None:
        """``people``: the team policy held here (``None``: every reader reads every log);
        ``refused``: where refused reads are counted, by why."""
        self._people = people
        self.refused: Counter[str] = Counter() if refused is None else refused
        self._ctx = ctx
        self._owner = owner
        self._runner = runner
        self._node = node
        self._mesh = mesh
        self._trust = trust

    def jobs(self) -> list[JobDoc]:
        """Every job the view holds, with this agent's own copy of a job it owns where that is
        newer (a higher ``gen``): a job just submitted here is listed before its record has gone
        out, and an ended one every agent retired is not listed again."""
        by_id = dict(self._ctx.view.jobs)
        for job_id, job in self._owner.jobs.items():
            seen = by_id.get(job_id)
            if seen is None and job.state in TERMINAL_JOB_STATES:
                continue  # retired everywhere: not listed again
            if seen is None or int(seen.get("gen") or 0) < job.gen:
                by_id[job_id] = job.to_json()  # newer here than its record out there
        docs = sorted(by_id.values(), key=lambda d: d.get("submitted_at") or 0.0)
        return [job_doc(d, self._ctx) for d in docs]

    async def job(self, job_id: str) -> JobDoc:
        check_job_id(job_id)  # a malformed id is no job anywhere: answered 400, nobody asked
        doc = await self._doc(job_id)
        if doc is None:
            raise ApiError(404, f"unknown job {job_id}")
        return job_doc(doc, self._ctx)

    async def _doc(self, job_id: str) -> Mapping[str, Any] | None:
        """The job's record: this agent's own copy, the view's, or, for a job every agent
        retired (``agent.mesh.retiring``), its owner's stored one (:meth:`_stored`)."""
        owned = self._owner.jobs.get(job_id)
        doc = owned.to_json() if owned is not None else self._ctx.view.jobs.get(job_id)
        return doc if doc is not None else await self._stored(job_id)

    async def _stored(self, job_id: str) -> Mapping[str, Any] | None:
        """An ended job's stored copy: this agent's, else its owner's and replica's by the
        job's rank over the live agents (who hold it unless ownership moved since), else the
        next agents' in that order. So a retired job costs two calls, an id nobody knows
        :data:`STORED_ASKED_AT_MOST`."""
        found = [stored_job(self._ctx.store, job_id)]
        if (ended := newest_ended(found)) is not None:
            return ended  # an ended copy here: no need to ask the others
        others = rank(job_id, [n for n in self._mesh.live_agents() if n != self._ctx.node_id])
        for ask in (others[:STORED_ASKED_FIRST], others[STORED_ASKED_FIRST:STORED_ASKED_AT_MOST]):
            found += await self._ask_stored(job_id, ask)
            if (ended := newest_ended(found)) is not None:
                return ended
        return None

    async def _ask_stored(self, job_id: str, nodes: list[str]) -> list[Any]:
        addrs = [a for a in map(self._mesh.addr_of, nodes) if a is not None]
        answers = await asyncio.gather(
            *(self._ctx.peers.call(a, "stored_job", {"job_id": job_id}) for a in addrs),
            return_exceptions=True,
        )
        return [a.get("job") for a in answers if isinstance(a, dict)]

    def nodes(self) -> list[NodeDoc]:
        from agent.wire.documents import DeviceDoc, NodeDoc  # loaded on the first read

        now = time.monotonic()
        view = self._ctx.view
        out = []
        for m in sorted(self._node.members(), key=lambda m: m.node):
            if self._trust.is_revoked(m.node):
                continue  # not a member any more: every agent holds the revocation list
            node = view.nodes.get(m.node)
            inv = node.inventory if node else None
            status = node.status if node else None
            devices: tuple[DeviceDoc, ...] = ()
            age = None
            if node is not None:
                devices = tuple(
                    DeviceDoc(i, s, node.samples.get(s.key) or DeviceSample(key=s.key))
                    for i, s in enumerate(node.statics)
                )
                if node.telemetry_received_at is not None:
                    age = now - node.telemetry_received_at
            out.append(
                NodeDoc(
                    node_id=m.node,
                    addr=m.addr,
                    state=STATE_NAMES.get(m.state, "unknown"),
                    role=self._trust.role_of(m.node)
                    or ("agent" if m.node == self._ctx.node_id else None),
                    drain=status.drain if status else None,
                    labels=inv.labels if inv else {},
                    host=inv.host if inv else None,
                    devices=devices,
                    telemetry_age_s=age,
                    telemetry_every_s=node.telemetry_every_s if node is not None else None,
                    running_jobs=status.running if status else (),
                    queue=status.queue if status else 0,
                    wire_version=inv.version if inv else None,
                    features=inv.features if inv else (),
                    container_runtime=inv.container_runtime if inv else None,
                    datasets=node.datasets if node is not None else {},
                    dataset_versions=node.place.versions
                    if node is not None and node.place is not None
                    else (),
                    fetch_rates=node.place.rates
                    if node is not None and node.place is not None
                    else {},
                    content=node.place.content
                    if node is not None and node.place is not None
                    else (),
                    rtt_s=view.rtt_s(self._ctx.node_id, m.node),
                    shares=status.shares if status else {},
                )
            )
        return out

    # -- logs ------------------------------------------------------------------------------------

    async def logs(
        self,
        request: web.Request,
        job_id: str,
        lines: int,
        follow: bool,
        attempt: int | None = None,
        node: str | None = None,
    ) -> web.StreamResponse:
        """The job's log, from the agent that runs it (or ran it last), streamed; with
        ``attempt``, that attempt's lines, from the agent it ran on (with ``node`` too, from
        that one of its nodes: a gang's member)."""
        check_job_id(job_id)
        self._check_reader(request, job_id)
        doc = await self._doc(job_id)
        if doc is None:
            if attempt is None and self._last_runner(job_id) == self._ctx.node_id:
                # It runs (or ran) here, and gossip has not brought its record yet.
                return await self.local_logs(request, job_id, lines, follow, attempt)
            raise ApiError(404, f"unknown job {job_id}")
        if attempt is None:
            runner = doc.get("runner") or self._last_runner(job_id)
        else:
            ran = [
                a
                for a in doc.get("attempts") or ()
                if a.get("attempt") == attempt and node in (None, a.get("node"))
            ]
            if not ran:
                on = "" if node is None else f" on {node[:8]}"
                raise ApiError(404, f"job {job_id} has no attempt {attempt}{on} on record")
            runner = ran[-1].get("node")
        if runner is None or runner == self._ctx.node_id:
            return await self.local_logs(request, job_id, lines, follow, attempt)
        addr = self._mesh.addr_of(str(runner))
        if addr is None:
            raise ApiError(503, f"runner {str(runner)[:8]} is unreachable")
        response = web.StreamResponse(headers=_TEXT)
        await response.prepare(request)
        path = f"/v1/internal/logs/{job_id}?lines={lines}&follow={int(follow)}"
        if attempt is not None:
            path += f"&attempt={attempt}"
        try:
            quiet_s = None if follow else self._ctx.peers.timeout_s
            async for chunk in self._ctx.peers.stream(addr, path, quiet_s=quiet_s):
                await response.write(chunk)
        except PeerError as exc:
            await response.write(f"[shoal] log stream ended: {exc}\n".encode())
        await response.write_eof()
        return response

    def _check_reader(self, request: web.Request, job_id: str) -> None:
        """403, counted, when the person asking may not read this job's log (an agent may)."""
        if self._people is None:
            return
        reader = request_peer(request).node_id
        if self._trust.role_of(reader) == "agent":
            return
        held = self._ctx.view.submissions.get(job_id)
        owned = self._owner.jobs.get(job_id)
        submitter = held.operator_id if held is not None else None
        if submitter is None and owned is not None and owned.submission:
            submitter = envelope.signer_of(owned.submission)  # verified when accepted
        try:
            who = rules.standing(self._people.body, reader, self._trust.role_of(reader))
            rules.check_read_logs(who, job_id, submitter)
        except rules.Refused as exc:
            self.refused[exc.why] += 1
            raise ApiError(403, f"refused ({exc.why}): {exc}") from None

    def _last_runner(self, job_id: str) -> str | None:
        if self._ctx.store.results(job_id) or job_id in self._runner.runs:
            return self._ctx.node_id
        return None

    async def local_logs(
        self,
        request: web.Request,
        job_id: str,
        lines: int,
        follow: bool,
        attempt: int | None = None,
    ) -> web.StreamResponse:
        """The log of the job's attempts that ran on this agent (or of one of them)."""
        check_job_id(job_id)
        response = web.StreamResponse(headers=_TEXT)
        await response.prepare(request)
        if attempt is not None:
            # The attempt's part of what the log holds (at most MAX_TAIL_LINES lines back).
            def of_attempt(held: list[str]) -> list[str]:
                return list(lines_of_attempt(held, attempt))[-lines:] if lines else []

            if follow:  # one reader from the tail on: no line between the two is lost
                followed = self._runner.follow(job_id, MAX_TAIL_LINES, earlier=of_attempt)
                async for line in followed:
                    await response.write((line + "\n").encode())
            else:
                chunks = []
                async with contextlib.aclosing(self._runner.tail(job_id, MAX_TAIL_LINES)) as blocks:
                    async for block in blocks:
                        chunks.append(block)
                text = b"".join(chunks).decode("utf-8", errors="replace")
                kept = of_attempt(text.splitlines())
                await response.write("".join(line + "\n" for line in kept).encode())
        elif not follow:
            async with contextlib.aclosing(self._runner.tail(job_id, lines)) as blocks:
                async for block in blocks:
                    await response.write(block)  # waits while the reader lags: nothing piles up
        else:
            async for line in self._runner.follow(job_id, lines):
                await response.write((line + "\n").encode())
        await response.write_eof()
        return response
