"""Checkpoints as content of the node's store: read into it, fetched through it, served by it.

A checkpoint is what an attempt left in its job's checkpoint folder. The runner reads the folder
into its content store as a manifest of kind ``checkpoint`` named by the job
(:func:`~agent.checkpoints.ckptfiles.build_checkpoint`): chunks are the store's, deduplicated
with everything else, so a checkpoint that changed little since the last one adds only the
chunks that changed. Bytes move only as content does (``agent.content.fetch``, the routes of
``agent.content.routes``): from several holders at once where there are several, every chunk
checked against its digest, resumed from the chunks held already.

Only a job's owner moves its checkpoint, and every move is a pull by the agent that is to hold it:

- the owner asks the runner for the checkpoint an attempt left (``checkpoint_of``: the runner
  reads its folder into its store and answers the digest; after each checkpoint the runner
  notices, and when the attempt stops) and fetches it from the runner;
- the owner tells its replica and the job's next owner to fetch the copy it holds
  (``checkpoint_copy``, with the holders), so that a copy outlives the node;
- the offer of the next attempt names the checkpoint and its holders (``ResumeFrom``): the
  runner fetches it before it starts. The owner lets the other holders serve that runner
  (``checkpoint_grant``).

Who may read a checkpoint's content (:meth:`Checkpoints.may_read`, the gate of the content routes
for the kind ``checkpoint``): an agent that may act as the job's owner (``agent.job.authority``),
the agent that started the attempt that ran here last, or an agent an owner named to run the
job's next attempt. Anyone else is refused (403) and counted
(``shoal_internal_refused_total{call="checkpoint"}``,
``shoal_checkpoint_total{what="refused_not_owner"}``). Jobs never hold an agent's key, so a job
cannot ask for anything.

What each node holds of a job is one pointer, ``<data_dir>/checkpoints/<job id>.json`` (the
attempt that wrote it and its digest); a newer attempt's checkpoint replaces it, an older one is
refused. A checkpoint is never evicted while its job has not ended (the agent lists them in the
store's kept content); once it ended, its copies are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from agent.checkpoints.ckptfiles import build_checkpoint, read_chunks, restore
from agent.common.errors import ApiError
from agent.content.fetch import Fetcher, FetchError, PeerHolder
from agent.content.manifest import ContentError
from agent.content.store import DiskStore
from agent.execution.jobuser import JobUser
from agent.job.jobspec import check_job_id
from agent.mesh.context import AgentContext
from agent.mesh.peers import PeerError, PeerRefused, PeerUnreachable
from agent.wire.calls import ResumeFrom
from agent.wire.ckptcalls import CheckpointCopy, CheckpointGrant, CheckpointNote
from gossip.fsmodes import ensure_dir

log = logging.getLogger("shoal.checkpoint")

KIND: Final = "checkpoint"
FETCH_TRIES: Final = 5
"""Starts of one fetch (the first, then resumes from what is held) before it is given up."""
RESUME_WAIT_S: Final = 0.2
"""The wait before the first resume of a cut fetch; it doubles for each further one."""
READ_TRIES: Final = 3
"""Reads of a folder the job rewrote while it was read, before the read is given up."""
PUT_BATCH_BYTES: Final = 32 << 20
COPY_TIMEOUT_S: Final = 600.0
"""How long a ``checkpoint_copy`` or ``checkpoint_of`` may take (the receiver fetches, the runner
reads its folder, before it answers)."""
MAX_GRANTS: Final = 10_000


class FolderChanged(ContentError):
    """The job rewrote a file of its checkpoint folder while it was read (read again)."""


class LocalJobs(Protocol):
    """What the checkpoints read of the jobs run here (``agent.running.runner.Runner``)."""

    def checkpoint_folder(self, job_id: str) -> Path:
        """The job's checkpoint folder on this node."""
        ...

    def last_attempt(self, job_id: str) -> tuple[int, str | None] | None:
        """The attempt of the job that runs or last ran here, and the agent that started it."""
        ...


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """One checkpoint of a job: written by ``attempt``, content ``digest``."""

    attempt: int
    digest: str


