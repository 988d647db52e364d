"""Sending a packed working folder up to the agent the operator talks to.

The operator first sends the manifest (``workdir_missing``) and learns which chunks the agent
lacks; only those go up (``workdir_put``, a few to a command, under the envelope's size). An
unchanged folder submitted again sends nothing but its manifest. An admin's team policy body goes
up the same way (:func:`upload_content` with ``policy_missing`` and ``policy_put``).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from agent.content.manifest import ChunkAt, ContentManifest
from agent.content.workdir import DEFAULT_MAX_BYTES, Packed, pack_workdir, read_chunks
from agent.job.jobspec import JobSpec
from agent.operator.client import ApiClient

PUT_BATCH_BYTES: Final = 600 << 10
"""Raw bytes of chunks in one command: base64 and JSON keep it under the 1 MiB envelope."""
PUTS_IN_FLIGHT: Final = 4
"""Commands sent at once: the operator signing the next while the agent keeps the last."""


@dataclass(frozen=True, slots=True)
class Uploaded:
    digest: str
    total_bytes: int
    sent_chunks: int
    sent_bytes: int


async def pack_folder(top: Path) -> tuple[Path, Packed]:
    """``top`` resolved, and packed under the cap of
    :data:`~agent.content.workdir.DEFAULT_MAX_BYTES`; ``ValueError`` or ``OSError`` when it
    cannot be."""
    folder = top.expanduser().resolve()
    return folder, await asyncio.to_thread(pack_workdir, folder, DEFAULT_MAX_BYTES)


async def send_workdir(client: ApiClient, spec: JobSpec, top: Path) -> tuple[JobSpec, Uploaded]:
    """Pack ``top`` (:func:`pack_folder`), send what the agent lacks, and the spec naming it;
    ``ValueError`` or ``OSError`` when it cannot be."""
    folder, packed = await pack_folder(top)
    uploaded = await upload_workdir(client, folder, packed)
    return replace(spec, workdir_digest=packed.manifest.digest), uploaded


async def upload_workdir(client: ApiClient, top: Path, packed: Packed) -> Uploaded:
    """Have the agent behind ``client`` hold ``packed`` whole; what had to be sent."""
    manifest = packed.manifest
    return await upload_content(
        client,
        manifest,
        lambda wanted: list(read_chunks(top, manifest, wanted)),
        WORKDIR_COMMANDS,
        f"--workdir {top}",
    )


WORKDIR_COMMANDS: Final = ("workdir_missing", "workdir_put")
POLICY_COMMANDS: Final = ("policy_missing", "policy_put")


async def upload_content(
    client: ApiClient,
    manifest: ContentManifest,
    read: Callable[[Collection[str]], Sequence[tuple[ChunkAt, bytes]]],
    commands: tuple[str, str],
    what: str,
) -> Uploaded:
    """Have the agent behind ``client`` hold ``manifest`` whole: it is sent (``commands[0]``),
    then the chunks it lacks, ``read`` (blocking) by digest (``commands[1]``); what had to be
    sent. ``what`` names the content in a refusal."""
    first, put_kind = commands
    answer = await client.command(first, {"manifest": manifest.to_wire()})
    if answer.get("digest") != manifest.digest:
        raise ValueError(f"{what}: the agent answered for other content")
    wanted = {str(d) for d in answer.get("missing", [])}
    sent_chunks = sent_bytes = 0
    batches: list[list[tuple[str, bytes]]] = [[]]
    batch_bytes = 0
    chunks = await asyncio.to_thread(read, wanted)
    for at, data in chunks:
        if batches[-1] and batch_bytes + len(data) > PUT_BATCH_BYTES:
            batches.append([])
            batch_bytes = 0
        batches[-1].append((at.digest, data))
        batch_bytes += len(data)
        sent_chunks += 1
        sent_bytes += len(data)
    slots = asyncio.Semaphore(PUTS_IN_FLIGHT)

    async def put(batch: list[tuple[str, bytes]]) -> None:
        async with slots:
            rows = [[digest, base64.b64encode(data).decode()] for digest, data in batch]
            await client.command(put_kind, {"digest": manifest.digest, "chunks": rows})

    await asyncio.gather(*(put(batch) for batch in batches if batch))
    if wanted:
        check = await client.command(first, {"manifest": manifest.to_wire()})
        if check.get("missing"):
            raise ValueError(
                f"{what}: {len(check['missing'])} chunks changed while they were sent;"
                " send it again"
            )
    return Uploaded(manifest.digest, manifest.total_bytes, sent_chunks, sent_bytes)
