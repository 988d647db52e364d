"""An agent's datasets in its store: a changed folder is a new version (the old one forgotten),
what a running job reads is never evicted, and the commands' refusals."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.content.manifest import ContentFile, ContentManifest
from agent.daemon.config import AgentConfig
from agent.daemon.datastore import DataRefused, NodeData

CHUNK = 64 << 10


def _node(
    tmp_path: Path, in_use: list[tuple[str, str]], budget_bytes: int | None = None
) -> NodeData:
    config = AgentConfig(
        data_dir=tmp_path / "data", datasets_dir=tmp_path / "sets", store_budget_bytes=budget_bytes
    )
    (tmp_path / "sets").mkdir(exist_ok=True)
    return NodeData(config, lambda: in_use)


def test_a_changed_folder_is_a_new_version_and_the_old_one_is_forgotten(tmp_path: Path) -> None:
    node = _node(tmp_path, [])
    (tmp_path / "sets" / "imagenet").mkdir()
    (tmp_path / "sets" / "imagenet" / "a").write_bytes(b"one")
    sizes, (v1,) = node.scan()
    assert sizes == {"imagenet": 3} and v1.held_bytes == v1.total_bytes == 3
    assert node.scan()[1] == (v1,)  # unchanged: the same version
    (tmp_path / "sets" / "imagenet" / "b").write_bytes(b"two!")
    sizes, (v2,) = node.scan()
    assert sizes == {"imagenet": 7} and v2.digest != v1.digest
    (tmp_path / "sets" / "imagenet" / "a").unlink()
    (tmp_path / "sets" / "imagenet" / "b").unlink()
    (tmp_path / "sets" / "imagenet").rmdir()
    assert node.scan() == ({}, ())


def test_what_a_running_job_reads_is_not_evicted(tmp_path: Path) -> None:
    in_use: list[tuple[str, str]] = []
    node = _node(tmp_path, in_use, budget_bytes=CHUNK)  # one chunk held is over its watermark
    data = os.urandom(2 * CHUNK)
    pieces = [data[:CHUNK], data[CHUNK:]]
    f = ContentFile("x", len(data), 0o644, tuple(hashlib.sha256(p).hexdigest() for p in pieces))
    m = ContentManifest("dataset", "cached", CHUNK, (f,))
    node.store.add_manifest(m)
    first = node.store.missing(m.digest)[0]
    node.store.put_chunk(m.digest, first, pieces[0])
    in_use.append(("job-1", "cached"))
    assert node.protected() == {m.digest}
    with pytest.raises(DataRefused, match="read by a job running here") as refused:
        node.evict("cached")
    assert refused.value.status == 409
    assert node.store.evict_over_budget() == []  # the cache rules keep it too
    before = node.store.held(m.digest)
    node.count_uses()
    node.count_uses()  # one job, one use
    after = node.store.held(m.digest)
    assert before is not None and after is not None and after.uses == before.uses + 1
    in_use[:] = [("job-2", f"cached@{'0' * 64}")]  # another version: this one may go
    assert node.protected() == set()
    assert node.evict(f"cached@{m.digest}") == {"evicted": [m.digest]}
    with pytest.raises(DataRefused, match="not held on this node"):
        node.pin("cached", True)


def test_two_datasets_of_equal_bytes_are_both_listed_and_outlive_each_other(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path, [])
    for name in ("a", "b"):
        (tmp_path / "sets" / name).mkdir()
        (tmp_path / "sets" / name / "x").write_bytes(b"same bytes")
    _sizes, versions = node.scan()
    assert [v.name for v in versions] == ["a", "b"]
    assert versions[0].digest == versions[1].digest
    assert node.scan()[1] == versions  # stable across scans
    chunk = ContentFile("x", 10, 0o644, (hashlib.sha256(b"same bytes").hexdigest(),)).chunks[0]
    (tmp_path / "sets" / "a" / "x").unlink()
    (tmp_path / "sets" / "a").rmdir()
    _sizes, left = node.scan()
    assert [(v.name, v.held_bytes) for v in left] == [("b", 10)]
    assert node.store.read_chunk(chunk) == b"same bytes"  # now read from b's folder


def test_the_working_folder_of_a_job_not_ended_is_never_evicted(tmp_path: Path) -> None:
    """The owner's and the replica's copies are what the runner stages: kept while the job
    waits, whatever the cache's budget; once it ended, the folder is cache like any other."""
    kept: set[str] = set()
    config = AgentConfig(
        data_dir=tmp_path / "data", datasets_dir=tmp_path / "sets", store_budget_bytes=CHUNK
    )
    node = NodeData(config, lambda: (), lambda: kept)
    data = os.urandom(CHUNK)  # one chunk held is over the watermark
    f = ContentFile("train.py", len(data), 0o644, (hashlib.sha256(data).hexdigest(),))
    m = ContentManifest("workdir", "workdir", CHUNK, (f,))
    node.store.add_manifest(m)
    node.store.put_chunk(m.digest, node.store.missing(m.digest)[0], data)
    kept.add(m.digest)
    assert node.store.evict_over_budget() == []
    kept.clear()  # the job ended
    assert node.store.evict_over_budget() == [m.digest]
