"""How an agent wires what jobs bring with them: Python environments built here
(``agent.running.pyenvs``), images moved between members (``agent.running.peerimages``) and the
images and environments it holds, gossiped in its ``place`` record."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.content.build import build_manifest
from agent.content.manifest import ContentError
from agent.content.store import DiskStore
from agent.running.pyenvs import PythonEnvs
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
