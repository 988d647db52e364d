"""``shoal data`` end to end on real agents: datasets indexed in place and gossiped with their
versions, a cached partial copy seen as partial, pins that survive a restart, evictions and the
refusals, each in one line."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.content.manifest import ContentFile, ContentManifest
from agent.content.store import DiskStore
from tests.agent.agents import Mesh
from tests.agent.test_attacks import metric
from tests.shoal_cli import one_line_error, shoal

CHUNK = 64 << 10


class Operator:
    def __init__(self, mesh: Mesh, i: int = 0) -> None:
        self.mesh = mesh
        self.i = i

    def __call__(self, *args: str) -> Any:
        a = self.mesh.agents[self.i]
        return shoal(*args, "--agent", a.address, "--identity", str(self.mesh.cluster_dir))

    def ok(self, *args: str) -> str:
        done = self(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return str(done.stdout)

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))


def _cached_copy(store_dir: Path, data: bytes, chunks_held: int) -> ContentManifest:
    """A copy of dataset ``cached`` in an agent's store, as a transfer leaves it part way."""
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    f = ContentFile(
        "part-0", len(data), 0o644, tuple(hashlib.sha256(p).hexdigest() for p in pieces)
    )
    m = ContentManifest("dataset", "cached", CHUNK, (f,))
    store = DiskStore(store_dir)
    store.add_manifest(m)
    for at in store.missing(m.digest)[:chunks_held]:
        store.put_chunk(m.digest, at, data[at.offset_bytes : at.offset_bytes + at.length_bytes])
    store.close()
    return m


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, ["l4:1", "t4:1"], extra=("--datasets-rescan-s", "0.5"))
    (m.agents[0].datasets_dir / "imagenet").mkdir(parents=True)
    (m.agents[0].datasets_dir / "imagenet" / "train.bin").write_bytes(os.urandom(3 * CHUNK))
    try:
        yield m
    finally:
        m.stop_all()


def test_data_commands_end_to_end(mesh: Mesh, tmp_path: Path) -> None:
    holder, other = mesh.agents
    cached = _cached_copy(other.directory / "store", os.urandom(4 * CHUNK), chunks_held=1)
    mesh.start_all()
    op = Operator(mesh)
    assert metric(mesh, other, "shoal_store_held_bytes") == CHUNK  # the partial copy's one chunk

    def rows() -> list[dict[str, Any]]:
        return list(op.json("data", "ls"))

    mesh.wait("imagenet and the partial copy seen", lambda: len(rows()) == 2)
    by_name = {r["name"]: r for r in rows()}
    assert by_name["imagenet"]["node"] == holder.node_id
    assert by_name["imagenet"]["held_bytes"] == by_name["imagenet"]["total_bytes"] == 3 * CHUNK
    assert by_name["cached"]["node"] == other.node_id
    assert by_name["cached"]["digest"] == cached.digest
    assert (by_name["cached"]["held_bytes"], by_name["cached"]["total_bytes"]) == (CHUNK, 4 * CHUNK)
    table = op.ok("data", "ls")
    assert "imagenet" in table and "25%" in table and "100%" in table

    # add: indexed in place on the host named, its bytes never copied into the store
    folder = tmp_path / "c4"
    folder.mkdir()
    (folder / "shard").write_bytes(os.urandom(CHUNK + 5))
    added = op.json("data", "add", "c4", str(folder), "--node", other.node_id[:10])
    assert added["node"] == other.node_id and added["total_bytes"] == CHUNK + 5
    mesh.wait("c4 seen", lambda: any(r["name"] == "c4" for r in rows()))
    where = op.json("data", "where", f"c4@{added['digest']}")
    assert [(r["node"], r["held_bytes"]) for r in where] == [(other.node_id, CHUNK + 5)]
    assert not [p for p in (other.directory / "store" / "objects").rglob("*") if p.is_file()]

    # pin, and the pin holds across a restart: evict is refused until unpinned
    assert "pin 1 version" in op.ok("data", "pin", "cached", "--nodes", other.node_id[:10])
    mesh.terminate(1)
    mesh.start(1)
    mesh.wait("c4 seen again", lambda: any(r["name"] == "c4" for r in rows()))
    assert "is pinned here" in one_line_error(
        op("data", "evict", "cached", "--nodes", other.node_id[:10])
    )
    assert "host's own folder" in one_line_error(
        op("data", "evict", "c4", "--nodes", other.node_id[:10])
    )
    op.ok("data", "unpin", f"cached@{cached.digest}", "--nodes", other.node_id[:10])
    evicted = op.json("data", "evict", "cached", "--nodes", other.node_id[:10])
    assert evicted == [{"node": other.node_id, "evicted": [cached.digest]}]
    mesh.wait("cached gone", lambda: not any(r["name"] == "cached" for r in rows()))
    assert not list((other.directory / "store" / "partial").iterdir())
    assert metric(mesh, other, "shoal_store_evictions_total") == 1
    assert metric(mesh, other, "shoal_store_held_bytes") == 0
    assert metric(mesh, other, "shoal_store_budget_bytes") > 0


def test_data_refusals_are_one_line(mesh: Mesh, tmp_path: Path) -> None:
    mesh.start_all()
    op = Operator(mesh)
    holder = mesh.agents[0]
    assert "a name may not start with '.'" in one_line_error(op("data", "add", ".x", "/tmp"))
    assert "must be absolute" in one_line_error(op("data", "add", "x", "rel/path"))
    assert "no such file or folder" in one_line_error(
        op("data", "add", "x", str(tmp_path / "nowhere"))
    )
    for own in (holder.directory, holder.directory / "identity", holder.directory.parent):
        assert "the agent's own folder" in one_line_error(op("data", "add", "keys", str(own)))
    assert "64 lowercase hex" in one_line_error(op("data", "where", "imagenet@abc"))
    assert "not held on this node" in one_line_error(
        op("data", "pin", "nothing", "--nodes", holder.node_id[:10])
    )
    assert "no node holds it" in one_line_error(op("data", "where", "nothing"))
