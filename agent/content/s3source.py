"""An S3-compatible bucket as a source of content: ``s3://BUCKET/PREFIX`` (every object under the
prefix, the prefix left out of the paths; ``s3://BUCKET/KEY`` naming one object, that one).

Read through ``boto3`` (imported only when an ``s3://`` source is staged: an agent that never
stages one does not need it; without it the stage fails with one line that says so). Where the
bucket is and who the agent is to it come from the agent's environment as every AWS client reads
it: ``AWS_ENDPOINT_URL`` (an S3-compatible store: MinIO, Ceph, a lab's own), ``AWS_ACCESS_KEY_ID``
and ``AWS_SECRET_ACCESS_KEY`` (or a profile, an instance role), ``AWS_DEFAULT_REGION``. The calls
are blocking, so each runs in a thread; an object is read in blocks of 1 MiB.
"""

from __future__ import annotations

import asyncio
import importlib
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agent.content.external import READ_BLOCK_BYTES, Opened, RemoteFile, SourceLimits
from agent.content.manifest import ContentError, path_problem


def _client(limits: SourceLimits) -> Any:
    try:  # imported by name: boto3 is not one of Shoal's dependencies, and has no types
        boto3: Any = importlib.import_module("boto3")
        config_module: Any = importlib.import_module("botocore.config")
    except ImportError:
        raise ContentError("s3:// sources need boto3, which this agent lacks") from None
    config = config_module.Config(
        connect_timeout=limits.connect_timeout_s,
        read_timeout=limits.read_timeout_s,
        retries={"max_attempts": 3},
    )
    return boto3.client("s3", config=config)


class S3Source:
    kind = "s3"

    def __init__(self, url: str, limits: SourceLimits) -> None:
        parts = urllib.parse.urlsplit(url)
        if not parts.netloc:
            raise ContentError(f"{url}: no bucket")
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.lstrip("/")
        self.limits = limits
        self._s3: Any = None

    async def close(self) -> None:
        self._s3 = None

    async def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = await asyncio.to_thread(_client, self.limits)
        return self._s3

    async def files(self) -> list[RemoteFile]:
        s3 = await self._client()
        return await asyncio.to_thread(self._list, s3)

    def _list(self, s3: Any) -> list[RemoteFile]:
        try:
            pages = s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            keys = [o["Key"] for page in pages for o in page.get("Contents", ())]
        except Exception as exc:  # botocore's errors, whatever the store answered
            raise ContentError(f"{self.url}: {exc}") from None
        if self.prefix in keys:  # one object named whole
            name = self.prefix.rsplit("/", 1)[-1]
            return [RemoteFile(name, self.prefix)]
        base = self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"
        found: list[RemoteFile] = []
        for key in keys:
            if not key.startswith(base) or key.endswith("/"):
                continue
            rel = key[len(base) :]
            if path_problem(rel) is not None:
                continue
            found.append(RemoteFile(rel, key))
            if len(found) > self.limits.max_files:
                raise ContentError(f"{self.url}: more than {self.limits.max_files} objects")
        if not found:
            raise ContentError(f"{self.url}: no object under it")
        return found

    @asynccontextmanager
    async def open(
        self, f: RemoteFile, offset_bytes: int = 0, validator: str | None = None
    ) -> AsyncIterator[Opened]:
        s3 = await self._client()
        start = offset_bytes if offset_bytes > 0 and validator is not None else 0
        answer = None
        if start:  # the rest of the same object, or (412: it changed) the whole object again
            ranged = {"Range": f"bytes={start}-", "IfMatch": validator}
            answer = await self._get(s3, f, ranged, precondition_ok=True)
        if answer is None:
            start = 0
            answer = await self._get(s3, f, {}, precondition_ok=False)
        body = answer["Body"]
        try:
            yield Opened(start, answer.get("ETag"), _blocks(body))
        finally:
            body.close()

    async def _get(
        self, s3: Any, f: RemoteFile, extra: dict[str, Any], *, precondition_ok: bool
    ) -> Any:
        """``get_object``; ``None`` for a failed precondition or a range past the end when
        ``precondition_ok`` (a ranged ask)."""
        try:
            return await asyncio.to_thread(
                s3.get_object, Bucket=self.bucket, Key=f.locator, **extra
            )
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            # the object changed (412), or every byte came before the cut (416): whole again
            if precondition_ok and code in ("PreconditionFailed", "412", "InvalidRange", "416"):
                return None
            raise ContentError(f"s3://{self.bucket}/{f.locator}: {exc}") from None


async def _blocks(body: Any) -> AsyncIterator[bytes]:
    while True:
        block = await asyncio.to_thread(body.read, READ_BLOCK_BYTES)
        if not block:
            return
        yield block
