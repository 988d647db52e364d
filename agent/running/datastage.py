"""A job's datasets on its runner: resolved, staged into the content store, exposed read-only.

Before an attempt starts here (a single job's, and each gang member's: both go through
:meth:`agent.running.runner.Runner.launch`), every dataset its signed spec names is

1. *resolved* to one version: ``NAME@DIGEST`` is that version; ``NAME`` is the newest version any
   ``place`` record in this node's view (or this node's own store) lists;
2. *staged*: a version this store holds whole is a hit; any other is a miss, fetched from the
   members that hold it (``agent.content.stage``: several holders at once, every chunk checked
   against the manifest before the store keeps it). One stage runs per version: a pre-fetch of
   the same version already under way is the one waited for. While it runs, :meth:`JobData.line`
   says ``staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)`` for the job (the node record
   carries it; the owner makes it the job's reason);
3. *exposed*: a tree of hardlinks to the store's read-only objects in the job's own folder,
   ``<data_dir>/jobs/<job>/datasets/<NAME>/`` (the agent's, folders 0755, files 0444), and the
   job's environment says where: ``SHOAL_DATA_<NAME>`` (:func:`env_name`: the name upper-cased,
   ``.`` and ``-`` turned into ``_``) and ``SHOAL_DATASETS`` (``name=path`` pairs, ``:``
   between them, in the spec's order).

The job starts only on a version the store holds whole: every chunk was checked when it was kept
and every file whole when it became an object. A staging that cannot end (no member holds the
version, every holder served corrupt chunks, the disk is full) *declines* the offer with one line:
nothing ran, so the job stays pending with that line as its reason and its owner places it again
(here or elsewhere, by its usual retry rules); what was fetched stays as cache. A dataset whose
name two spellings share (``a.b`` and ``a-b`` are both ``SHOAL_DATA_A_B``) fails the launch: no
node could start it.

A dataset of this host's own folder (indexed in place) is linked the same way when it lies on the
store's filesystem, else exposed at its own path.

:class:`Prefetches` (``agent.running.prefetch``) stages for jobs that wait elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.content.stage import Stager, StageState
from agent.content.store import DiskStore
from agent.mesh.view import ClusterView
from agent.wire.place import DatasetRef, parse_dataset_ref

log = logging.getLogger("shoal.runner")

DATASETS_DIR: Final = "datasets"
"""The folder of a job's datasets inside its own folder."""
WAIT_BUCKETS_S: Final = (0.0, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0)
"""The buckets of ``shoal_job_data_wait_seconds``."""
POLL_S: Final = 1.0
MAX_TRIES: Final = 2
"""Times one version is staged for one launch (a pre-fetch cancelled under it starts it again)."""


class StagingFailed(Exception):
    """A dataset could not be staged here: the offer is declined with this line."""


class BadDatasets(Exception):
    """The spec's datasets cannot be exposed on any node (two share a variable name)."""


def dataset_paths(env: Mapping[str, str]) -> list[str]:
    """The dataset folders among a job's variables (``SHOAL_DATA_<NAME>``): what a container
    attempt mounts read-only."""
    return [path for key, path in env.items() if key.startswith("SHOAL_DATA_")]


def env_name(name: str) -> str:
    """``SHOAL_DATA_<NAME>``: the dataset name upper-cased, ``.`` and ``-`` made ``_``."""
    return "SHOAL_DATA_" + name.upper().replace(".", "_").replace("-", "_")


@dataclass(frozen=True, slots=True)
class Version:
    name: str
    digest: str

    def __str__(self) -> str:
        return f"{self.name}@{self.digest[:12]}"


