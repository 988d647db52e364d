"""Content from outside the cluster: a real ``http.server`` listing on 127.0.0.1, one file by URL,
a cut import resumed, and an S3-compatible server (moto's, when it is installed)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.content.external import (
    READ_BLOCK_BYTES,
    ChunkHasher,
    SourceLimits,
    import_source,
    listing_links,
)
from agent.content.manifest import MIN_CHUNK_BYTES, ContentError, ContentManifest
from agent.content.store import DiskStore
from tests.content.memstore import MemStore

CHUNK = MIN_CHUNK_BYTES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server(folder: Path) -> Iterator[str]:
    """``python -m http.server`` serving ``folder`` on 127.0.0.1; its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):  # at most 10 s
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("http.server did not listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def tree(root: Path, sizes: dict[str, int]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for rel, size in sizes.items():
        data = os.urandom(size)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        out[rel] = data
    return out


def read_back(store: MemStore | DiskStore, m: ContentManifest) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for f in m.files:
        blobs = [store.read_chunk(d) for d in f.chunks]
        assert all(b is not None for b in blobs)
        out[f.path] = b"".join(b for b in blobs if b is not None)[: f.size_bytes]
    return out


def test_chunk_hasher_matches_hashing_each_chunk() -> None:
    data = os.urandom(5 * CHUNK + 123)
    h = ChunkHasher(CHUNK)
    for i in range(0, len(data), 7777):
        h.feed(data[i : i + 7777])
    want = [hashlib.sha256(data[i : i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
    assert h.finish() == tuple(want) and h.size_bytes == len(data)
    assert ChunkHasher(CHUNK).finish() == (hashlib.sha256(b"").hexdigest(),)


def test_a_listing_is_followed_only_below_itself() -> None:
    page = """<ul>
    <li><a href="a.bin">a.bin</a></li><li><a href="sub/">sub/</a></li>
    <li><a href="x%20y.txt">x y.txt</a></li><li><a href="../up">up</a></li>
    <li><a href="/etc/passwd">abs</a></li><li><a href="http://evil/x">far</a></li>
    <li><a href="?C=N;O=D">sort</a></li><li><a href=".hidden">h</a></li>
    <li><a href="a.bin">again</a></li></ul>"""
    assert listing_links(page) == [("a.bin", False), ("sub", True), ("x y.txt", False)]


@pytest.mark.parametrize("kind", ["memory", "disk"])
async def test_an_http_listing_is_fetched_recursively_into_the_store(
    tmp_path: Path, kind: str
) -> None:
    served = tmp_path / "served"
    files = tree(
        served / "imagenet",
        {"train/a.bin": 3 * CHUNK + 5, "train/deep/b.bin": 10, "val/c.bin": 0, "d e.txt": 99},
    )
    store: MemStore | DiskStore = MemStore() if kind == "memory" else DiskStore(tmp_path / "st")
    counts: Counter[str] = Counter()
    seen: list[int] = []
    with http_server(served) as base:
        m = await import_source(
            f"{base}/imagenet/",
            "imagenet",
            store,
            tmp_path / "staging",
            counts=counts,
            chunk_bytes=CHUNK,
            on_progress=lambda held, total: seen.append(held),
        )
    assert sorted(f.path for f in m.files) == sorted(files)
    assert not store.missing(m.digest) and store.manifest(m.digest) == m
    assert read_back(store, m) == files
    assert counts["bytes_http"] == sum(len(v) for v in files.values())
    assert seen and seen[-1] == counts["bytes_http"]
    assert not any((tmp_path / "staging").iterdir())  # the staging folder is removed
    if isinstance(store, DiskStore):
        store.close()


async def test_one_file_by_url_and_a_missing_one(tmp_path: Path) -> None:
    files = tree(tmp_path / "served", {"weights.bin": 2 * CHUNK})
    store = MemStore()
    with http_server(tmp_path / "served") as base:
        m = await import_source(
            f"{base}/weights.bin", "w", store, tmp_path / "s", counts=Counter(), chunk_bytes=CHUNK
        )
        assert read_back(store, m) == files
        with pytest.raises(ContentError, match="answered 404"):
            await import_source(f"{base}/nope.bin", "w", store, tmp_path / "s", counts=Counter())
    with pytest.raises(ContentError, match="not an http"):
        await import_source("file:///etc/passwd", "w", store, tmp_path / "s", counts=Counter())


async def test_a_cut_import_resumes_without_downloading_whole_files_again(tmp_path: Path) -> None:
    files = tree(tmp_path / "served" / "ds", {"a.bin": 2 * CHUNK, "b.bin": 5 * CHUNK})
    store = MemStore()
    staging = tmp_path / "staging"
    with http_server(tmp_path / "served") as base:
        counts: Counter[str] = Counter()
        with pytest.raises(ContentError, match="bytes in all"):
            await import_source(
                f"{base}/ds/",
                "ds",
                store,
                staging,
                counts=counts,
                chunk_bytes=CHUNK,
                limits=SourceLimits(max_total_bytes=3 * CHUNK),
            )
        again: Counter[str] = Counter()
        m = await import_source(
            f"{base}/ds/", "ds", store, staging, counts=again, chunk_bytes=CHUNK
        )
    assert again["resumes"] == 1
    assert again["bytes_http"] == len(files["b.bin"])  # a.bin was not downloaded again
    assert read_back(store, m) == files


def s3_bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A client of the S3 server at ``endpoint``, with the bucket ``lab`` made; the agent's
    environment names the server as an AWS client reads it."""
    import boto3

    for k, v in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="lab")
    return s3


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


needs_s3 = pytest.mark.skipif(
    importlib.util.find_spec("boto3") is None or importlib.util.find_spec("moto") is None,
    reason="boto3 and moto[server] are not installed (not Shoal dependencies yet)",
)


@needs_s3
async def test_an_s3_prefix_is_fetched_from_a_real_s3_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with s3_server() as endpoint:
        s3 = s3_bucket(endpoint, monkeypatch)
        files = {"train/a.bin": os.urandom(3 * CHUNK + 1), "val/b.bin": os.urandom(100)}
        for rel, data in files.items():
            s3.put_object(Bucket="lab", Key=f"sets/imagenet/{rel}", Body=data)
        s3.put_object(Bucket="lab", Key="sets/other/x.bin", Body=b"not this")
        store = MemStore()
        counts: Counter[str] = Counter()
        m = await import_source(
            "s3://lab/sets/imagenet",
            "imagenet",
            store,
            tmp_path / "st",
            counts=counts,
            chunk_bytes=CHUNK,
        )
        assert read_back(store, m) == files
        assert counts["bytes_s3"] == sum(len(v) for v in files.values())
        one = await import_source(
            "s3://lab/sets/other/x.bin", "x", store, tmp_path / "st", counts=counts
        )
        assert [f.path for f in one.files] == ["x.bin"]
        with pytest.raises(ContentError, match="no object"):
            await import_source("s3://lab/none/", "n", store, tmp_path / "st", counts=counts)


@contextlib.asynccontextmanager
async def ranged_server(folder: Path, seen: list[dict[str, str]]) -> AsyncIterator[str]:
    """aiohttp's static files (``Range``, ``ETag``, ``If-Range`` by date only) on 127.0.0.1;
    each request's headers are put in ``seen``."""

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(dict(request.headers))
        response: web.StreamResponse = await handler(request)
        return response

    app = web.Application(middlewares=[record])
    app.router.add_static("/ds/", folder)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/ds"
    finally:
        await runner.cleanup()


async def cut_import(url: str, name: str, store: MemStore, staging: Path, limit_bytes: int) -> None:
    """An import of ``url`` stopped partway: past ``limit_bytes`` in all (a ``.part`` left)."""
    with pytest.raises(ContentError, match="bytes in all"):
        await import_source(
            url,
            name,
            store,
            staging,
            counts=Counter(),
            chunk_bytes=CHUNK,
            limits=SourceLimits(max_total_bytes=limit_bytes),
        )


def _part_bytes(staging: Path) -> int:
    [part] = list(staging.rglob("*.part"))
    return part.stat().st_size


@pytest.mark.parametrize("changed", [False, True])
async def test_a_file_cut_midway_goes_on_from_its_last_byte(tmp_path: Path, changed: bool) -> None:
    """A download stopped partway (here: past a byte limit) asks for the rest with ``Range``
    and ``If-Range``; if the file changed meanwhile it is fetched whole again, never spliced
    (aiohttp's server ignores an ``If-Range`` ETag: the answer's own ETag tells)."""
    size = 3 * READ_BLOCK_BYTES + 12_345
    files = tree(tmp_path / "served", {"big.bin": size})
    store = MemStore()
    staging = tmp_path / "staging"
    seen: list[dict[str, str]] = []
    async with ranged_server(tmp_path / "served", seen) as base:
        await cut_import(f"{base}/big.bin", "big", store, staging, 2 * READ_BLOCK_BYTES)
        had = _part_bytes(staging)
        assert 0 < had < size
        if changed:
            files = tree(tmp_path / "served", {"big.bin": size})
            os.utime(tmp_path / "served" / "big.bin", (time.time() + 5, time.time() + 5))
        again: Counter[str] = Counter()
        m = await import_source(
            f"{base}/big.bin", "big", store, staging, counts=again, chunk_bytes=CHUNK
        )
    [ranged] = [h for h in seen if "Range" in h]
    assert ranged["Range"] == f"bytes={had}-" and ranged["If-Range"]
    assert read_back(store, m) == files
    if changed:
        assert again["range_resumes"] == 0 and again["bytes_http"] == size
    else:
        assert again["range_resumes"] == 1 and again["bytes_http"] == size - had
    assert not list(staging.rglob("*.part")) and not list(staging.rglob("*.version"))


@needs_s3
async def test_an_s3_object_cut_midway_goes_on_from_its_last_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with s3_server() as endpoint:
        s3 = s3_bucket(endpoint, monkeypatch)
        data = os.urandom(3 * READ_BLOCK_BYTES + 999)
        s3.put_object(Bucket="lab", Key="big.bin", Body=data)
        store, staging = MemStore(), tmp_path / "st"
        await cut_import("s3://lab/big.bin", "big", store, staging, 2 * READ_BLOCK_BYTES)
        had = _part_bytes(staging)
        again: Counter[str] = Counter()
        m = await import_source(
            "s3://lab/big.bin", "big", store, staging, counts=again, chunk_bytes=CHUNK
        )
    assert read_back(store, m) == {"big.bin": data}
    assert again["range_resumes"] == 1 and again["bytes_s3"] == len(data) - had


async def test_a_file_whole_on_disk_but_not_yet_kept_is_asked_again_whole(tmp_path: Path) -> None:
    """Every byte came before the cut (the ``.part`` is whole, not yet renamed): the ranged ask
    is answered 416, and the file is fetched whole instead of failing for ever."""
    files = tree(tmp_path / "served", {"f.bin": 2 * READ_BLOCK_BYTES})
    store, staging = MemStore(), tmp_path / "staging"
    seen: list[dict[str, str]] = []
    async with ranged_server(tmp_path / "served", seen) as base:
        await cut_import(f"{base}/f.bin", "f", store, staging, READ_BLOCK_BYTES)
        [part] = list(staging.rglob("*.part"))
        part.write_bytes(files["f.bin"])  # as a cut between the last byte and the rename leaves
        again: Counter[str] = Counter()
        m = await import_source(
            f"{base}/f.bin", "f", store, staging, counts=again, chunk_bytes=CHUNK
        )
    assert read_back(store, m) == files
    assert again["range_resumes"] == 0 and again["bytes_http"] == len(files["f.bin"])
    [ranged] = [h for h in seen if "Range" in h]
    assert ranged["Range"] == f"bytes={len(files['f.bin'])}-"


@needs_s3
async def test_an_s3_object_whole_on_disk_but_not_yet_kept_is_asked_again_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with s3_server() as endpoint:
        s3 = s3_bucket(endpoint, monkeypatch)
        data = os.urandom(2 * READ_BLOCK_BYTES)
        s3.put_object(Bucket="lab", Key="f.bin", Body=data)
        store, staging = MemStore(), tmp_path / "st"
        await cut_import("s3://lab/f.bin", "f", store, staging, READ_BLOCK_BYTES)
        [part] = list(staging.rglob("*.part"))
        part.write_bytes(data)
        again: Counter[str] = Counter()
        m = await import_source(
            "s3://lab/f.bin", "f", store, staging, counts=again, chunk_bytes=CHUNK
        )
    assert read_back(store, m) == {"f.bin": data}
    assert again["range_resumes"] == 0 and again["bytes_s3"] == len(data)
