"""Images moved between members like any other content: an air-gapped fleet needs no registry.

A runner that lacks a job's image first pulls it from its registry (``RegistryPull``). When that
fails (no registry reachable, an air-gapped fleet) it asks its peers, a few at a time, to export
it (the internal call ``image_export``): a peer whose runtime holds the image saves it once into an
archive (``podman save``) under its data folder and indexes that file in its content store as kind
``image``, named by the image reference; it answers the archive's digest. The runner stages that
content from whichever members hold it (chunks checked against their digests, as for a dataset)
and loads it into its runtime (``podman load``). The archive stays in both stores, listed by
``shoal cache``, under the store's budget and eviction rules.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from agent.content.build import build_manifest
from agent.content.manifest import ContentError
from agent.content.stage import Stager
from agent.content.store import DiskStore
from agent.execution.containers import (
    ContainerError,
    ContainerRuntime,
    RegistryPull,
    call,
    last_line,
)
from agent.job.imageref import check_image_ref
from agent.mesh.peers import PeerError, PeerUnreachable

log = logging.getLogger(__name__)

MAX_PEERS_ASKED: Final = 8
PREFETCH_TRIES: Final = 3
"""Tries of a pre-pull (a registry or a runtime busy for a moment): its owner asks again only
when it renews the pre-fetch, minutes later, so a pull that failed once would leave the job to
pull its image when its slot frees."""
PREFETCH_RETRY_S: Final = 1.0
"""The wait before a pre-pull's second try; it doubles for each further one."""
EXPORT_TIMEOUT_S: Final = 600.0
IMAGE_KIND: Final = "image"


