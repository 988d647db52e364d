"""How an agent wires what jobs bring with them: Python environments built here
(``agent.running.pyenvs``), images moved between members (``agent.running.peerimages``) and the
images and environments it holds, gossiped in its ``place`` record."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.content.build import build_manifest
from agent.content.manifest import ContentError
from agent.content.store import DiskStore
from agent.job.jobspec import JobSpec
from agent.running.pyenvs import EnvBuildFailed, NoBuilder, PythonEnvs
from agent.wire.place import CONTENT_KINDS, HeldContent

if TYPE_CHECKING:
    from agent.daemon.daemon import Agent

log = logging.getLogger("shoal.agent")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def held_content(
    store: DiskStore, in_runtime: Mapping[str, tuple[str, int]]
) -> tuple[HeldContent, ...]:
    """The images and environments ``store`` holds whole, and the images the runtime holds for
    jobs here that have no archive in it (the ``place`` record's ``content``)."""
    out = [
        HeldContent(h.kind, h.name, h.digest, h.total_bytes)
        for h in store.all_held()
        if h.kind in CONTENT_KINDS and h.complete
    ]
    archived = {h.name for h in out if h.kind == "image"}
    out += [
        HeldContent("image", ref, image_id, size)
        for ref, (image_id, size) in sorted(in_runtime.items())
        if ref not in archived and _SHA256.fullmatch(image_id)
    ]
    return tuple(out)


def index_env(store: DiskStore, key: str, folder: Path) -> None:
    """A Python environment built here, indexed in the store as kind ``env`` (listed with the
    node's other content: ``shoal cache``). Runs in a thread."""
    try:
        built = build_manifest(folder, f"env-{key[:12]}", "env", store)
        store.add_local(built.manifest, folder)
    except (ContentError, OSError) as exc:
        log.warning("environment %s: not indexed in the store: %s", key[:12], exc)


_PREBUILDS: set[asyncio.Task[None]] = set()


def prebuild(agent: Agent, envs: PythonEnvs, spec: JobSpec) -> bool:
    """Build a waiting job's Python environment now, on the node its owner forecast: its
    working folder staged into the store (not copied out), the environment built from the file
    there. Whether a build began (not without uv, nor for a key being built)."""
    digest, env = spec.workdir_digest, spec.python_env
    if digest is None or env is None or envs.uv is None or digest in envs.prebuilding:
        return False
    store, stager = agent.data.store, agent.stager
    envs.prebuilding.add(digest)

    async def build() -> None:
        try:
            held = await asyncio.to_thread(store.held, digest)
            if held is None or not held.complete:
                stager.start("workdir", digest, None)
                await stager.wait(digest)
            tree = await asyncio.to_thread(store.tree, digest)
            if tree is None:
                return
            await envs.prepare("", env, tree)
            envs.counts["prebuilt"] += 1
        except (EnvBuildFailed, NoBuilder, OSError) as exc:
            log.info("environment pre-build for %s failed: %s", digest[:12], exc)
        finally:
            envs.prebuilding.discard(digest)

    task = asyncio.create_task(build(), name=f"pre-build {digest[:12]}")
    _PREBUILDS.add(task)
    task.add_done_callback(_PREBUILDS.discard)
    return True


def wire(agent: Agent) -> None:
    """Give ``agent``'s runner its environments, its image source its peers and store, and its
    place record what it holds."""
    config, store, mesh, me = agent.config, agent.data.store, agent.mesh, agent.node_id
    images = agent.images
    agent.runner.envs = envs = PythonEnvs(
        config.data_dir / "envs",
        config.uv,
        config.wheelhouse,
        config.index_url,
        on_built=lambda key, folder: index_env(store, key, folder),
    )
    agent.publisher.content = lambda: held_content(store, images.in_runtime)
    images.changed = envs.changed = agent.publisher.content_changed
    images.waiting_changed = agent.ctx.changed
    agent.calls.hold_workdir = agent.commands.holds.hold
    agent.calls.export_image = images.export
    agent.prefetches.pull_image = images.prefetch
    agent.prefetches.build_env = lambda spec: prebuild(agent, envs, spec)
    images.store, images.stager = store, agent.stager
    images.ask = lambda addr, op, body: agent.ctx.peers.call(addr, op, body)
    images.peers = lambda: [
        addr
        for n in sorted(mesh.live_agents())
        if n != me and (addr := mesh.addr_of(n)) is not None
    ]
    images.holders = lambda image: [
        addr
        for n in sorted(mesh.live_agents())
        if n != me
        and (node := agent.view.nodes.get(n)) is not None
        and node.place is not None
        and any(h.kind == "image" and h.name == image for h in node.place.content)
        and (addr := mesh.addr_of(n)) is not None
    ]
