"""The fetcher over in-process holders and an in-memory store: several holders share the work,
a corrupt holder is dropped, a dead one is given up, a cut fetch resumes from what is held, and a
cancelled one stops."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.content import fetch
from agent.content.fetch import (
    BUNDLE_CHUNK_BYTES,
    MAX_BUNDLE_CHUNKS,
    Fetcher,
    FetchError,
    Have,
    bundles,
    have_from_wire,
    have_to_wire,
)
from agent.content.manifest import ChunkAt, ContentError, ContentFile, ContentManifest
from agent.content.swarm import Ask, SwarmLimits
from agent.mesh.peers import PeerUnreachable
from tests.content.memstore import MemStore

CHUNK = 64 << 10


def dataset(n_chunks: int, name: str = "imagenet") -> tuple[ContentManifest, dict[str, bytes]]:
    data = os.urandom(n_chunks * CHUNK - 100)
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    digests = tuple(hashlib.sha256(p).hexdigest() for p in pieces)
    m = ContentManifest(
        "dataset", name, CHUNK, (ContentFile("train/a.bin", len(data), 0o644, digests),)
    )
    return m, dict(zip(digests, pieces, strict=True))


def full_store(m: ContentManifest, chunks: dict[str, bytes]) -> MemStore:
    s = MemStore()
    s.add_manifest(m)
    for c in m.chunk_places():
        s.put_chunk(m.digest, c, chunks[c.digest])
    return s


class LocalHolder:
    """A holder in this process: serves from a store, maybe corrupt, maybe dead, maybe slow."""

    def __init__(self, name: str, store: MemStore, *, corrupt: bool = False) -> None:
        self.name = name
        self.store = store
        self.corrupt = corrupt
        self.dead = False
        self.dead_chunks = False
        self.asked = 0
        self.bundles = 0
        self.delay_s = 0.0
        self.served: Counter[str] = Counter()
        self.pause_after: int | None = None
        """Serve that many chunks, then hang until cancelled."""

    async def manifest(self, digest: str) -> ContentManifest:
        m = self.store.manifest(digest)
        if m is None or self.dead:
            raise PeerUnreachable("no")
        return m

    async def have(self, manifest: ContentManifest) -> Have:
        if self.dead:
            raise PeerUnreachable("dead")
        return have_from_wire(manifest, have_to_wire(manifest, self.store.missing(manifest.digest)))

    async def chunk(self, manifest: ContentManifest, chunk: ChunkAt) -> bytes:
        if self.pause_after is not None and sum(self.served.values()) >= self.pause_after:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay_s)
        self.asked += 1
        if self.dead or self.dead_chunks:
            raise PeerUnreachable("dead")
        data = self.store.read_chunk(chunk.digest)
        assert data is not None
        self.served[chunk.digest] += 1
        return b"x" + data[1:] if self.corrupt else data

    async def chunks(self, manifest: ContentManifest, chunks: Sequence[ChunkAt]) -> list[bytes]:
        self.bundles += 1
        return [await self.chunk(manifest, c) for c in chunks]


async def test_three_holders_share_the_work() -> None:
    m, chunks = dataset(30)
    holders = [LocalHolder(n, full_store(m, chunks)) for n in "abc"]
    store = MemStore()
    store.add_manifest(m)
    counts: Counter[str] = Counter()
    got = await Fetcher(store, counts=counts).fetch(m.digest, holders)
    assert store.missing(m.digest) == []
    assert got.progress.held_bytes == m.total_bytes and not got.resumed
    for h in holders:
        assert sum(h.served.values()) >= 5, h.served
    assert counts["bytes_peer"] == m.total_bytes and counts["fetched"] == 1
    assert max(store.puts.values()) == 1


async def test_the_manifest_comes_from_a_holder_when_unknown_here() -> None:
    m, chunks = dataset(3)
    store = MemStore()
    await Fetcher(store).fetch(m.digest, [LocalHolder("a", full_store(m, chunks))])
    assert store.manifest(m.digest) == m and store.missing(m.digest) == []


async def test_a_corrupt_holder_is_dropped_and_the_dataset_ends_verified() -> None:
    m, chunks = dataset(20)
    bad = LocalHolder("bad", full_store(m, chunks), corrupt=True)
    good = LocalHolder("good", full_store(m, chunks))
    store = MemStore()
    store.add_manifest(m)
    counts: Counter[str] = Counter()
    await Fetcher(store, counts=counts).fetch(m.digest, [bad, good])
    assert store.missing(m.digest) == []
    assert all(hashlib.sha256(v).hexdigest() == k for k, v in store.chunks.items())
    assert sum(bad.served.values()) >= 1
    assert counts["holders_dropped"] == 1 and counts["chunks_refused"] >= 1


async def test_a_dead_holder_is_given_up_and_the_others_finish() -> None:
    m, chunks = dataset(12)
    dead = LocalHolder("dead", full_store(m, chunks))
    live = LocalHolder("live", full_store(m, chunks))
    dead.dead_chunks = True  # it said what it has, then died
    live.delay_s = 0.01  # slow enough that the dead one, backing off, is asked again
    store = MemStore()
    counts: Counter[str] = Counter()
    fetcher = Fetcher(store, counts=counts, limits=SwarmLimits(backoff_s=0.01, max_failures=2))
    await asyncio.wait_for(fetcher.fetch(m.digest, [dead, live]), 30)
    assert store.missing(m.digest) == []
    assert counts["holders_given_up"] == 1 and counts["holders_dropped"] == 0
    assert dead.asked >= 2 and sum(live.served.values()) == 12


async def test_a_holder_the_mesh_holds_gone_is_given_up_at_once_its_asks_taken_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder whose host went away mid-ask (no answer, no reset) is given up as soon as the
    mesh holds it dead: its asks in flight are cancelled and go to the others, rather than
    waiting out the chunk time-out and a back-off."""
    monkeypatch.setattr(fetch, "GONE_CHECK_S", 0.01)
    m, chunks = dataset(12)
    hung = LocalHolder("hung", full_store(m, chunks))
    hung.pause_after = 1  # serves one chunk, then never answers again
    live = LocalHolder("live", full_store(m, chunks))
    live.delay_s = 0.02
    store = MemStore()
    counts: Counter[str] = Counter()
    gone: set[str] = set()
    fetcher = Fetcher(store, counts=counts)
    task = asyncio.create_task(fetcher.fetch(m.digest, [hung, live], gone=gone.__contains__))
    while not hung.served:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    assert not task.done()
    gone.add("hung")
    await asyncio.wait_for(task, 5)
    assert store.missing(m.digest) == []
    assert counts["holders_given_up"] == 1
    assert sum(live.served.values()) >= 11 and max(store.puts.values()) == 1