@dataclass(slots=True)
class WaitHistogram:
    """Each job's wait for its data, in seconds (``shoal_job_data_wait_seconds``)."""

    buckets_s: tuple[float, ...] = WAIT_BUCKETS_S
    counts: list[int] | None = None
    sum_s: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        if self.counts is None:
            self.counts = [0] * len(self.buckets_s)
        for i, edge in enumerate(self.buckets_s):
            if seconds <= edge:
                self.counts[i] += 1
        self.sum_s += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs, ``+Inf`` last, as Prometheus wants them."""
        counts = self.counts or [0] * len(self.buckets_s)
        return [(repr(float(e)), n) for e, n in zip(self.buckets_s, counts, strict=True)] + [
            ("+Inf", self.count)
        ]


def newest_version(
    name: str, view: ClusterView, store: DiskStore, live: Collection[str] | None = None
) -> str | None:
    """The digest of the newest version of ``name`` in the place records (of the ``live``
    members, when given) and this store."""
    best: tuple[float, str] | None = None
    for node_id, node in list(view.nodes.items()):
        if live is not None and node_id not in live:
            continue
        for v in node.place.versions if node.place is not None else ():
            if v.name == name and (best is None or (v.created_s, v.digest) > best):
                best = (v.created_s, v.digest)
    for h in store.all_held():
        newer = best is None or (h.created_s, h.digest) > best
        if h.kind == "dataset" and h.name == name and newer:
            best = (h.created_s, h.digest)
    return None if best is None else best[1]


def holders_of(view: ClusterView, digest: str) -> list[str]:
    """The members whose ``place`` records hold some of ``digest``, the most held first."""
    found: list[tuple[int, str]] = []
    for node_id, node in list(view.nodes.items()):
        for v in node.place.versions if node.place is not None else ():
            if v.digest == digest and v.held_bytes > 0:
                found.append((-v.held_bytes, node_id))
    return [n for _held, n in sorted(found)]


def places_unheard(view: ClusterView, live: Callable[[], Collection[str]], me: str) -> bool:
    """Some live member other than ``me`` has no ``place`` record in the view yet (what it holds
    is not known here: a view still filling)."""
    for node_id in live():
        node = view.nodes.get(node_id)
        if node_id != me and (node is None or node.place is None):
            return True
    return False


def resolve(
    ref: DatasetRef, view: ClusterView, store: DiskStore, live: Collection[str] | None = None
) -> Version:
    """The version ``ref`` names: its digest, or the newest of ``NAME`` (:func:`newest_version`)."""
    if ref.digest is not None:
        return Version(ref.name, ref.digest)
    digest = newest_version(ref.name, view, store, live)
    if digest is None:
        raise StagingFailed(f"dataset {ref.name}: no member holds any version of it")
    return Version(ref.name, digest)


def check_names(refs: Sequence[str]) -> list[DatasetRef]:
    """The spec's refs parsed, or :class:`BadDatasets` for two that share a variable name."""
    parsed = [parse_dataset_ref(r) for r in refs]
    seen: dict[str, str] = {}
    for ref in parsed:
        var = env_name(ref.name)
        if var in seen and seen[var] != ref.name:
            raise BadDatasets(f"datasets {seen[var]!r} and {ref.name!r} are both {var}")
        if var in seen:
            raise BadDatasets(f"dataset {ref.name!r} is named twice")
        seen[var] = ref.name
    return parsed