class PeerImages:
    """The runner's image source: the registry first, then the members that hold the image."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = data_dir / "images"
        self.registry = RegistryPull()
        self.in_runtime: dict[str, tuple[str, int]] = {}
        """Image -> (its id, its size in bytes): the images this agent had its runtime pull, load
        or find for a job (gossiped with the archives in its store)."""
        self._waiting: dict[str, tuple[str, str]] = {}
        self._prefetching: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        """Job -> (its image, the digest of the archive coming from a peer, or "")."""
        self.counts: Counter[str] = Counter()
        """``present``, ``registry``, ``peer``, ``failed``, ``exported``, ``prefetched``,
        ``prefetch_failed`` (``shoal_image_pulls_total``)."""
        self.store: DiskStore | None = None
        self.stager: Stager | None = None
        self.runtime: ContainerRuntime | None = None
        self.peers: Callable[[], list[str]] = list
        """Addresses of live members to ask, this node's left out."""
        self.changed: Callable[[], None] = lambda: None
        """Told when an image's archive is added here (the node gossips what it holds)."""
        self.waiting_changed: Callable[[], None] = lambda: None
        """Told when a job starts or stops waiting for its image (the node record's lines)."""
        self.holders: Callable[[str], list[str]] = lambda _image: []
        """Addresses of the members whose place records list ``image``: asked first."""
        self.ask: Callable[[str, str, dict[str, Any]], Any] | None = None
        """``ask(addr, op, body)``: an internal call to a member (``PeerClient.call``)."""

    def lines(self) -> dict[str, str]:
        """Job -> what it waits for while its image comes (the node record's staging lines)."""
        out: dict[str, str] = {}
        for job_id, (image, digest) in list(self._waiting.items()):
            state = self.stager.state(digest) if self.stager is not None and digest else None
            if state is not None and state.state == "staging":
                out[job_id] = "pulling image from a peer: " + state.line().removeprefix("staging ")
            else:
                out[job_id] = f"pulling image {image}"
        return out

    async def ensure(self, runtime: ContainerRuntime, image: str, job_id: str = "") -> None:
        check_image_ref(image)
        if await _present(runtime, image):
            self.counts["present"] += 1
            if image not in self.in_runtime:
                await self._note(runtime, image)
            return
        if job_id:
            self._waiting[job_id] = (image, "")
        self.waiting_changed()
        try:
            await self.registry.ensure(runtime, image)
        except ContainerError as pulled:
            if not await self._from_peers(runtime, image, job_id):
                self.counts["failed"] += 1
                raise ContainerError(f"{pulled}; and no member holds it") from None
            self.counts["peer"] += 1
            await self._note(runtime, image)
            return
        finally:
            self._waiting.pop(job_id, None)
            self.waiting_changed()
        self.counts["registry"] += 1
        await self._note(runtime, image)

    def prefetch(self, image: str) -> bool:
        """Pull ``image`` now, for a job that waits for a slot here (its owner's forecast);
        whether a pull began. What it pulls stays in the runtime; a failure is only counted."""
        runtime = self.runtime
        if runtime is None or image in self._prefetching:
            return False
        self._prefetching.add(image)

        async def pull() -> None:
            try:
                for tries in range(PREFETCH_TRIES):
                    if tries:
                        await asyncio.sleep(PREFETCH_RETRY_S * 2 ** (tries - 1))
                    try:
                        await self.ensure(runtime, image, "")
                    except (ContainerError, ValueError) as exc:
                        log.info("image %s: pre-pull failed (try %d): %s", image, tries + 1, exc)
                        continue
                    self.counts["prefetched"] += 1
                    return
                self.counts["prefetch_failed"] += 1
            finally:
                self._prefetching.discard(image)

        task = asyncio.create_task(pull(), name=f"pre-pull {image}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _note(self, runtime: ContainerRuntime, image: str) -> None:
        """Remember ``image`` as held by the runtime (its id and size), gossiped if new."""
        argv = runtime.command("image", "inspect", "--format", "{{.Id}} {{.Size}}", image)
        code, out = await call(runtime, argv, 60.0)
        parts = out.split()
        if code != 0 or len(parts) != 2 or not parts[1].isdigit():
            return
        held = (parts[0].removeprefix("sha256:"), int(parts[1]))
        if self.in_runtime.get(image) != held:
            self.in_runtime[image] = held
            self.changed()

    async def _from_peers(self, runtime: ContainerRuntime, image: str, job_id: str) -> bool:
        if self.store is None or self.stager is None or self.ask is None:
            return False
        listed = self.holders(image)
        others = [a for a in self.peers() if a not in listed]
        for addr in [*listed, *others][:MAX_PEERS_ASKED]:
            try:
                answer = await self.ask(addr, "image_export", {"image": image})
            except (PeerError, PeerUnreachable):
                continue
            digest = answer.get("digest") if isinstance(answer, dict) else None
            if not isinstance(digest, str):
                continue
            if job_id:
                self._waiting[job_id] = (image, digest)
            self.stager.start(image, digest, None)
            state = await self.stager.wait(digest)
            tree = await asyncio.to_thread(self.store.tree, digest)
            manifest = await asyncio.to_thread(self.store.manifest, digest)
            if state.state != "done" or tree is None or manifest is None:
                continue
            if manifest.kind != IMAGE_KIND or len(manifest.files) != 1:
                continue
            archive = tree / manifest.files[0].path
            code, out = await call(runtime, runtime.command("load", "-i", str(archive)), 600.0)
            if code != 0:
                log.warning("image %s from a peer did not load: %s", image, last_line(out))
                continue
            if await _present(runtime, image):
                await asyncio.to_thread(self.store.use, digest)
                self.changed()
                return True
        return False

    async def export(self, image: str) -> dict[str, Any]:
        """``image_export``: this node's archive of ``image`` in its store (saved once); raises
        ``LookupError`` when its runtime does not hold it."""
        check_image_ref(image)
        runtime, store = self.runtime, self.store
        if runtime is None or store is None:
            raise LookupError("no container runtime here")
        if not await _present(runtime, image):
            raise LookupError(f"image {image} is not held here")
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        archive = self.folder / f"{hashlib.sha256(image.encode()).hexdigest()[:32]}.tar"
        if not archive.exists():
            part = archive.with_suffix(".part")
            part.unlink(missing_ok=True)
            argv = runtime.command("save", "--quiet", "-o", str(part), image)
            code, out = await call(runtime, argv, EXPORT_TIMEOUT_S)
            if code != 0:
                raise LookupError(f"image {image}: cannot save it: {last_line(out)}")
            part.rename(archive)
            self.counts["exported"] += 1

        def index() -> dict[str, Any]:
            built = build_manifest(archive, image, IMAGE_KIND, store)
            store.add_local(built.manifest, archive.parent)
            return {"digest": built.manifest.digest, "total_bytes": built.manifest.total_bytes}

        try:
            answer = await asyncio.to_thread(index)
        except (ContentError, OSError) as exc:
            raise LookupError(f"image {image}: cannot index its archive: {exc}") from None
        self.changed()
        return answer


async def _present(runtime: ContainerRuntime, image: str) -> bool:
    probe = "exists" if runtime.kind == "podman" else "inspect"
    code, _ = await call(runtime, runtime.command("image", probe, image), 60.0)
    return code == 0
