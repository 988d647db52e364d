"""Content from outside the cluster: an HTTP(S) URL (one file, or an index page of links read
recursively) or an S3-compatible bucket (:mod:`agent.content.s3source`).

An external source has no manifest: its files are downloaded into a staging folder under the
agent's data folder, hashed chunk by chunk as they arrive (:class:`ChunkHasher`), and once all are
in, the manifest is made, the store told of it and given the chunks it still misses (read back
from the staged files); the staging folder is then removed. The dataset is content like any
other from then on: members fetch it from this node by digest. A file downloaded whole is
recorded (``done.json``): a stage cut off, or an agent restarted, downloads only the rest
(``shoal_content_total{what="resumes"}``). A file cut off midway goes on from its last byte on
disk when the source can say the file is still the one begun (HTTP: a ``Range`` request with
``If-Range`` naming the first answer's strong ``ETag`` or ``Last-Modified``; S3: ``Range`` with
``IfMatch`` on its ``ETag``; ``shoal_content_total{what="range_resumes"}``); a source that cannot,
or whose file changed, sends the whole file again, and the download starts over from byte 0.

Limits (:class:`SourceLimits`): files, depth of a listing, bytes of a listing page, bytes in all;
over any of them the stage fails with one line that says which.

A listing (a URL ending in ``/``) is an HTML page's ``<a href>`` links, as Python's
``http.server`` or nginx's ``autoindex`` write them: only relative links below the page are
followed (a link with a scheme, a host, a query, a ``/`` or ``..`` at its start is passed over),
a link ending in ``/`` is a folder.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import ssl
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Final, Protocol

import aiohttp

from agent.content.manifest import (
    DEFAULT_CHUNK_BYTES,
    ContentError,
    ContentFile,
    ContentLimits,
    ContentManifest,
    check_content,
    path_problem,
)
from agent.content.store_api import ContentStore

log = logging.getLogger("shoal.content")

READ_BLOCK_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class SourceLimits:
    max_files: int = 100_000
    max_depth: int = 16
    max_listing_bytes: int = 8 << 20
    max_total_bytes: int = ContentLimits().max_total_bytes
    connect_timeout_s: float = 15.0
    read_timeout_s: float = 60.0
    """The longest a source may send nothing mid-file."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str
    """Relative, ``/``-separated: where the file sits in the dataset."""
    locator: str
    """What the source reads it by (a URL, an object key)."""


@dataclass(frozen=True, slots=True)
class Opened:
    """A file being read from a source."""

    start_bytes: int
    """Where ``blocks`` begin: the offset asked for, or 0 when the source sends the whole file
    (it cannot send part of one, or the file is no longer the one named by the validator)."""
    validator: str | None
    """What names this version of the file at the source (a strong ETag, a Last-Modified
    date), to resume it later; ``None``: it cannot be resumed."""
    blocks: AsyncIterator[bytes]


class Source(Protocol):
    kind: str
    """``http`` or ``s3`` (the label of ``shoal_content_fetched_bytes_total``)."""

    async def files(self) -> list[RemoteFile]: ...

    def open(
        self, f: RemoteFile, offset_bytes: int = 0, validator: str | None = None
    ) -> AbstractAsyncContextManager[Opened]:
        """Read ``f`` from ``offset_bytes`` if it is still the version ``validator`` names."""
        ...

    async def close(self) -> None: ...