class JobData:
    """Staging and exposing the datasets of the jobs that start here (the module docstring)."""

    def __init__(
        self,
        view: ClusterView,
        store: DiskStore,
        stager: Stager,
        counts: Counter[str],
        changed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``counts``: ``hits``, ``misses``, ``failed`` (``shoal_job_data_total``);
        ``changed``: called as a stage's progress moves (the node record says it)."""
        self.view = view
        self.changed = changed
        self.store = store
        self.stager = stager
        self.counts = counts
        self.clock = clock
        self.waits = WaitHistogram()
        self.staging: dict[str, Version] = {}
        """Job -> the version its launch waits for now."""
        self.needed: dict[str, tuple[Version, ...]] = {}
        """Job -> the versions of a launch under way (kept from eviction)."""
        self.prefetched: Callable[[], set[Version]] = set
        """The versions pre-fetched here for waiting jobs (``agent.running.prefetch``)."""
        self.prefetch_done: Callable[[str], None] = lambda _job_id: None
        """Told when a job's launch begins here: its pre-fetch, if any, is its launch now."""
        self.link_wanted: Callable[[], None] = lambda: None
        """Told when a starting job must fetch: pre-fetches give it the link."""
        self.link_free: Callable[[], None] = lambda: None
        """Told when no starting job fetches any more: pre-fetches go on."""

    def line(self, job_id: str) -> str | None:
        """What the job waits for, with the fetch's progress; ``None``: it does not wait."""
        v = self.staging.get(job_id)
        if v is None:
            return None
        state = self.stager.state(v.digest)
        if state is None or state.state != "staging":
            return f"staging {v.name}"
        return state.line()

    def lines(self) -> dict[str, str]:
        return {j: line for j in list(self.staging) if (line := self.line(j)) is not None}

    def waited_on(self) -> set[str]:
        """The digests launches here wait for (a pre-fetch of one is not cancelled)."""
        return {v.digest for v in self.staging.values()}

    def protected(self) -> set[Version]:
        """The versions of the launches and pre-fetches under way here (never evicted)."""
        return {v for vs in self.needed.values() for v in vs} | self.prefetched()

    async def prepare(self, job_id: str, refs: Sequence[str], job_dir: Path) -> dict[str, str]:
        """Stage and expose the job's datasets; the variables the job gets. Raises
        :class:`StagingFailed` (decline), :class:`BadDatasets` (the launch fails)."""
        parsed = check_names(refs)
        self.prefetch_done(job_id)
        began = self.clock()
        try:
            live = set(self.stager.mesh.live_agents())
            versions = tuple(resolve(r, self.view, self.store, live) for r in parsed)
            self.needed[job_id] = versions
            for v in versions:
                await self._stage(job_id, v)
            paths = await asyncio.to_thread(self._expose, job_dir, versions)
        except StagingFailed:
            self.counts["failed"] += 1
            self.needed.pop(job_id, None)
            raise
        except BaseException:
            self.needed.pop(job_id, None)
            raise
        self.waits.observe(max(0.0, self.clock() - began))
        env = {env_name(v.name): str(p) for v, p in zip(versions, paths, strict=True)}
        env["SHOAL_DATASETS"] = ":".join(
            f"{v.name}={p}" for v, p in zip(versions, paths, strict=True)
        )
        return env

    async def stage_content(self, job_id: str, name: str, digest: str) -> None:
        """Stage one piece of content the job's signed spec names by digest (its working folder,
        ``agent.running.workstage``) as a dataset version is staged: shown as the job's reason
        while it moves, kept from eviction while the launch is under way. Raises
        :class:`StagingFailed`."""
        v = Version(name, digest)
        self.needed[job_id] = (*self.needed.get(job_id, ()), v)
        try:
            await self._stage(job_id, v)
        except StagingFailed:
            self.counts["failed"] += 1
            raise
        finally:
            self.staging.pop(job_id, None)

    async def ended(self, job_dir: Path) -> None:
        """An attempt ended: its datasets' links go (another job run as the same user must not
        find them in its folder; the store keeps the data)."""
        await asyncio.to_thread(_remove, job_dir / DATASETS_DIR)

    def started(self, job_id: str) -> None:
        """The attempt started (or did not): its versions are the running job's now."""
        self.needed.pop(job_id, None)

    async def _stage(self, job_id: str, v: Version) -> None:
        held = await asyncio.to_thread(self.store.held, v.digest)
        if held is not None and held.complete:
            self.counts["hits"] += 1
            await asyncio.to_thread(self.store.use, v.digest)
            return
        self.counts["misses"] += 1
        self.staging[job_id] = v
        self.link_wanted()
        try:
            await self._fetch(v)
        finally:
            del self.staging[job_id]
            if not self.staging:
                self.link_free()

    async def _fetch(self, v: Version) -> None:
        for _ in range(MAX_TRIES):
            self.stager.start(v.name, v.digest, None, again=True)  # not whole here: fetch
            state = await self._wait(v.digest)
            if state is None:
                continue  # a pre-fetch of it was cancelled under us: start it again
            if state.state == "failed":
                raise StagingFailed(f"staging {v.name} failed: {state.error}")
            held = await asyncio.to_thread(self.store.held, v.digest)
            if held is None or not held.complete:
                raise StagingFailed(f"staging {v.name}: the copy here is not complete")
            await asyncio.to_thread(self.store.use, v.digest)
            return
        raise StagingFailed(f"staging {v.name} was cancelled")

    async def _wait(self, digest: str) -> StageState | None:
        """The stage's end; ``None`` when it was cancelled (a pre-fetch no longer wanted) while
        this task was not. The node record is told of its progress every :data:`POLL_S`."""
        waiter = asyncio.ensure_future(self.stager.wait(digest))
        try:
            while not (await asyncio.wait({waiter}, timeout=POLL_S))[0]:
                self.changed()
        except asyncio.CancelledError:
            waiter.cancel()
            raise
        self.changed()
        try:
            state = waiter.result()
        except asyncio.CancelledError:
            return None
        return None if state.state == "cancelled" else state

    # -- exposing (blocking: in a thread) ----------------------------------------------------------

    def _expose(self, job_dir: Path, versions: Iterable[Version]) -> list[Path]:
        top = job_dir / DATASETS_DIR
        _fresh_dir(job_dir, top)
        out: list[Path] = []
        for v in versions:
            tree = self.store.tree(v.digest)
            if tree is None:
                raise StagingFailed(f"dataset {v.name}: the copy here is not complete")
            dest = top / v.name
            try:
                _link_tree(tree, dest)
            except OSError as exc:
                held = self.store.held(v.digest)
                if held is None or held.origin is None:
                    raise StagingFailed(
                        f"dataset {v.name}: cannot link it for the job: {exc}"
                    ) from None
                shutil.rmtree(dest, ignore_errors=True)
                out.append(tree)  # this host's own folder, on another filesystem
                continue
            out.append(dest)
        return out


def _remove(top: Path) -> None:
    """``top`` gone, whatever it is (never following a link the job may have put there)."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(top)  # does not follow links (an earlier job may have left some)
    else:
        os.unlink(top)


def _fresh_dir(job_dir: Path, top: Path) -> None:
    """An empty ``top`` (the agent's, 0755) in ``job_dir``, whatever an earlier attempt left."""
    job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _remove(top)
    os.mkdir(top, 0o755)
    os.chmod(top, 0o755)


def _link_tree(src: Path, dest: Path) -> None:
    """``dest``: folders 0755, each file a hardlink of ``src``'s (never a copy, never a link
    followed out of ``src``)."""
    os.mkdir(dest, 0o755)
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        for d in dirs:
            if not os.path.islink(Path(root) / d):
                os.mkdir(dest / rel / d, 0o755)
        for f in files:
            path = Path(root) / f
            if os.path.islink(path):
                continue
            os.link(path, dest / rel / f, follow_symlinks=False)
    for root, dirs, _files in os.walk(dest):
        for d in dirs:
            os.chmod(Path(root) / d, 0o755)
    os.chmod(dest, 0o755)
