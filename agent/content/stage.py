"""Staging content on this node now, as an operator's ``stage`` command asks: from the members
that hold it, or from an HTTP(S) or S3-compatible source.

One stage runs per name or digest at a time (asked again while it runs, the running one is
answered); each is a task the agent can cancel. Its :class:`StageState` (state, bytes held of
the total, rate, holders in use, ETA, the one-line reason) is what the command answers and what
``GET /v1/content/stages`` shows.

From members: the live agents of the mesh (at most :data:`MAX_HOLDERS_ASKED` of them) are asked
what they hold of the digest; those that answer are the swarm's holders.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from agent.content.fetch import Fetcher, FetchError, Holder, PeerHolder
from agent.content.manifest import ContentError
from agent.content.store_api import ContentStore
from agent.content.swarm import Progress, SwarmLimits
from agent.mesh.context import Mesh
from agent.mesh.peers import PeerClient, PeerError
from agent.storage.sqlitefile import StoreFull

log = logging.getLogger("shoal.content")

MAX_HOLDERS_ASKED: Final = 64
MAX_STAGES_KEPT: Final = 64
"""Stages remembered (the oldest ended ones are forgotten first)."""
FIND_HOLDERS_S: Final = 30.0
"""How long after its first failed fetch a stage looks for members holding what it lacks while
its view is still filling (:attr:`Stager.view_filling`)."""
FIND_HOLDERS_SETTLED_S: Final = 4.0
"""How long it looks once every live member has said what it holds."""
VIEW_YOUNG_S: Final = 10.0
"""An agent started less than this long ago may not know every member yet (its first
push-pulls take a few probe rounds): its view counts as filling."""
FIND_HOLDERS_RETRY_S: Final = 2.0
"""How often it looks again meanwhile."""

State = Literal["staging", "done", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class StageState:
    name: str
    digest: str | None
    """``None`` while an external source is read and its manifest not yet made."""
    source: str
    """``peers``, or the URL."""
    state: State
    progress: Progress | None = None
    error: str = ""

    def line(self) -> str:
        if self.state == "staging":
            if self.progress is None:
                return f"staging {self.name}: finding holders"
            if self.progress.total_bytes == 0:  # an external source: its size is not known yet
                held = self.progress.held_bytes
                return f"staging {self.name}: {held} bytes from {self.source} so far"
            return self.progress.line(self.name)
        if self.state == "failed":
            return f"staging {self.name} failed: {self.error}"
        return f"{self.name} {self.state}"

    def to_wire(self) -> dict[str, Any]:
        p = self.progress
        return {
            "name": self.name,
            "digest": self.digest,
            "source": self.source,
            "state": self.state,
            "held_bytes": p.held_bytes if p else 0,
            "total_bytes": p.total_bytes if p else 0,
            "rate_bytes_per_s": round(p.rate_bytes_per_s, 1) if p else 0.0,
            "holders": p.holders_in_use if p else 0,
            "eta_s": None if p is None or p.eta_s is None else round(p.eta_s, 1),
            "line": self.line(),
            "error": self.error,
        }


class Stager:
    """This agent's stages (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        peers: PeerClient,
        mesh: Mesh,
        store: ContentStore,
        staging_dir: Path,
        counts: Counter[str],
        limits: SwarmLimits | None = None,
    ) -> None:
        """``counts``: the agent's ``shoal_content_total`` counter."""
        self.node_id = node_id
        self.peers = peers
        self.mesh = mesh
        self.store = store
        self.staging_dir = staging_dir
        self.counts = counts
        self.fetcher = Fetcher(store, limits=limits, counts=counts)
        self.started_at = time.monotonic()
        self.view_filling: Callable[[], bool] = lambda: True
        """Whether some live member's ``place`` record (what it holds) is not in this agent's
        view yet: a stage that found no holder looks longer then."""
        self.listed: Callable[[str], Sequence[str]] = lambda _digest: ()
        """The members whose ``place`` records say they hold a digest, whole or in part (asked
        first: in a large mesh the holders need not be among the first ids)."""
        self._states: dict[str, StageState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.changed: Callable[[], None] = lambda: None
        """Called when a stage ended with the content held (the agent republishes its data)."""

    def states(self) -> list[StageState]:
        return list(self._states.values())

    def state(self, key: str) -> StageState | None:
        return self._states.get(key)

    def start(
        self, name: str, digest: str | None, source: str | None, *, again: bool = False
    ) -> StageState:
        """Stage ``digest`` from members, or ``name`` from ``source`` (a URL); the state now. A
        stage running or done is answered as it stands; one failed or cancelled starts again, and
        one done too with ``again`` (a job needs what was evicted since)."""
        key = digest or name
        task = self._tasks.get(key)
        old = self._states.get(key)
        done = old is not None and old.state == "done" and not again
        if (task is not None and not task.done()) or done:
            return self._states[key]  # asked again: the stage as it stands (a poll)
        state = StageState(name, digest, source or "peers", "staging")
        self._states.pop(key, None)
        self._states[key] = state
        self._forget_old()
        if source is None:
            assert digest is not None
            run = self._from_peers(key, name, digest)
        else:
            run = self._from_source(key, name, source)
        self._tasks[key] = asyncio.create_task(self._guard(key, run), name=f"stage {name}")
        return state

    async def cancel(self, key: str) -> StageState | None:
        """Stop the stages of ``key`` (a digest, or a name: every stage of it); what they
        fetched stays held. The state of one of them once stopped (``None``: none here)."""
        keys = [k for k, st in self._states.items() if key in (k, st.name)]
        for k in keys:
            task = self._tasks.get(k)
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return self._states[keys[0]] if keys else None

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def wait(self, key: str) -> StageState:
        """The stage's state once it has ended (tests, and a command that waits)."""
        task = self._tasks.get(key)
        if task is not None:
            await asyncio.shield(task)
        return self._states[key]

    # -- inside ----------------------------------------------------------------------------------

    def _progress(self, key: str) -> Callable[[Progress], None]:
        def update(progress: Progress) -> None:
            old = self._states.get(key)
            if old is not None:
                self._states[key] = replace(old, progress=progress)

        return update

    def _set(self, key: str, **changes: Any) -> None:
        old = self._states.get(key)
        if old is not None:
            self._states[key] = replace(old, **changes)

    async def _guard(self, key: str, run: Any) -> None:
        try:
            await run
        except asyncio.CancelledError:
            self._set(key, state="cancelled")
            raise
        except (FetchError, ContentError, PeerError, StoreFull, OSError) as exc:
            log.warning("staging %s failed: %s", key[:40], exc)
            self.counts["stages_failed"] += 1
            self._set(key, state="failed", error=" ".join(str(exc).split())[:200])
        except Exception as exc:
            log.exception("staging %s failed", key[:40])
            self.counts["stages_failed"] += 1
            self._set(key, state="failed", error=f"internal error: {type(exc).__name__}")
        else:
            self._set(key, state="done")
            self.changed()

    def holders(self, digest: str | None = None) -> list[Holder]:
        """The live members to ask, at most :data:`MAX_HOLDERS_ASKED`: first those whose
        ``place`` records list ``digest`` (:attr:`listed`), then the others by id."""
        live = sorted(self.mesh.live_agents())
        alive = set(live)
        listed = [n for n in dict.fromkeys(self.listed(digest)) if n in alive] if digest else []
        first = set(listed)
        found: list[Holder] = []
        for node in [*listed, *(n for n in live if n not in first)]:
            addr = self.mesh.addr_of(node)
            if node != self.node_id and addr is not None:
                found.append(PeerHolder(self.peers, node, addr))
            if len(found) >= MAX_HOLDERS_ASKED:
                break
        return found

    async def _from_peers(self, key: str, name: str, digest: str) -> None:
        """Fetch from the members that hold it (one the mesh holds dead is given up at once).
        When none has what is missing, look for a member not asked yet, and fetch again with
        it: for :data:`FIND_HOLDERS_S` while the view is filling (just after this agent starts
        it may not know the members that hold the content yet: :data:`VIEW_YOUNG_S`, or some
        live member has not said what it holds), else for
        :data:`FIND_HOLDERS_SETTLED_S`. What was fetched is kept; a holder already asked is not
        waited for again."""
        failed_at: float | None = None
        holders = self.holders(digest)
        asked: set[str] = set()
        while True:
            asked.update(h.name for h in holders)
            try:
                got = await self.fetcher.fetch(
                    digest,
                    holders,
                    kind="peer",
                    on_progress=self._progress(key),
                    gone=self.mesh.is_gone,
                )
            except FetchError:
                if failed_at is None:
                    failed_at = time.monotonic()
                while True:
                    looked_s = time.monotonic() - failed_at
                    if looked_s >= FIND_HOLDERS_S or (
                        looked_s >= FIND_HOLDERS_SETTLED_S and not self._filling()
                    ):
                        raise
                    await asyncio.sleep(FIND_HOLDERS_RETRY_S)
                    holders = self.holders(digest)
                    if any(h.name not in asked for h in holders):
                        break
                continue
            if got.manifest.name != name:
                # The same bytes known by another name where they came from (two datasets of
                # equal content are one manifest): kept here under the name staged too, so this
                # node lists it, and a job that asks for it by that name finds it here.
                named = replace(got.manifest, name=name)
                await asyncio.to_thread(self.store.add_manifest, named)
            self._set(key, progress=got.progress)
            return

    def _filling(self) -> bool:
        young = time.monotonic() - self.started_at < VIEW_YOUNG_S
        return young or self.view_filling()

    async def _from_source(self, key: str, name: str, source: str) -> None:
        from agent.content import external

        started = time.monotonic()

        def update(held_bytes: int, total_bytes: int) -> None:
            spent = max(1e-3, time.monotonic() - started)
            rate = held_bytes / spent
            left = max(0, total_bytes - held_bytes)
            eta = None if rate <= 0 else left / rate
            self._progress(key)(Progress(held_bytes, total_bytes, rate, 1, eta))

        manifest = await external.import_source(
            source,
            name,
            self.store,
            self.staging_dir,
            counts=self.counts,
            on_progress=update,
        )
        total = manifest.total_bytes
        self._set(key, digest=manifest.digest, progress=Progress(total, total, 0.0, 0, 0.0))

    def _forget_old(self) -> None:
        for key in list(self._states):
            if len(self._states) <= MAX_STAGES_KEPT:
                break
            task = self._tasks.get(key)
            if task is None or task.done():
                self._states.pop(key)
                self._tasks.pop(key, None)


MAX_NODES: Final = 256
MAX_SOURCE_CHARS: Final = 2048


@dataclass(frozen=True, slots=True)
class StageAsk:
    """An operator's ``stage`` command: which content, from where, on which nodes."""

    name: str
    digest: str | None
    source: str | None
    nodes: tuple[str, ...]
    cancel: bool = False
    """Stop the stage instead (a pre-fetch no longer wanted): what it fetched stays held."""
    poll: bool = False
    """Answer each node's stage as it stands and start none (``shoal data stage --wait`` polls
    so: asked again, a stage that failed would start over and never be seen to fail)."""

    FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"name", "digest", "source", "nodes", "cancel", "poll"}
    )

    @property
    def key(self) -> str:
        return self.digest or self.name

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> StageAsk:
        """Decode and check the command's body; :class:`ValueError` says what is wrong."""
        from agent.content.routes import check_digest
        from agent.wire.place import dataset_name_problem

        unknown = sorted(set(body) - cls.FIELDS)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}: this agent does not honour it")
        name = body.get("name")
        if not isinstance(name, str) or (problem := dataset_name_problem(name)) is not None:
            raise ValueError(problem if isinstance(name, str) else "name must be a dataset name")
        digest, source = body.get("digest"), body.get("source")
        if digest is not None:
            if not isinstance(digest, str):
                raise ValueError("digest must be 64 lowercase hex digits")
            try:
                check_digest(digest)
            except Exception:
                raise ValueError("digest must be 64 lowercase hex digits") from None
        if source is not None:
            if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
                raise ValueError(f"source must be a URL of at most {MAX_SOURCE_CHARS} characters")
            if not source.startswith(("http://", "https://", "s3://")):
                raise ValueError("source must be an http://, https:// or s3:// URL")
        if digest is not None and source is not None:
            raise ValueError("give the content's digest (NAME@DIGEST) or a source URL, not both")
        if digest is None and source is None and not body.get("cancel") and not body.get("poll"):
            raise ValueError("give the content's digest (NAME@DIGEST) or a source URL")
        nodes = body.get("nodes")
        if (
            not isinstance(nodes, list)
            or not 1 <= len(nodes) <= MAX_NODES
            or not all(isinstance(n, str) and 0 < len(n) <= 128 for n in nodes)
        ):
            raise ValueError(f"nodes must be a list of 1 to {MAX_NODES} node ids")
        cancel, poll = body.get("cancel", False), body.get("poll", False)
        if not isinstance(cancel, bool) or not isinstance(poll, bool):
            raise ValueError("cancel and poll must be true or false")
        if cancel and poll:
            raise ValueError("cancel or poll, not both")
        return cls(name, digest, source, tuple(dict.fromkeys(nodes)), cancel, poll)