class ChunkHasher:
    """Sans I/O: the SHA-256 of each ``chunk_bytes`` piece of a stream fed in blocks."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.size_bytes = 0
        self.digests: list[str] = []
        self._h = hashlib.sha256()
        self._in = 0

    def feed(self, block: bytes) -> None:
        view = memoryview(block)
        while view:
            take = min(len(view), self.chunk_bytes - self._in)
            self._h.update(view[:take])
            self._in += take
            self.size_bytes += take
            view = view[take:]
            if self._in == self.chunk_bytes:
                self.digests.append(self._h.hexdigest())
                self._h, self._in = hashlib.sha256(), 0

    def finish(self) -> tuple[str, ...]:
        if self._in or not self.digests:
            self.digests.append(self._h.hexdigest())
            self._h, self._in = hashlib.sha256(), 0
        return tuple(self.digests)


# -- HTTP(S) -------------------------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def listing_links(page: str) -> list[tuple[str, bool]]:
    """The entries an index page links to: (name, is a folder), relative links below it only."""
    parser = _Links()
    parser.feed(page)
    out: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for href in parser.links:
        parts = urllib.parse.urlsplit(href)
        if parts.scheme or parts.netloc or parts.query or not parts.path:
            continue
        path = parts.path
        if path.startswith(("/", ".")):
            continue
        folder = path.endswith("/")
        name = urllib.parse.unquote(path.rstrip("/"))
        if not name or "/" in name or name in seen:
            continue
        seen.add(name)
        out.append((name, folder))
    return out


class HttpSource:
    kind = "http"

    def __init__(self, url: str, limits: SourceLimits) -> None:
        self.url = url
        self.limits = limits
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=limits.connect_timeout_s, sock_read=limits.read_timeout_s
        )
        ctx = ssl.create_default_context()
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(ssl=ctx, limit=8)
        )

    async def close(self) -> None:
        await self._session.close()

    async def files(self) -> list[RemoteFile]:
        path = urllib.parse.urlsplit(self.url).path
        if not path.endswith("/"):
            name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
            if path_problem(name) is not None:
                raise ContentError(f"{self.url}: no file name in the URL")
            return [RemoteFile(name, self.url)]
        found: list[RemoteFile] = []
        await self._walk(self.url, "", 0, found)
        if not found:
            raise ContentError(f"{self.url}: the listing links to no file")
        return found

    async def _walk(self, url: str, prefix: str, depth: int, found: list[RemoteFile]) -> None:
        if depth > self.limits.max_depth:
            raise ContentError(f"{url}: folders deeper than {self.limits.max_depth}")
        page = await self._page(url)
        for name, folder in listing_links(page):
            rel = f"{prefix}{name}"
            if path_problem(rel) is not None:
                log.info("listing %s: passing over %r", url, name)
                continue
            link = urllib.parse.urljoin(url, urllib.parse.quote(name) + ("/" if folder else ""))
            if folder:
                await self._walk(link, f"{rel}/", depth + 1, found)
            else:
                found.append(RemoteFile(rel, link))
                if len(found) > self.limits.max_files:
                    raise ContentError(f"{self.url}: more than {self.limits.max_files} files")

    async def _page(self, url: str) -> str:
        async with self._session.get(url) as response:
            _check_status(url, response.status)
            body = await response.content.read(self.limits.max_listing_bytes + 1)
            if len(body) > self.limits.max_listing_bytes:
                raise ContentError(f"{url}: a listing over {self.limits.max_listing_bytes} bytes")
            return body.decode(response.charset or "utf-8", "replace")

    @asynccontextmanager
    async def open(
        self, f: RemoteFile, offset_bytes: int = 0, validator: str | None = None
    ) -> AsyncIterator[Opened]:
        if offset_bytes > 0 and validator is not None:
            headers = {"Range": f"bytes={offset_bytes}-", "If-Range": validator}
            async with self._session.get(f.locator, headers=headers) as response:
                now = http_validator(
                    response.headers.get("ETag"), response.headers.get("Last-Modified")
                )
                # a server that does not know If-Range (aiohttp's takes only dates) may send
                # the range of a changed file: the answer's own version says so
                if response.status == 206 and now == validator:
                    start = range_start(response.headers.get("Content-Range", ""))
                    if start != offset_bytes:
                        raise ContentError(
                            f"{f.locator}: answered bytes from {start}, asked from {offset_bytes}"
                        )
                    yield Opened(start, now, response.content.iter_chunked(READ_BLOCK_BYTES))
                    return
                if response.status == 200:
                    yield Opened(0, now, response.content.iter_chunked(READ_BLOCK_BYTES))
                    return
                # anything else (a 416 for a file whose every byte came before the cut, a
                # changed file's range): the whole file, asked plainly
        async with self._session.get(f.locator) as response:
            _check_status(f.locator, response.status)
            yield Opened(
                0,
                http_validator(response.headers.get("ETag"), response.headers.get("Last-Modified")),
                response.content.iter_chunked(READ_BLOCK_BYTES),
            )


def _check_status(url: str, status: int) -> None:
    if status != 200:
        raise ContentError(f"{url}: answered {status}")


def range_start(content_range: str) -> int:
    """The first byte of a 206 answer's ``Content-Range: bytes 100-199/1000``; -1 if unreadable."""
    unit, _, spec = content_range.strip().partition(" ")
    first = spec.partition("-")[0]
    if unit != "bytes" or not first.isdigit():
        return -1
    return int(first)


def http_validator(etag: str | None, last_modified: str | None) -> str | None:
    """What ``If-Range`` may name: a strong ETag, else the Last-Modified date (RFC 9110 lets a
    date stand for a version when it is all the server gives); a weak ETag cannot."""
    if etag and not etag.startswith("W/"):
        return etag
    return last_modified or None


# -- the import ----------------------------------------------------------------------------------


def open_source(source: str, limits: SourceLimits) -> Source:
    scheme = urllib.parse.urlsplit(source).scheme
    if scheme in ("http", "https"):
        return HttpSource(source, limits)
    if scheme == "s3":
        from agent.content.s3source import S3Source

        s3: Source = S3Source(source, limits)
        return s3
    raise ContentError(f"source {source[:80]!r}: not an http(s):// or s3:// URL")


