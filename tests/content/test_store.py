"""The content store on a real disk: chunks verified before they are kept, kept once whatever
manifest they belong to, resumed after a restart, objects read-only and trees of hardlinks."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from agent.content.cache import CacheRules
from agent.content.manifest import ContentError, ContentFile, ContentManifest
from agent.content.store import DiskStore
from agent.content.store_api import ContentStore
from agent.storage.sqlitefile import StoreFull

CHUNK = 64 << 10


def _file(path: str, data: bytes) -> ContentFile:
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    return ContentFile(path, len(data), 0o644, tuple(hashlib.sha256(p).hexdigest() for p in pieces))


def _manifest(name: str, files: dict[str, bytes]) -> ContentManifest:
    return ContentManifest(
        "dataset", name, CHUNK, tuple(_file(p, d) for p, d in sorted(files.items()))
    )


def _blob(seed: int, size: int) -> bytes:
    out = bytearray()
    n = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{n}".encode()).digest()
        n += 1
    return bytes(out[:size])


def _fill(store: DiskStore, m: ContentManifest, data: dict[str, bytes], limit: int = 10**9) -> int:
    put = 0
    for at in store.missing(m.digest)[:limit]:
        f = m.files[at.index]
        store.put_chunk(
            m.digest, at, data[f.path][at.offset_bytes : at.offset_bytes + at.length_bytes]
        )
        put += 1
    return put


def test_the_disk_store_is_a_content_store(tmp_path: Path) -> None:
    store: ContentStore = DiskStore(tmp_path / "store")
    assert store.manifest("0" * 64) is None


def test_chunks_are_checked_kept_once_and_a_complete_file_is_a_read_only_object(
    tmp_path: Path,
) -> None:
    store = DiskStore(tmp_path / "store")
    a = _blob(1, 3 * CHUNK + 100)
    data = {"train/a.bin": a, "train/copy.bin": a, "empty": b""}
    m = _manifest("imagenet", data)
    store.add_manifest(m)
    assert store.manifest(m.digest) == m
    # one distinct chunk digest each: the copy's chunks are the same chunks
    assert len(store.missing(m.digest)) == len({d for f in m.files for d in f.chunks})
    first = next(at for at in store.missing(m.digest) if at.length_bytes)
    with pytest.raises(ContentError, match="do not match"):
        store.put_chunk(m.digest, first, b"x" * first.length_bytes)
    assert store.held_bytes(m.digest) == 0 and store.stats.refused_chunks == 1
    assert _fill(store, m, data) == 5
    assert store.missing(m.digest) == ()
    assert store.held_bytes(m.digest) == m.total_bytes
    # two paths, one object: the store keeps a's bytes once
    assert store.store_bytes() == len(a)
    objects = [p for p in (tmp_path / "store" / "objects").rglob("*") if p.is_file()]
    assert sorted(p.name for p in objects) == sorted(
        {hashlib.sha256(a).hexdigest(), hashlib.sha256(b"").hexdigest()}
    )
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in objects)
    tree = store.tree(m.digest)
    assert tree is not None
    assert (tree / "train" / "a.bin").read_bytes() == a
    assert (tree / "train" / "a.bin").stat().st_ino == (tree / "train" / "copy.bin").stat().st_ino
    assert (tree / "empty").read_bytes() == b""
    assert store.read_chunk(first.digest) == a[: first.length_bytes]
    assert store.read_chunk("f" * 64) is None


def test_a_chunk_held_for_one_version_fills_the_next_without_a_transfer(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "store")
    a, b = _blob(1, 4 * CHUNK), _blob(2, CHUNK)
    v1 = _manifest("imagenet", {"a": a})
    v2_data = {"a": a[: 3 * CHUNK] + _blob(3, CHUNK), "b": b}
    v2 = _manifest("imagenet", v2_data)
    store.add_manifest(v1)
    _fill(store, v1, {"a": a})
    store.add_manifest(v2)
    # only the changed chunk and the new file are missing
    assert len(store.missing(v2.digest)) == 2
    assert store.held_bytes(v2.digest) == 3 * CHUNK
    # and a third dataset that shares b with v2 takes it when v2 gets it
    other = _manifest("other", {"same-b": b})
    store.add_manifest(other)
    _fill(store, v2, v2_data)
    assert store.missing(other.digest) == ()
    assert store.held_bytes(other.digest) == len(b)


def test_what_is_held_survives_a_restart_and_the_fill_resumes(tmp_path: Path) -> None:
    data = {"big": _blob(5, 6 * CHUNK)}
    m = _manifest("imagenet", data)
    store = DiskStore(tmp_path / "store")
    store.add_manifest(m)
    assert _fill(store, m, data, limit=4) == 4
    store.close()
    again = DiskStore(tmp_path / "store")
    assert again.manifest(m.digest) == m
    assert again.held_bytes(m.digest) == 4 * CHUNK
    assert len(again.missing(m.digest)) == 2
    assert _fill(again, m, data) == 2
    assert again.held_bytes(m.digest) == m.total_bytes
    tree = again.tree(m.digest)
    assert tree is not None and (tree / "big").read_bytes() == data["big"]


def test_a_held_chunk_that_rots_is_not_served_and_is_fetched_again(tmp_path: Path) -> None:
    data = {"a": _blob(6, 2 * CHUNK)}
    m = _manifest("imagenet", data)
    store = DiskStore(tmp_path / "store")
    store.add_manifest(m)
    _fill(store, m, data, limit=1)
    partial = next((tmp_path / "store" / "partial").iterdir())
    with open(partial, "r+b") as f:
        f.write(b"rot")
    first = m.files[0].chunks[0]
    assert store.read_chunk(first) is None
    assert store.stats.corrupt == 1
    assert {at.digest for at in store.missing(m.digest)} == set(m.files[0].chunks)


def test_the_budget_refuses_what_does_not_fit_and_evicts_the_unused(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "store", CacheRules(budget_bytes=5 * CHUNK))
    old = {"a": _blob(7, 3 * CHUNK)}
    m_old = _manifest("old", old)
    store.add_manifest(m_old)
    _fill(store, m_old, old)
    new = {"b": _blob(8, 3 * CHUNK)}
    m_new = _manifest("new", new)
    store.add_manifest(m_new)
    store.pin(m_old.digest)
    with pytest.raises(StoreFull, match="budget"):
        _fill(store, m_new, new)
    assert store.pin(m_old.digest, False)
    store.protected = lambda: {m_old.digest}
    with pytest.raises(StoreFull, match="budget"):
        _fill(store, m_new, new)
    store.protected = tuple
    _fill(store, m_new, new)
    assert store.held(m_old.digest) is None
    assert store.held_bytes(m_new.digest) == m_new.total_bytes
    assert store.store_bytes() == 3 * CHUNK
    assert not list(
        (tmp_path / "store" / "objects").rglob(f"{hashlib.sha256(old['a']).hexdigest()}")
    )


def test_the_store_folder_is_private(tmp_path: Path) -> None:
    DiskStore(tmp_path / "store")
    assert stat.S_IMODE(os.stat(tmp_path / "store").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "store" / "index.db").st_mode) == 0o600


@pytest.mark.system
def test_a_full_disk_refuses_the_chunk_and_keeps_what_was_held(tmp_path: Path) -> None:
    from tests.agent.test_disk_full import _tmpfs_mountable
    from tests.support import require_system

    ok, why = _tmpfs_mountable(tmp_path / "probe")
    require_system(ok, why)
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        store = DiskStore(disk / "store", CacheRules(budget_bytes=1 << 40))
        data = {"big": _blob(9, 40 * CHUNK)}  # 2.5 MiB: more than the disk
        m = _manifest("big", data)
        store.add_manifest(m)
        with pytest.raises(StoreFull, match="disk is full"):
            _fill(store, m, data)
        held = store.held_bytes(m.digest)
        assert 0 < held < m.total_bytes
        assert store.store_bytes() == held
        assert len(store.missing(m.digest)) == 40 - held // CHUNK
        store.close()
        again = DiskStore(disk / "store", CacheRules(budget_bytes=1 << 40))
        assert again.held_bytes(m.digest) == held
        assert again.evict(m.digest) and again.store_bytes() == 0
        again.close()
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)


def test_a_chunk_held_elsewhere_that_the_budget_cannot_copy_is_listed_missing(
    tmp_path: Path,
) -> None:
    store = DiskStore(tmp_path / "store", CacheRules(budget_bytes=3 * CHUNK))
    a = _blob(10, 2 * CHUNK)
    first = _manifest("first", {"a": a})
    store.add_manifest(first)
    _fill(store, first, {"a": a})
    store.pin(first.digest)
    second = _manifest("second", {"b": a[:CHUNK] + _blob(11, CHUNK)})
    store.add_manifest(second)  # a's first chunk is copied: 3 chunks held, the budget's all
    assert store.held_bytes(second.digest) == CHUNK
    store.pin(second.digest)
    third = _manifest("third", {"c": a[CHUNK:]})
    store.add_manifest(third)  # no room to copy a's second chunk: it is not hidden, but missing
    assert [at.digest for at in store.missing(third.digest)] == list(third.files[0].chunks)
    with pytest.raises(StoreFull, match="budget"):
        _fill(store, third, {"c": a[CHUNK:]})
    assert store.pin(second.digest, False)
    assert store.evict(second.digest)
    assert store.missing(third.digest) == ()  # now it fits: filled from first, no transfer
    assert store.held_bytes(third.digest) == CHUNK
