"""Fetching one manifest's chunks into this node's :class:`~agent.content.store_api.ContentStore`:
the I/O around :class:`~agent.content.swarm.Swarm`.

:class:`Fetcher` learns the manifest (from the store, or from the first holder that serves one
whose digest is the one asked for), asks the store what is still missing (so a fetch cut off, or
an agent restarted, goes on from what is held: nothing held is ever fetched again), asks each
holder what it has, then runs the swarm: several holders at once, every chunk checked against its
digest before the store keeps it (the store checks again), the disk calls in threads. A holder
that serves a chunk that does not match is dropped for this manifest; one that does not answer
backs off. Cancelling the task that awaits :meth:`Fetcher.fetch` (a pre-fetch no longer wanted)
cancels the asks in flight; what arrived is kept.

:class:`PeerHolder` is a member of the cluster as a holder, over the agents' channel
(:class:`agent.mesh.peers.PeerClient`, mutual TLS, routes of :mod:`agent.content.routes`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from agent.content.manifest import (
    MAX_CHUNK_BYTES,
    ChunkAt,
    ContentError,
    ContentManifest,
    check_chunk,
)
from agent.content.store_api import ContentStore
from agent.content.swarm import Ask, Progress, Swarm, SwarmLimits
from agent.mesh.peers import PeerClient, PeerError, PeerRefused, PeerUnreachable

log = logging.getLogger("shoal.content")

PATH: Final = "/v1/internal/content"
MAX_MANIFEST_BYTES: Final = 64 << 20
CHUNK_TIMEOUT_S: Final = 30.0
HAVE_TIMEOUT_S: Final = 10.0
HAVE_TRIES: Final = 3
"""How often a holder that did not answer what it has is asked (a refusal is not asked again)."""
HAVE_RETRY_S: Final = 1.0
GONE_CHECK_S: Final = 1.0
"""With a ``gone`` test, how often a fetch looks whether its holders are still members."""
SLOT_BYTES: Final = 4 << 20
"""An ask of a chunk this big or bigger counts one against the swarm's caps; a smaller one its
share (``SwarmLimits.slot_bytes``)."""
BUNDLE_CHUNK_BYTES: Final = 1 << 20
"""Chunks up to this size asked of one holder at once go in one request (``/chunks``)."""
MAX_BUNDLE_CHUNKS: Final = 128
MAX_BUNDLE_BYTES: Final = 8 << 20

SourceKind = Literal["peer", "http", "s3"]


MAX_RESUMED_KEPT = 4096
"""Resumed digests remembered (then forgotten all at once: a rare recount, never a leak)."""


class FetchError(Exception):
    """A fetch that cannot end: no holder has some chunk, or none serves the manifest."""


@dataclass(frozen=True, slots=True)
class Have:
    """What a holder says it holds of a manifest: all of it, or the chunks in ``chunks``."""

    whole: bool
    chunks: frozenset[str] = frozenset()


def distinct_chunks(manifest: ContentManifest) -> list[str]:
    """The manifest's chunk digests, each once, in the order they first appear."""
    return list(dict.fromkeys(c.digest for c in manifest.chunk_places()))


