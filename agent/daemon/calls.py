"""Calls between agents (``POST /v1/internal/<call>``), one table from call to handler.

Each handler gets the JSON body and the caller's node id (from its certificate) and answers a
JSON object; bodies and answers are the definitions of ``agent.wire.documents`` (a body that
does not decode is refused with 400). The job protocol's refusals become HTTP statuses here: no
authority over the job (403, counted by call in ``shoal_internal_refused_total``), an offer that
cannot run here or a job that needs a spec version this agent does not read (409), one whose
process could not be launched (:data:`agent.owning.owner.LAUNCH_FAILED`).

- ``replicate``: keep a copy of a job for its owner; ``adopt``: take a job over;
- ``start``: an offer to run an attempt; ``stop``: stop and fence an attempt;
- ``status``: what runs or ran here of a job; ``report``: an attempt ended (to the owner);
- ``checkpointed``: the job's checkpoint changed on its runner (to the owner, which pulls it);
  ``checkpoint_of``: the owner asks the runner for the checkpoint an attempt left (read into the
  runner's store, answered by digest); ``checkpoint_copy``: an owner has this node (the job's
  replica, its next owner) fetch its copy; ``checkpoint_grant``: an owner lets the node that
  runs the next attempt read the copy held here (``agent.checkpoints.ckptstore``: the bytes move
  through the content routes);
- ``gang_prepare``, ``gang_commit``, ``gang_abort``: a gang's two-phase start on each member's
  runner (``agent.running.gangdesk``), authorised as ``start`` and ``stop`` are;
- ``confirm_start``: a runner offered an attempt asks the job's other owner whether its copy
  places that attempt there (``agent.running.confirming``); one it does not confirm is refused as a
  call without authority (403), one it could not be asked about declined (409);
- ``prefetch``: stage a waiting job's datasets here now, or stop (``agent.running.prefetch``),
  authorised as ``start`` is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agent.checkpoints.ckptstore import Checkpoints
from agent.common.errors import ApiError
from agent.daemon.metrics import AgentMetrics
from agent.job.authority import FeaturesLacking, SubmissionRefused
from agent.job.jobspec import check_job_id
from agent.mesh.context import AgentContext
from agent.owning.ownedjob import OwnerError, store_replica, stored_job
from agent.owning.owner import LAUNCH_FAILED, Owner
from agent.running.confirming import NotConfirmed, Unconfirmed
from agent.running.gangdesk import GangDesk
from agent.running.prefetch import Prefetches
from agent.running.runner import Runner
from agent.running.runs import Declined, LaunchFailed, NotAllowed
from agent.wire.calls import (
    AttemptResult,
    GangAbort,
    GangCommit,
    GangPrepare,
    PrefetchAsk,
    ResumeFrom,
    StartConfirm,
    StartOffer,
    StatusRequest,
    StopRequest,
)
from agent.wire.ckptcalls import CheckpointCopy, CheckpointGrant, CheckpointNote
from agent.wire.quotacalls import QuotaClaim

log = logging.getLogger("shoal.agent")

Body = dict[str, Any]
Call = Callable[[Body, str], Awaitable[Body]]


class Calls:
    def __init__(
        self,
        ctx: AgentContext,
        owner: Owner,
        runner: Runner,
        metrics: AgentMetrics,
        prefetches: Prefetches | None = None,
    ) -> None:
        self._ctx = ctx
        self._metrics = metrics
        self.hold_workdir: Callable[[str], None] | None = None
        self.export_image: Callable[[str], Awaitable[Body]] | None = None
        """Save an image this node's runtime holds into its store (``agent.running.peerimages``)."""
        """Fetch a replicated job's working folder here (``agent.daemon.workdirput``)."""

        async def start(body: Body, caller: str) -> Body:
            return (await runner.start(StartOffer.from_wire(body), caller)).to_wire()

        async def stop(body: Body, caller: str) -> Body:
            return (await runner.stop(StopRequest.from_wire(body), caller)).to_wire()

        self.gang_desk = GangDesk(runner)
        desk = self.gang_desk

        async def gang_prepare(body: Body, caller: str) -> Body:
            return (await desk.prepare(GangPrepare.from_wire(body), caller)).to_wire()

        async def gang_commit(body: Body, caller: str) -> Body:
            return (await desk.commit(GangCommit.from_wire(body), caller)).to_wire()

        async def checkpoint_of(body: Body, caller: str) -> Body:
            note = CheckpointNote.from_wire(body)
            ref = await self._checkpoints(runner).of_attempt(
                check_job_id(note.job_id), note.attempt, caller
            )
            at = None if ref is None else ResumeFrom(ref.attempt, ref.digest).to_wire()
            return {"checkpoint": at}

        async def checkpoint_copy(body: Body, caller: str) -> Body:
            order = CheckpointCopy.from_wire(body)
            check_job_id(order.job_id)
            return await self._checkpoints(runner).receive_copy(order, caller)

        def checkpoint_grant(body: Body, caller: str) -> Body:
            order = CheckpointGrant.from_wire(body)
            check_job_id(order.job_id)
            return self._checkpoints(runner).receive_grant(order, caller)

        self._calls: dict[str, Call] = {
            "replicate": self._replicate,
            "image_export": self._image_export,
            "adopt": self._sync(owner.adopt_wire),
            "start": start,
            "stop": stop,
            "status": self._sync(
                lambda body, caller: runner.status(StatusRequest.from_wire(body).job_id).to_wire()
            ),
            "report": self._sync(
                lambda body, caller: owner.report(caller, AttemptResult.from_wire(body))
            ),
            "checkpointed": self._sync(
                lambda body, caller: owner.checkpointed(caller, CheckpointNote.from_wire(body))
            ),
            "checkpoint_of": checkpoint_of,
            "checkpoint_copy": checkpoint_copy,
            "checkpoint_grant": self._sync(checkpoint_grant),
            "gang_prepare": gang_prepare,
            "gang_commit": gang_commit,
            "stored_job": self._sync(lambda body, caller: self._stored_job(body)),
            "gang_abort": self._sync(
                lambda body, caller: desk.abort(GangAbort.from_wire(body), caller).to_wire()
            ),
            "prefetch": self._sync(lambda body, caller: self._prefetch(prefetches, body, caller)),
            "confirm_start": self._sync(
                lambda body, caller: runner.confirmer.answer(
                    StartConfirm.from_wire(body), caller
                ).to_wire()
            ),
            "quota_claim": self._sync(
                lambda body, caller: runner.teams.grant(
                    QuotaClaim.from_wire(body), caller
                ).to_wire()
            ),
        }

    @staticmethod
    def _sync(fn: Callable[[Body, str], Body]) -> Call:
        async def call(body: Body, caller: str) -> Body:
            return fn(body, caller)

        return call

    @staticmethod
    def _checkpoints(runner: Runner) -> Checkpoints:
        if runner.checkpoints is None:
            raise ApiError(404, "this agent keeps no checkpoints")
        return runner.checkpoints

    @staticmethod
    def _prefetch(prefetches: Prefetches | None, body: Body, caller: str) -> Body:
        if prefetches is None:
            raise ApiError(404, "this agent stages no datasets")
        return prefetches.answer(PrefetchAsk.from_wire(body), caller)

    def _stored_job(self, body: Body) -> Body:
        """A retired job's record from this agent's store (``agent.mesh.retiring``), or none."""
        job_id = check_job_id(body["job_id"])  # a KeyError or ValueError answers 400
        return {"job": stored_job(self._ctx.store, job_id)}

    async def _replicate(self, body: Body, caller: str) -> Body:
        job = store_replica(self._ctx.store, body, caller, self._ctx.authority)
        if job.spec.workdir_digest is not None and self.hold_workdir is not None:
            self.hold_workdir(job.spec.workdir_digest)  # kept here as the submission is
        return {"ok": True}

    async def _image_export(self, body: Body, caller: str) -> Body:
        image = body.get("image")
        if not isinstance(image, str):
            raise ApiError(400, "image must be a string")
        if self.export_image is None:
            raise ApiError(404, "this agent exports no images")
        try:
            return await self.export_image(image)
        except (LookupError, ValueError) as exc:
            raise ApiError(404, str(exc)) from None

    async def handle(self, op: str, body: Body, caller: str) -> Body:
        call = self._calls.get(op)
        if call is None:
            raise ApiError(404, f"unknown internal call {op!r}")
        try:
            return await call(body, caller)
        except FeaturesLacking as exc:
            raise ApiError(409, str(exc)) from None
        except (NotAllowed, SubmissionRefused, NotConfirmed) as exc:
            self._refused(op, caller, exc)
            raise ApiError(403, str(exc)) from None
        except OwnerError as exc:
            if exc.status == 403:
                self._refused(op, caller, exc)
            raise ApiError(exc.status, str(exc)) from None
        except LaunchFailed as exc:
            raise ApiError(LAUNCH_FAILED, str(exc)) from None
        except (Declined, Unconfirmed) as exc:
            raise ApiError(409, str(exc)) from None

    def _refused(self, op: str, caller: str, exc: Exception) -> None:
        self._metrics.internal_refused[op] += 1
        log.warning("refused %s from %s: %s", op, caller[:8], exc)
