"""Packing a working folder: .git, .gitignore and .shoalignore (nested too) leave files out, no
link is followed, the cap refuses in one line, and a copy on the runner is writable and whole."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.content.manifest import ContentError
from agent.content.workdir import copy_out, pack_workdir, read_chunks


def tree(top: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = top / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def test_ignore_files_and_git_leave_files_out(tmp_path: Path) -> None:
    top = tmp_path / "proj"
    tree(
        top,
        {
            "train.py": b"print(1)\n",
            "data/keep.csv": b"a,b\n",
            "data/big.bin": b"x" * 1000,
            "build/out.o": b"obj",
            "pkg/mod.py": b"x = 1\n",
            "pkg/cache.tmp": b"tmp",
            "pkg/sub/also.tmp": b"tmp",
            "pkg/sub/real.py": b"y = 2\n",
            "other.tmp": b"kept: the .tmp rule is pkg's",
            ".git/HEAD": b"ref: refs/heads/main\n",
            ".gitignore": b"build/\n*.bin\n",
            "pkg/.shoalignore": b"*.tmp\n",
        },
    )
    os.symlink("/etc/passwd", top / "link")
    packed = pack_workdir(top)
    paths = {f.path for f in packed.manifest.files}
    assert paths == {
        ".gitignore",
        "data/keep.csv",
        "other.tmp",
        "pkg/.shoalignore",
        "pkg/mod.py",
        "pkg/sub/real.py",
        "train.py",
    }
    assert packed.manifest.kind == "workdir"
    assert packed.ignored == 5  # big.bin, out.o, cache.tmp, also.tmp, .git/HEAD
    assert packed.skipped == 1  # the link


def test_the_cap_refuses_in_one_line(tmp_path: Path) -> None:
    tree(tmp_path / "p", {"a.bin": b"x" * 3000, "b.bin": b"y" * 3000})
    with pytest.raises(ContentError) as err:
        pack_workdir(tmp_path / "p", max_bytes=4000)
    assert "more than the cap" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "p" / ".shoalignore").write_text("b.bin\n")
    assert pack_workdir(tmp_path / "p", max_bytes=4000).manifest.total_bytes == 3000 + 6


def test_the_same_folder_packs_to_the_same_digest_and_its_chunks_read_back(tmp_path: Path) -> None:
    top = tmp_path / "p"
    tree(top, {"a.py": b"a" * (300 << 10), "b/c.txt": b"c"})
    first = pack_workdir(top).manifest
    assert pack_workdir(top).manifest.digest == first.digest
    got = dict(read_chunks(top, first, first.chunk_digests()))
    assert {at.digest for at in got} == first.chunk_digests()
    for at, data in got.items():
        assert hashlib.sha256(data).hexdigest() == at.digest
    (top / "b" / "c.txt").write_bytes(b"changed")
    assert pack_workdir(top).manifest.digest != first.digest


def test_a_copy_is_whole_and_writable(tmp_path: Path) -> None:
    src = tmp_path / "src"
    tree(src, {"run.sh": b"#!/bin/sh\n", "d/x": b"x"})
    os.chmod(src / "run.sh", 0o555)
    os.chmod(src / "d" / "x", 0o444)
    dest = tmp_path / "work"
    dest.mkdir()
    (dest / "stale").write_text("from an earlier attempt")
    copy_out(src, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["d", "d/x", "run.sh"]
    assert os.stat(dest / "run.sh").st_mode & 0o777 == 0o755
    (dest / "d" / "x").write_text("the job may change its copy")
    assert (src / "d" / "x").read_bytes() == b"x"


def test_not_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ContentError, match="not a folder"):
        pack_workdir(tmp_path / "f")