def have_to_wire(manifest: ContentManifest, missing: Sequence[ChunkAt]) -> dict[str, Any]:
    """``{"whole": true}``, or the held chunks as a bitmap over :func:`distinct_chunks`
    (base64, bit ``i`` of byte ``i // 8`` from the low end): 32 KiB for a 1 TB dataset."""
    if not missing:
        return {"whole": True}
    gone = {c.digest for c in missing}
    order = distinct_chunks(manifest)
    bits = bytearray((len(order) + 7) // 8)
    for i, d in enumerate(order):
        if d not in gone:
            bits[i // 8] |= 1 << (i % 8)
    return {"whole": False, "bitmap": base64.b64encode(bytes(bits)).decode()}


def have_from_wire(manifest: ContentManifest, value: Any) -> Have:
    """Decode a holder's answer; one that does not fit the manifest raises :class:`ContentError`."""
    if not isinstance(value, dict) or not isinstance(value.get("whole"), bool):
        raise ContentError("have refused: not an object with a boolean 'whole'")
    if value["whole"]:
        return Have(True)
    order = distinct_chunks(manifest)
    try:
        bits = base64.b64decode(str(value.get("bitmap", "")), validate=True)
    except ValueError:
        raise ContentError("have refused: the bitmap is not base64") from None
    if len(bits) != (len(order) + 7) // 8:
        raise ContentError("have refused: the bitmap does not fit the manifest")
    return Have(False, frozenset(d for i, d in enumerate(order) if bits[i // 8] >> (i % 8) & 1))


class Holder(Protocol):
    """Where the chunks of one manifest may come from."""

    @property
    def name(self) -> str: ...

    async def manifest(self, digest: str) -> ContentManifest: ...

    async def have(self, manifest: ContentManifest) -> Have: ...

    async def chunk(self, manifest: ContentManifest, chunk: ChunkAt) -> bytes: ...

    async def chunks(self, manifest: ContentManifest, chunks: Sequence[ChunkAt]) -> list[bytes]:
        """Several small chunks in one ask (:func:`bundles`), in order."""
        ...


def bundles(asks: Sequence[Ask]) -> list[list[Ask]]:
    """``asks`` as the requests that carry them: the small chunks asked of one holder together
    (up to :data:`MAX_BUNDLE_CHUNKS` and :data:`MAX_BUNDLE_BYTES` a request), every other
    alone."""
    out: list[list[Ask]] = []
    open_: dict[str, tuple[list[Ask], int]] = {}
    for ask in asks:
        size = ask.chunk.length_bytes
        if size > BUNDLE_CHUNK_BYTES:
            out.append([ask])
            continue
        group, total = open_.get(ask.holder, ([], 0))
        if not group or len(group) >= MAX_BUNDLE_CHUNKS or total + size > MAX_BUNDLE_BYTES:
            group, total = [], 0
            out.append(group)
        group.append(ask)
        open_[ask.holder] = (group, total + size)
    return out


def split_bundle(body: bytes, chunks: Sequence[ChunkAt], holder: str) -> list[bytes]:
    """A ``/chunks`` answer cut into its chunks (each checked later, against its digest)."""
    if len(body) != sum(c.length_bytes for c in chunks):
        raise PeerUnreachable(f"{holder[:8]}: {len(chunks)} chunks answered cut short or long")
    out, at = [], 0
    for c in chunks:
        out.append(body[at : at + c.length_bytes])
        at += c.length_bytes
    return out


class PeerHolder:
    """A member that may hold the manifest, asked over the agents' channel."""

    def __init__(self, peers: PeerClient, node_id: str, addr: str) -> None:
        self._peers, self._addr = peers, addr
        self.name = node_id
        self._places: tuple[str, dict[str, int]] = ("", {})
        """The last manifest's distinct chunks, by digest: their places (``/chunks?n=``)."""

    async def manifest(self, digest: str) -> ContentManifest:
        raw = await self._peers.fetch(
            self._addr, f"{PATH}/{digest}", max_bytes=MAX_MANIFEST_BYTES, timeout_s=60.0
        )
        try:
            manifest = ContentManifest.from_wire(json.loads(raw))
        except ValueError as exc:
            raise ContentError(f"manifest from {self.name[:8]} refused: {exc}") from None
        if manifest.digest != digest:
            raise ContentError(f"manifest from {self.name[:8]} refused: not the one asked for")
        return manifest

    async def have(self, manifest: ContentManifest) -> Have:
        raw = await self._peers.fetch(
            self._addr,
            f"{PATH}/{manifest.digest}/have",
            max_bytes=MAX_MANIFEST_BYTES // 8,
            timeout_s=HAVE_TIMEOUT_S,
        )
        try:
            return have_from_wire(manifest, json.loads(raw))
        except ValueError as exc:
            raise PeerUnreachable(f"{self.name[:8]}: {exc}") from None

    async def chunk(self, manifest: ContentManifest, chunk: ChunkAt) -> bytes:
        return await self._peers.fetch(
            self._addr,
            f"{PATH}/chunk/{chunk.digest}?of={manifest.digest}",
            max_bytes=min(chunk.length_bytes, MAX_CHUNK_BYTES),
            timeout_s=CHUNK_TIMEOUT_S,
        )

    async def chunks(self, manifest: ContentManifest, chunks: Sequence[ChunkAt]) -> list[bytes]:
        digest, places = self._places
        if digest != manifest.digest:
            places = {d: n for n, d in enumerate(distinct_chunks(manifest))}
            self._places = (manifest.digest, places)
        numbers = ",".join(str(places[c.digest]) for c in chunks)
        body = await self._peers.fetch(
            self._addr,
            f"{PATH}/{manifest.digest}/chunks?n={numbers}",
            max_bytes=sum(c.length_bytes for c in chunks),
            timeout_s=CHUNK_TIMEOUT_S,
        )
        return split_bundle(body, chunks, self.name)


@dataclass(frozen=True, slots=True)
class Fetched:
    manifest: ContentManifest
    progress: Progress
    resumed: bool
    """Some of it was held before this fetch began."""


class Fetcher:
    """Runs one swarm per manifest into ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: ContentStore,
        *,
        limits: SwarmLimits | None = None,
        counts: Counter[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``counts``: ``bytes_peer``/``bytes_http``/``bytes_s3``, ``chunks_refused``,
        ``holders_dropped``, ``holders_given_up``, ``resumes``, ``fetched``, ``failed``."""
        self.store = store
        self.limits = limits or SwarmLimits(slot_bytes=SLOT_BYTES)
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self.clock = clock
        self._resumed: set[str] = set()
        """Digests counted as resumed: a copy is resumed once, however many tries it takes."""
        self.rates = HolderRates()
        """The bytes/s measured from each holder (its ``place`` record carries them: the
        policy's data term reads them, ``agent.policy.scoring.transfer_s``)."""

    async def learn(self, digest: str, holders: Sequence[Holder]) -> ContentManifest:
        """The manifest of ``digest``: the store's, or the first holder's that serves it."""
        known = await asyncio.to_thread(self.store.manifest, digest)
        if known is not None:
            return known
        for holder in holders:
            try:
                manifest = await holder.manifest(digest)
            except (PeerError, ContentError) as exc:
                log.info("manifest %s from %s: %s", digest[:12], holder.name[:8], exc)
                continue
            if manifest.digest != digest:
                log.warning("%s served another manifest for %s", holder.name[:8], digest[:12])
                self.counts["manifests_refused"] += 1
                continue
            await asyncio.to_thread(self.store.add_manifest, manifest)
            return manifest
        raise FetchError(f"no holder serves the manifest {digest[:12]}")

    async def fetch(
        self,
        digest: str,
        holders: Sequence[Holder],
        *,
        kind: SourceKind = "peer",
        on_progress: Callable[[Progress], None] | None = None,
        gone: Callable[[str], bool] | None = None,
    ) -> Fetched:
        """Fetch what this node lacks of ``digest`` from ``holders``; raises
        :class:`FetchError` when it cannot end, the store's ``StoreFull`` when it is full.
        A copy held in part counts one resume, however many tries it takes. ``gone``: whether
        the mesh holds a holder dead or left; such a holder is given up at once (its asks in
        flight cancelled), not retried through its back-off."""
        manifest = await self.learn(digest, holders)
        missing = await asyncio.to_thread(self.store.missing, digest)
        held = await asyncio.to_thread(self.store.held_bytes, digest)
        resumed = held > 0 and bool(missing)
        if resumed and digest not in self._resumed:
            if len(self._resumed) >= MAX_RESUMED_KEPT:
                self._resumed.clear()
            self._resumed.add(digest)
            self.counts["resumes"] += 1
        swarm = Swarm(
            missing, total_bytes=manifest.total_bytes, held_bytes=held, limits=self.limits
        )
        if missing:
            await self._ask_holders(swarm, manifest, holders)
            try:
                await self._run(
                    swarm, manifest, {h.name: h for h in holders}, kind, on_progress, gone
                )
            except BaseException:
                self.counts["failed"] += 1
                raise
            finally:
                self.counts["chunks_refused"] += swarm.counts.chunks_refused
                self.counts["holders_dropped"] += swarm.counts.holders_dropped
                self.counts["holders_given_up"] += swarm.counts.holders_given_up
        self.counts["fetched"] += 1
        held = await asyncio.to_thread(self.store.held_bytes, digest)
        progress = dataclasses.replace(swarm.progress(self.clock()), held_bytes=held)
        if on_progress is not None:
            on_progress(progress)
        return Fetched(manifest, progress, resumed)

    async def _ask_holders(
        self, swarm: Swarm, manifest: ContentManifest, holders: Sequence[Holder]
    ) -> None:
        async def one(holder: Holder) -> None:
            # A holder slow to answer (a loaded host, a peer restarting) is asked again before
            # it counts as holding nothing: a fetch whose only holder missed one answer would
            # otherwise end at once, "no holder has" its chunks.
            for attempt in range(HAVE_TRIES):
                try:
                    have = await holder.have(manifest)
                except PeerError as exc:
                    if attempt + 1 < HAVE_TRIES and isinstance(exc, PeerUnreachable):
                        await asyncio.sleep(HAVE_RETRY_S * (attempt + 1))
                        continue
                    log.info("%s has nothing of %s: %s", holder.name[:8], manifest.name, exc)
                    return
                swarm.add_holder(
                    holder.name, whole=have.whole, chunks=have.chunks, now=self.clock()
                )
                return

        await asyncio.gather(*(one(h) for h in holders))

    async def _run(
        self,
        swarm: Swarm,
        manifest: ContentManifest,
        holders: dict[str, Holder],
        kind: SourceKind,
        on_progress: Callable[[Progress], None] | None,
        gone: Callable[[str], bool] | None = None,
    ) -> None:
        flying: dict[asyncio.Task[list[bytes]], list[Ask]] = {}
        dropped: list[asyncio.Task[list[bytes]]] = []
        measure = _Measure()
        check_s = math.inf if gone is None else GONE_CHECK_S
        checked_at = -math.inf

        def give_up_gone() -> None:
            nonlocal checked_at
            if gone is None or self.clock() - checked_at < check_s:
                return
            checked_at = self.clock()
            for name in [n for n in holders if gone(n)]:
                if not swarm.give_up(name):
                    continue
                log.info("%s is gone from the mesh: given up", name[:8])
                for task, group in list(flying.items()):
                    if group[0].holder == name:
                        task.cancel()
                        del flying[task]
                        dropped.append(task)
                        for ask in group:
                            swarm.returned(ask)

        try:
            while not swarm.done:
                give_up_gone()
                now = self.clock()
                for group in bundles(swarm.next_asks(now)):
                    holder = group[0].holder
                    task = asyncio.create_task(_ask(holders[holder], manifest, group))
                    flying[task] = group
                    measure.asked(holder, now)
                if not flying:
                    if swarm.stuck:
                        raise FetchError(
                            f"{manifest.name}: no holder has {swarm.pending()} of its chunks"
                        )
                    wake = swarm.wake_at(now)
                    if wake is None:  # pragma: no cover - a swarm neither done nor stuck wakes
                        raise FetchError(f"{manifest.name}: nothing left to ask")
                    await asyncio.sleep(min(check_s, max(0.0, wake - now)))
                    continue
                wake = swarm.wake_at(now)
                timeout = min(check_s, math.inf if wake is None else max(0.001, wake - now))
                finished, _ = await asyncio.wait(
                    flying,
                    timeout=None if timeout == math.inf else timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in finished:
                    group = flying.pop(task)
                    kept = await self._answer(swarm, manifest, group, task, kind)
                    if kept:
                        measure.got(group[0].holder, kept, self.clock())
                if finished and on_progress is not None:
                    on_progress(swarm.progress(self.clock()))
        finally:
            for task in flying:
                task.cancel()
            if flying or dropped:
                await asyncio.gather(*flying, *dropped, return_exceptions=True)
            if kind == "peer":
                for holder, rate in measure.rates().items():
                    self.rates.note(holder, rate)

    async def _answer(
        self,
        swarm: Swarm,
        manifest: ContentManifest,
        group: list[Ask],
        task: asyncio.Task[list[bytes]],
        kind: SourceKind,
    ) -> int:
        """The bytes of ``group``'s chunks that arrived whole and were kept."""
        first = group[0]
        try:
            datas = task.result()
        except PeerError as exc:
            what = "refused" if isinstance(exc, PeerRefused) else "failed"
            log.info("%s %s chunk %s: %s", first.holder[:8], what, first.chunk.digest[:12], exc)
            swarm.failed(first, self.clock())  # one failure of the holder, however many chunks
            for ask in group[1:]:
                swarm.returned(ask)
            return 0
        # hashing 4 MiB takes milliseconds: off the event loop, with the write
        good, bad = await asyncio.to_thread(self._keep, manifest.digest, group, datas)
        if bad:
            log.warning(
                "dropping %s as a holder of %s: %d chunk(s) do not match (%s...)",
                first.holder[:8],
                manifest.name,
                len(bad),
                bad[0].chunk.digest[:12],
            )
        for ask in bad:
            swarm.corrupt(ask)
        now, kept = self.clock(), 0
        for ask in good:
            swarm.got(ask, now)
            kept += ask.chunk.length_bytes
        self.counts[f"bytes_{kind}"] += kept
        return kept

    def _keep(
        self, digest: str, group: Sequence[Ask], datas: Sequence[bytes]
    ) -> tuple[list[Ask], list[Ask]]:
        """Check each chunk against its digest (whatever the store does), then keep those that
        match, together; the asks kept and those refused."""
        good: list[tuple[Ask, bytes]] = []
        bad: list[Ask] = []
        for ask, data in zip(group, datas, strict=True):
            try:
                check_chunk(ask.chunk.digest, data, ask.chunk.length_bytes)
            except ContentError:
                bad.append(ask)
                continue
            good.append((ask, data))
        if good:
            try:
                self.store.put_chunks(digest, [(ask.chunk, data) for ask, data in good])
            except ContentError:
                return [], [*bad, *(ask for ask, _ in good)]
        return [ask for ask, _ in good], bad


async def _ask(holder: Holder, manifest: ContentManifest, group: Sequence[Ask]) -> list[bytes]:
    """The bytes of ``group``'s chunks, from one request (:func:`bundles`)."""
    if len(group) == 1:
        return [await holder.chunk(manifest, group[0].chunk)]
    return await holder.chunks(manifest, [ask.chunk for ask in group])


MIN_MEASURED_BYTES: Final = 1 << 20
"""A holder's rate is measured from a fetch that took at least this much from it."""
MAX_RATES_KEPT: Final = 64


class _Measure:
    """Bytes each holder served in one fetch, from its first ask to its last chunk."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.bytes: Counter[str] = Counter()

    def asked(self, holder: str, now: float) -> None:
        self.first.setdefault(holder, now)

    def got(self, holder: str, length_bytes: int, now: float) -> None:
        self.bytes[holder] += length_bytes
        self.last[holder] = now

    def rates(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for holder, got in self.bytes.items():
            spent = self.last[holder] - self.first[holder]
            if got >= MIN_MEASURED_BYTES and spent > 0:
                out[holder] = got / spent
        return out


class HolderRates:
    """The rate measured from each holder, smoothed over fetches (the newest weighs half)."""

    def __init__(self) -> None:
        self.by_holder: dict[str, float] = {}

    def note(self, holder: str, rate_bytes_per_s: float) -> None:
        old = self.by_holder.pop(holder, None)
        self.by_holder[holder] = rate_bytes_per_s if old is None else (old + rate_bytes_per_s) / 2
        while len(self.by_holder) > MAX_RATES_KEPT:
            del self.by_holder[next(iter(self.by_holder))]

    def snapshot(self) -> dict[str, float]:
        return dict(self.by_holder)