async def import_source(
    source: str,
    name: str,
    store: ContentStore,
    staging_dir: Path,
    *,
    counts: Counter[str],
    on_progress: Callable[[int, int], None] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    limits: SourceLimits | None = None,
) -> ContentManifest:
    """Download ``source`` as the dataset ``name`` into ``store`` (see the module docstring)."""
    limits = limits or SourceLimits()
    src = open_source(source, limits)
    folder = (
        staging_dir / hashlib.sha256(f"{source}\0{name}\0{chunk_bytes}".encode()).hexdigest()[:20]
    )
    try:
        listed = await src.files()
        done = _load_done(folder)
        if done:
            counts["resumes"] += 1
        files: list[ContentFile] = []
        held = sum(size for size, _ in done.values())
        for f in sorted(listed, key=lambda f: f.path):
            if f.path in done and (folder / "files" / f.path).is_file():
                size, chunks = done[f.path]
            else:
                size, chunks = await _download(
                    src, f, folder, chunk_bytes, limits, counts, held, on_progress
                )
                done[f.path] = (size, chunks)
                await asyncio.to_thread(_save_done, folder, done)
                held += size
            files.append(ContentFile(f.path, size, 0o644, chunks))
            if held > limits.max_total_bytes:
                raise ContentError(f"{source}: over {limits.max_total_bytes} bytes")
        manifest = ContentManifest("dataset", name, chunk_bytes, tuple(files))
        check_content(manifest, ContentLimits())
        await asyncio.to_thread(_keep, store, manifest, folder / "files")
    finally:
        await src.close()
    await asyncio.to_thread(shutil.rmtree, folder, True)
    return manifest


async def _download(
    src: Source,
    f: RemoteFile,
    folder: Path,
    chunk_bytes: int,
    limits: SourceLimits,
    counts: Counter[str],
    held: int,
    on_progress: Callable[[int, int], None] | None,
) -> tuple[int, tuple[str, ...]]:
    target = folder / "files" / f.path
    await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    version = target.with_name(target.name + ".version")
    hasher, validator = await asyncio.to_thread(_begun, part, version, chunk_bytes)
    async with src.open(f, hasher.size_bytes, validator) as opened:
        if opened.start_bytes != hasher.size_bytes:  # the whole file again
            hasher = ChunkHasher(chunk_bytes)
        elif opened.start_bytes:
            counts["range_resumes"] += 1
        out = await asyncio.to_thread(open, part, "ab" if opened.start_bytes else "wb")
        try:
            if not opened.start_bytes:
                await asyncio.to_thread(_write_version, version, opened.validator)
            async for block in opened.blocks:
                hasher.feed(block)
                if held + hasher.size_bytes > limits.max_total_bytes:
                    raise ContentError(f"{f.locator}: over {limits.max_total_bytes} bytes in all")
                await asyncio.to_thread(out.write, block)
                counts[f"bytes_{src.kind}"] += len(block)
                if on_progress is not None:
                    on_progress(held + hasher.size_bytes, 0)
        finally:
            await asyncio.to_thread(out.close)
    await asyncio.to_thread(os.replace, part, target)
    await asyncio.to_thread(version.unlink, True)
    return hasher.size_bytes, hasher.finish()


def _begun(part: Path, version: Path, chunk_bytes: int) -> tuple[ChunkHasher, str | None]:
    """What an earlier try left of a file: its bytes hashed, and the version they are of (no
    bytes when that version is unknown: they could not be resumed)."""
    hasher = ChunkHasher(chunk_bytes)
    try:
        validator = version.read_text().strip() or None
    except OSError:
        validator = None
    if validator is None:
        return hasher, None
    try:
        with open(part, "rb") as fh:
            while block := fh.read(READ_BLOCK_BYTES):
                hasher.feed(block)
    except OSError:
        return ChunkHasher(chunk_bytes), None
    return hasher, validator


def _write_version(version: Path, validator: str | None) -> None:
    if validator is None:
        version.unlink(missing_ok=True)
    else:
        version.write_text(validator)


def _load_done(folder: Path) -> dict[str, tuple[int, tuple[str, ...]]]:
    try:
        raw = json.loads((folder / "done.json").read_text())
        return {str(k): (int(v[0]), tuple(str(d) for d in v[1])) for k, v in raw.items()}
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return {}


def _save_done(folder: Path, done: dict[str, tuple[int, tuple[str, ...]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "done.json.tmp"
    tmp.write_text(json.dumps({k: [v[0], list(v[1])] for k, v in done.items()}))
    os.replace(tmp, folder / "done.json")


def _keep(store: ContentStore, manifest: ContentManifest, files: Path) -> None:
    """Tell the store of ``manifest`` and give it every chunk it misses, from the staged files."""
    store.add_manifest(manifest)
    for chunk in store.missing(manifest.digest):
        with open(files / manifest.files[chunk.index].path, "rb") as f:
            f.seek(chunk.offset_bytes)
            data = f.read(chunk.length_bytes)
        store.put_chunk(manifest.digest, chunk, data)
