"""Manifests built from a folder in place: no link followed, nothing copied, and a rescan of an
unchanged folder reads no file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.content import build
from agent.content.build import build_manifest
from agent.content.manifest import ContentError
from agent.content.store import DiskStore

CHUNK = 64 << 10


def _tree(top: Path) -> dict[str, bytes]:
    data = {
        "a.bin": os.urandom(3 * CHUNK + 7),
        "sub/b.txt": b"hello\n",
        "sub/deeper/empty": b"",
    }
    for rel, blob in data.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(blob)
    return data


def test_a_folder_is_hashed_in_chunks_and_links_are_not_followed(tmp_path: Path) -> None:
    top = tmp_path / "imagenet"
    data = _tree(top)
    (tmp_path / "secret").write_bytes(b"not yours")
    (top / "link").symlink_to(tmp_path / "secret")
    (top / "sub" / "up").symlink_to(tmp_path)
    os.mkfifo(top / "fifo")
    store = DiskStore(tmp_path / "store")
    built = build_manifest(top, "imagenet", "dataset", store, CHUNK)
    m = built.manifest
    assert [f.path for f in m.files] == sorted(data)
    assert built.skipped == 3
    a = next(f for f in m.files if f.path == "a.bin")
    assert len(a.chunks) == 4
    assert a.chunks[0] == hashlib.sha256(data["a.bin"][:CHUNK]).hexdigest()
    assert built.hashed_bytes == sum(len(b) for b in data.values())
    # in place: the store keeps none of its bytes, yet serves them (read from the folder, checked)
    store.add_local(m, top)
    assert store.held_bytes(m.digest) == m.total_bytes
    assert store.store_bytes() == 0
    assert store.read_chunk(a.chunks[3]) == data["a.bin"][3 * CHUNK :]
    assert store.tree(m.digest) == top
    assert not [p for p in (tmp_path / "store" / "objects").rglob("*") if p.is_file()]


def test_a_rescan_of_an_unchanged_folder_reads_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = tmp_path / "imagenet"
    data = _tree(top)
    store = DiskStore(tmp_path / "store")
    first = build_manifest(top, "imagenet", "dataset", store, CHUNK)
    store.close()
    store = DiskStore(tmp_path / "store")  # the cache is in the index: it survives a restart

    def no_reading(*_args: object) -> None:
        raise AssertionError("a file was read")

    monkeypatch.setattr(build, "_hash_file", no_reading)
    again = build_manifest(top, "imagenet", "dataset", store, CHUNK)
    assert again.manifest == first.manifest
    assert again.hashed_bytes == 0
    monkeypatch.undo()
    # a changed file is hashed again, alone
    (top / "sub" / "b.txt").write_bytes(b"hello, world\n")
    changed = build_manifest(top, "imagenet", "dataset", store, CHUNK)
    assert changed.hashed_bytes == len(b"hello, world\n")
    assert changed.manifest.digest != first.manifest.digest
    assert len(data) == len(changed.manifest.files)


def test_a_local_file_that_changes_is_not_served(tmp_path: Path) -> None:
    top = tmp_path / "ds"
    _tree(top)
    store = DiskStore(tmp_path / "store")
    m = build_manifest(top, "ds", "dataset", store, CHUNK).manifest
    store.add_local(m, top)
    (top / "sub" / "b.txt").write_bytes(b"HELLO\n")
    b = next(f for f in m.files if f.path == "sub/b.txt")
    assert store.read_chunk(b.chunks[0]) is None
    assert store.held_bytes(m.digest) == m.total_bytes - len(b"hello\n")


def test_what_cannot_be_built_is_said_in_one_line(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "store")
    with pytest.raises(ContentError, match="No such file"):
        build_manifest(tmp_path / "nowhere", "x", "dataset", store, CHUNK)
    (tmp_path / "f").write_bytes(b"one file")
    one = build_manifest(tmp_path / "f", "f", "dataset", store, CHUNK).manifest
    assert [f.path for f in one.files] == ["f"]


def test_the_cache_forgets_files_that_are_gone(tmp_path: Path) -> None:
    top = tmp_path / "ds"
    _tree(top)
    other = tmp_path / "other"
    other.mkdir()
    (other / "kept").write_bytes(b"kept")
    store = DiskStore(tmp_path / "store")
    build_manifest(other, "other", "dataset", store, CHUNK)
    build_manifest(top, "ds", "dataset", store, CHUNK)
    st = os.lstat(top / "sub" / "b.txt")
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    assert store.cached_chunks(str(top / "sub" / "b.txt"), stamp, CHUNK) is not None
    (top / "sub" / "b.txt").unlink()
    build_manifest(top, "ds", "dataset", store, CHUNK)
    assert store.cached_chunks(str(top / "sub" / "b.txt"), stamp, CHUNK) is None
    st = os.lstat(other / "kept")  # another folder's rows are not touched
    kept = (st.st_size, st.st_mtime_ns, st.st_ino)
    assert store.cached_chunks(str(other / "kept"), kept, CHUNK) is not None


def test_a_sparse_file_hashes_as_its_bytes_read_without_reading_its_holes(tmp_path: Path) -> None:
    from agent.content.build import _in_hole, zeros_digest

    chunk = 64 << 10
    top = tmp_path / "sparse"
    top.mkdir()
    path = top / "disk.img"
    with path.open("wb") as f:
        f.truncate(4 * chunk)
        f.seek(chunk)
        f.write(b"x" * 10)
    data = path.read_bytes()
    want = [hashlib.sha256(data[i : i + chunk]).hexdigest() for i in range(0, len(data), chunk)]
    fd = os.open(path, os.O_RDONLY)
    try:
        holes = [_in_hole(fd, i, chunk) for i in range(0, len(data), chunk)]
    finally:
        os.close(fd)
    assert holes[1] is False and want[0] == zeros_digest(chunk)
    built = build_manifest(top, "sparse", "dataset", DiskStore(tmp_path / "store"), chunk)
    assert list(built.manifest.files[0].chunks) == want