class Checkpoints:
    """This agent's checkpoints (module doc): read, held, fetched, handed on, restored."""

    def __init__(
        self,
        ctx: AgentContext,
        store: DiskStore,
        fetcher: Fetcher,
        local: LocalJobs,
        job_uid: int | None,
        refused: Counter[str],
        data_dir: Path,
    ) -> None:
        """``job_uid``: who owns the files of a job's folder (others are left out);
        ``refused``: the agent's ``shoal_internal_refused_total`` counter."""
        self.node_id = ctx.node_id
        self.authority = ctx.authority
        self.peers = ctx.peers
        self.addr_of = ctx.mesh.addr_of
        self.is_gone = ctx.mesh.is_gone
        self.store = store
        self.fetcher = fetcher
        self.local = local
        self.uid = job_uid
        self.root = data_dir / "checkpoints"
        ensure_dir(self.root, 0o700)
        self.counts: Counter[str] = Counter()
        """``shoal_checkpoint_total`` by what: read, pulled, handed, fetched, resumed,
        refused_not_owner, refused, failed."""
        self._refused = refused
        self._grants: dict[str, set[str]] = {}
        """Job -> the agents an owner named to run its next attempt (they may read it)."""
        self._holders: dict[tuple[str, str], set[str]] = {}
        """(job, digest) -> other agents known to hold that checkpoint whole."""
        self._fetching: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, job_id: str) -> asyncio.Lock:
        return self._locks.setdefault(job_id, asyncio.Lock())

    # -- what is held ----------------------------------------------------------------------------

    def _pointer(self, job_id: str) -> Path:
        return self.root / f"{check_job_id(job_id)}.json"

    def held(self, job_id: str) -> CheckpointRef | None:
        """The newest checkpoint of the job held whole here, if any."""
        try:
            doc = json.loads(self._pointer(job_id).read_text())
            ref = CheckpointRef(int(doc["attempt"]), str(doc["digest"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        held = self.store.held(ref.digest)
        return ref if held is not None and held.complete else None

    def _hold(self, job_id: str, ref: CheckpointRef) -> None:
        """``ref`` (whole in the store) is the job's checkpoint here now; what it replaces goes.
        Blocking."""
        old = self.held(job_id)
        if old is not None and old.digest != ref.digest and old.attempt > ref.attempt:
            raise ContentError(
                f"a checkpoint of attempt {old.attempt} is held; attempt {ref.attempt} is older"
            )
        if old is not None and old.digest == ref.digest and old.attempt >= ref.attempt:
            return
        path = self._pointer(job_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"attempt": ref.attempt, "digest": ref.digest}))
        tmp.replace(path)
        for digest in self.digests(job_id):
            if digest != ref.digest and digest not in self._fetching:
                self.store.forget(job_id, digest)

    def digests(self, job_id: str) -> list[str]:
        """Every checkpoint of the job the store knows here, whole or in part."""
        return [h.digest for h in self.store.all_held() if h.kind == KIND and h.name == job_id]

    def by_job(self) -> dict[str, set[str]]:
        """Job -> the checkpoints the store knows of it, whole or in part (kept while the job
        has not ended)."""
        out: dict[str, set[str]] = {}
        for h in self.store.all_held():
            if h.kind == KIND:
                out.setdefault(h.name, set()).add(h.digest)
        for digest in tuple(self._fetching):  # read from the store's thread
            out.setdefault("", set()).add(digest)
        return out

    def forget(self, job_id: str) -> None:
        """The job has ended: drop every copy held of it."""
        for digest in self.digests(job_id):
            self.store.forget(job_id, digest)
        self._pointer(job_id).unlink(missing_ok=True)
        self._locks.pop(job_id, None)
        self._grants.pop(job_id, None)
        for key in [k for k in self._holders if k[0] == job_id]:
            del self._holders[key]

    # -- who may read ----------------------------------------------------------------------------

    def may_read(self, job_id: str, caller: str) -> bool:
        if caller == self.node_id or self.authority.may_own(job_id, caller):
            return True
        if caller in self._grants.get(job_id, ()):
            return True
        last = self.local.last_attempt(job_id)
        return last is not None and last[1] == caller

    def _refuse(self, what: str, caller: str) -> None:
        self.counts["refused_not_owner"] += 1
        self._refused["checkpoint"] += 1
        log.warning("refused %s to %s", what, caller[:8])

    def gate(self, digest: str, caller: str) -> bool:
        """The content routes' gate for the kind ``checkpoint``: may ``caller`` read
        ``digest``, a checkpoint of the jobs it is named by here? A refusal is counted."""
        for name in self.store.names_of(digest):
            with contextlib.suppress(ValueError):
                if self.may_read(check_job_id(name), caller):
                    return True
        self._refuse(f"checkpoint {digest[:12]}", caller)
        return False

    def _check_owner(self, job_id: str, caller: str, what: str) -> None:
        if not self.authority.may_own(job_id, caller):
            self._refuse(f"{what} of {job_id[:8]}", caller)
            raise ApiError(403, f"{caller[:8]} may not move the checkpoint of job {job_id}")

    # -- the runner's side: its folder read into the store -------------------------------------

    async def read_folder(self, job_id: str, attempt: int) -> CheckpointRef | None:
        """The job's checkpoint folder here, read into the store as the checkpoint of
        ``attempt`` (``None``: the folder is empty or missing)."""
        folder = self.local.checkpoint_folder(job_id)
        async with self.lock(job_id):
            for tries in range(READ_TRIES):
                try:
                    return await asyncio.to_thread(self._read_folder, job_id, attempt, folder)
                except FolderChanged as exc:
                    if tries + 1 == READ_TRIES:
                        self.counts["failed"] += 1
                        raise
                    log.info("checkpoint of %s changed as it was read: %s", job_id[:8], exc)
        return None  # pragma: no cover - the loop returns or raises

    def _read_folder(self, job_id: str, attempt: int, folder: Path) -> CheckpointRef | None:
        built = build_checkpoint(folder, job_id, self.uid, self.store)
        manifest = built.manifest
        if not manifest.files:
            return None
        if built.skipped:
            log.warning("checkpoint of %s: %d entries left out", job_id[:8], built.skipped)
        self.store.add_manifest(manifest)
        wanted = {c.digest for c in self.store.missing(manifest.digest)}
        batch: list[Any] = []
        size = 0
        try:
            for at, data in read_chunks(folder, manifest, wanted):
                batch.append((at, data))
                size += len(data)
                if size >= PUT_BATCH_BYTES:
                    self.store.put_chunks(manifest.digest, batch)
                    batch, size = [], 0
            if batch:
                self.store.put_chunks(manifest.digest, batch)
        except ContentError as exc:
            held = self.held(job_id)
            if held is None or held.digest != manifest.digest:
                self.store.forget(job_id, manifest.digest)
            raise FolderChanged(str(exc)) from None
        ref = CheckpointRef(attempt, manifest.digest)
        self._hold(job_id, ref)
        self.counts["read"] += 1
        return ref

    async def of_attempt(self, job_id: str, attempt: int, caller: str) -> CheckpointRef | None:
        """``checkpoint_of``: the checkpoint the attempt ``attempt`` left here, read into the
        store, for an agent with a say over it (409 when another attempt ran here last: a
        stale folder is never served as a newer attempt's checkpoint)."""
        last = self.local.last_attempt(job_id)
        started_by = last[1] if last else None
        if caller != started_by and not self.authority.may_own(job_id, caller):
            self._refuse(f"the checkpoint of {job_id[:8]}", caller)
            raise ApiError(403, f"{caller[:8]} may not move the checkpoint of job {job_id}")
        if last is None or last[0] != attempt:
            what = f"attempt {last[0]}" if last else "no attempt"
            raise ApiError(409, f"{what} of {job_id} ran here last, not attempt {attempt}")
        return await self.read_folder(job_id, attempt)

    # -- fetching --------------------------------------------------------------------------------

    async def fetch(self, job_id: str, ref: CheckpointRef, holders: Iterable[str]) -> None:
        """Fetch what this node lacks of checkpoint ``ref`` from ``holders``, through the
        store, and hold it; a cut fetch starts again from the chunks held, a few times.
        Raises :class:`FetchError` when it cannot be fetched."""
        found = [
            PeerHolder(self.peers, node, addr)
            for node in dict.fromkeys(holders)
            if node != self.node_id and (addr := self.addr_of(node)) is not None
        ]
        self._fetching.add(ref.digest)
        try:
            for tries in range(FETCH_TRIES):
                if tries:
                    self.counts["resumed"] += 1
                    await asyncio.sleep(RESUME_WAIT_S * 2 ** (tries - 1))
                try:
                    # a holder the mesh holds dead is given up at once, as a stage does
                    got = await self.fetcher.fetch(ref.digest, found, gone=self.is_gone)
                    break
                except (FetchError, ContentError) as exc:
                    log.info("checkpoint %s of %s (try %d): %s", ref.digest[:12], job_id[:8],
                             tries + 1, exc)  # fmt: skip
            else:
                self.counts["failed"] += 1
                raise FetchError(f"checkpoint {ref.digest[:12]} of {job_id[:8]}: not fetched")
            if got.manifest.kind != KIND:
                self.counts["refused"] += 1
                raise FetchError(f"{ref.digest[:12]} is a {got.manifest.kind}, not a checkpoint")
            named = dataclasses.replace(got.manifest, name=job_id)
            async with self.lock(job_id):
                await asyncio.to_thread(self.store.add_manifest, named)
                if got.manifest.name != job_id:  # a holder's name for it is not kept
                    await asyncio.to_thread(self.store.forget, got.manifest.name, ref.digest)
                await asyncio.to_thread(self._hold, job_id, ref)
        finally:
            self._fetching.discard(ref.digest)
        self.counts["fetched"] += 1

    # -- the owner's side ------------------------------------------------------------------------

    async def pull(self, job_id: str, node: str, attempt: int) -> CheckpointRef | None:
        """The checkpoint ``attempt`` left on ``node``, fetched here (``None``: the folder was
        empty, or the runner refused: another attempt ran there last)."""
        if node == self.node_id:
            try:
                return await self.of_attempt(job_id, attempt, self.node_id)
            except ApiError as exc:
                log.info("checkpoint of %s here: %s", job_id[:8], exc)
                self.counts["failed"] += 1
                return None
        addr = self.addr_of(node)
        if addr is None:
            return None
        try:
            answer = await self.peers.call(
                addr,
                "checkpoint_of",
                CheckpointNote(job_id, attempt).to_wire(),
                timeout_s=COPY_TIMEOUT_S,  # the runner reads the folder (hashes it) first
            )
        except PeerRefused as exc:  # a refusal would only be repeated
            self.counts["failed"] += 1
            log.info("checkpoint of %s on %s refused: %s", job_id[:8], node[:8], exc)
            return None
        if answer.get("checkpoint") is None:
            return None
        at = ResumeFrom.from_wire(answer["checkpoint"], "checkpoint")
        if at.attempt != attempt:
            raise ContentError(f"{node[:8]} answered attempt {at.attempt}, not {attempt}")
        ref = CheckpointRef(at.attempt, at.digest)
        held = self.held(job_id)
        if held is None or held.digest != ref.digest:
            await self.fetch(job_id, ref, [node])
            self.counts["pulled"] += 1
        else:
            await asyncio.to_thread(self._hold, job_id, ref)
        self._note_holder(job_id, ref.digest, node)
        return ref

    def _note_holder(self, job_id: str, digest: str, node: str) -> None:
        self._holders.setdefault((job_id, digest), set()).add(node)
        while len(self._holders) > MAX_GRANTS:
            del self._holders[next(iter(self._holders))]

    def _other_holders(self, job_id: str, digest: str, node: str) -> list[str]:
        """The live agents besides this one and ``node`` known to hold ``digest`` whole (a dead
        runner is never asked: it would only hold the fetch up)."""
        live = set(self.authority.live_agents())
        known = self._holders.get((job_id, digest), set())
        return sorted(n for n in known if n in live and n not in (node, self.node_id))

    async def hand(self, job_id: str, node: str) -> CheckpointRef | None:
        """Have ``node`` (the job's replica, its next owner) fetch the copy held here; what it
        then holds (``None``: nothing held here to hand on). Raises :class:`PeerError` when the
        copy did not get there."""
        held = self.held(job_id)
        if held is None or node == self.node_id:
            return held
        addr = self.addr_of(node)
        if addr is None:
            raise PeerUnreachable(f"no address for {node[:8]}")
        others = self._other_holders(job_id, held.digest, node)
        order = CheckpointCopy(job_id, held.attempt, held.digest, tuple(others))
        await self.peers.call(addr, "checkpoint_copy", order.to_wire(), timeout_s=COPY_TIMEOUT_S)
        self._note_holder(job_id, held.digest, node)
        self.counts["handed"] += 1
        return held

    async def receive_copy(self, order: CheckpointCopy, caller: str) -> dict[str, Any]:
        """``checkpoint_copy``: an owner of the job has this node fetch its copy."""
        self._check_owner(order.job_id, caller, "a copy")
        ref = CheckpointRef(order.attempt, order.digest)
        try:
            await self.fetch(order.job_id, ref, [caller, *order.holders])
        except (FetchError, ContentError) as exc:  # a full store answers 507 (the API's)
            raise ApiError(502, f"checkpoint {order.digest[:12]}: {exc}") from None
        return {"ok": True}

    def grant(self, job_id: str, node: str) -> None:
        """``node`` runs (or is to run) the job's next attempt: it may read its checkpoint."""
        self._grants.setdefault(job_id, set()).add(node)
        while len(self._grants) > MAX_GRANTS:
            del self._grants[next(iter(self._grants))]

    def receive_grant(self, order: CheckpointGrant, caller: str) -> dict[str, Any]:
        """``checkpoint_grant``: an owner of the job lets ``order.node`` read its checkpoint."""
        self._check_owner(order.job_id, caller, "a grant")
        self.grant(order.job_id, order.node)
        return {"ok": True}

    async def offer_to(self, job_id: str, node: str) -> ResumeFrom | None:
        """What the offer of the job's next attempt on ``node`` names: the copy held here and
        its holders (this node, and those that let ``node`` read it); ``None``: none held."""
        held = self.held(job_id)
        if held is None:
            return None
        holders = [self.node_id]
        if node != self.node_id:
            self.grant(job_id, node)
            for other in self._other_holders(job_id, held.digest, node):
                if await self._grant_on(other, job_id, node):
                    holders.append(other)
        return ResumeFrom(held.attempt, held.digest, tuple(holders))

    async def _grant_on(self, holder: str, job_id: str, node: str) -> bool:
        addr = self.addr_of(holder)
        if addr is None:
            return False
        try:
            await self.peers.call(addr, "checkpoint_grant", CheckpointGrant(job_id, node).to_wire())
        except PeerError as exc:
            log.info("checkpoint of %s: no grant on %s: %s", job_id[:8], holder[:8], exc)
            return False
        return True

    # -- the runner's side: an attempt's start ---------------------------------------------------

    async def restore(
        self, job_id: str, resume: ResumeFrom, dest: Path, user: JobUser
    ) -> CheckpointRef:
        """Fetch the checkpoint the offer names (what is not held here yet) and put it into
        ``dest`` (the job's checkpoint folder), as the job user."""
        ref = CheckpointRef(resume.attempt, resume.digest)
        held = self.held(job_id)
        if held is None or held.digest != ref.digest:
            await self.fetch(job_id, ref, resume.holders)
        async with self.lock(job_id):
            tree = await asyncio.to_thread(self.store.tree, ref.digest)
            manifest = await asyncio.to_thread(self.store.manifest, ref.digest)
            if tree is None or manifest is None:
                raise ContentError(f"checkpoint {ref.digest[:12]} of {job_id[:8]} is not held")
            await asyncio.to_thread(restore, tree, manifest, dest, user)
            await asyncio.to_thread(self.store.use, ref.digest)
        return ref