async def test_a_fetch_whose_only_holder_is_gone_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch, "GONE_CHECK_S", 0.01)
    m, chunks = dataset(6)
    hung = LocalHolder("hung", full_store(m, chunks))
    hung.pause_after = 0
    store = MemStore()
    store.add_manifest(m)
    gone = {"hung"}
    with pytest.raises(FetchError, match="no holder has 6 of its chunks"):
        await asyncio.wait_for(Fetcher(store).fetch(m.digest, [hung], gone=gone.__contains__), 5)


async def test_no_holder_with_a_chunk_is_a_clear_error() -> None:
    m, chunks = dataset(4)
    partial = MemStore()
    partial.add_manifest(m)
    first = next(iter(m.chunk_places()))
    partial.put_chunk(m.digest, first, chunks[first.digest])
    store = MemStore()
    with pytest.raises(FetchError, match="no holder has 3 of its chunks"):
        await Fetcher(store).fetch(m.digest, [LocalHolder("p", partial)])
    assert store.missing(m.digest) != [] and first.digest in store.chunks


async def test_a_cut_fetch_resumes_and_never_fetches_a_held_chunk_again(tmp_path: Path) -> None:
    m, chunks = dataset(16)
    holder = LocalHolder("a", full_store(m, chunks))
    store = MemStore(tmp_path)
    holder.pause_after = 5
    fetcher = Fetcher(store, limits=SwarmLimits(max_in_flight=1))
    task = asyncio.create_task(fetcher.fetch(m.digest, [holder]))
    for _ in range(2000):  # at most 10 s
        await asyncio.sleep(0.005)
        if len(store.chunks) >= 5:
            break
    task.cancel()  # a pre-fetch no longer wanted: it stops
    with pytest.raises(asyncio.CancelledError):
        await task
    held = len(store.chunks)
    assert held == 5
    served_before = Counter(holder.served)
    holder.pause_after = None

    restarted = MemStore(tmp_path)  # the agent restarted: the store on disk is all it has
    counts: Counter[str] = Counter()
    got = await Fetcher(restarted, counts=counts).fetch(m.digest, [holder])
    assert got.resumed and counts["resumes"] == 1
    assert restarted.missing(m.digest) == []
    assert max(holder.served.values()) == 1  # each chunk served once, over both fetches
    assert len(served_before) == 5
    assert sum(restarted.puts.values()) == 16 - held


def test_have_bitmap_round_trips_and_refuses_what_does_not_fit() -> None:
    m, _ = dataset(10)
    places = list(m.chunk_places())
    wire = have_to_wire(m, places[3:7])
    have = have_from_wire(m, wire)
    assert not have.whole
    assert have.chunks == {c.digest for c in places[:3] + places[7:]}
    assert have_from_wire(m, have_to_wire(m, [])) == Have(True)
    with pytest.raises(ContentError, match="does not fit"):
        have_from_wire(m, {"whole": False, "bitmap": "AAAA"})
    with pytest.raises(ContentError, match="whole"):
        have_from_wire(m, {"bitmap": ""})


async def test_a_manifest_other_than_the_one_named_is_refused() -> None:
    m, _ = dataset(3)
    other, other_chunks = dataset(3, "other")

    class Swapper(LocalHolder):
        async def manifest(self, digest: str) -> ContentManifest:
            return other

    store = MemStore()
    counts: Counter[str] = Counter()
    with pytest.raises(FetchError, match="no holder serves the manifest"):
        await Fetcher(store, counts=counts).fetch(
            m.digest, [Swapper("liar", full_store(other, other_chunks))]
        )
    assert counts["manifests_refused"] == 1 and store.manifests == {}


async def test_a_holder_that_missed_one_answer_of_what_it_has_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch, "HAVE_RETRY_S", 0.01)
    m, chunks = dataset(4)

    class Slow(LocalHolder):
        missed = 0

        async def have(self, manifest: ContentManifest) -> Have:
            if self.missed == 0:
                self.missed += 1
                raise PeerUnreachable("timed out")
            return await super().have(manifest)

    only = Slow("slow", full_store(m, chunks))
    store = MemStore()
    store.add_manifest(m)
    await asyncio.wait_for(Fetcher(store).fetch(m.digest, [only]), 30)
    assert store.missing(m.digest) == [] and only.missed == 1


def test_small_chunks_asked_of_one_holder_go_in_one_request() -> None:
    asks = [
        Ask(h, ChunkAt(f"{i:064x}", 0, 0, size))
        for i, (h, size) in enumerate(
            [("a", 10), ("b", 10), ("a", 10), ("a", BUNDLE_CHUNK_BYTES + 1), ("b", 10)]
        )
    ]
    groups = bundles(asks)
    assert [[asks.index(a) for a in g] for g in groups] == [[0, 2], [1, 4], [3]]
    many = [Ask("a", ChunkAt(f"{i:064x}", 0, 0, 1)) for i in range(MAX_BUNDLE_CHUNKS + 1)]
    assert [len(g) for g in bundles(many)] == [MAX_BUNDLE_CHUNKS, 1]
    heavy = [Ask("a", ChunkAt(f"{i:064x}", 0, 0, BUNDLE_CHUNK_BYTES)) for i in range(9)]
    assert [len(g) for g in bundles(heavy)] == [8, 1]  # 8 MiB a request at most


async def test_a_fetch_of_many_small_chunks_asks_for_them_together() -> None:
    m, chunks = dataset(40)
    holder = LocalHolder("a", full_store(m, chunks))
    store = MemStore()
    await Fetcher(store).fetch(m.digest, [holder])
    assert store.missing(m.digest) == []
    assert holder.bundles <= 2 and sum(holder.served.values()) == 40
