"""The locked set bootstrap ships: ``uv.lock`` read as it is, wheels held to its hashes, and a
wheelhouse whose wheel was changed refused in one line before anything reaches a host."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from agent.bootstrap.locked import (
    HASHES_FILE,
    check_locked_files,
    check_locked_versions,
    hashes_text,
    read_lock,
    verified_wheelhouse,
)
from agent.common.errors import UserError
from tests.shoal_cli import shoal

PROJECT = Path(__file__).resolve().parents[2]


def test_the_checkout_lock_pins_every_runtime_dependency_with_hashes() -> None:
    locked = read_lock(PROJECT)
    for name in ("cryptography", "aiohttp", "asyncssh", "textual", "msgpack", "psutil"):
        assert locked[name].version, name
        assert locked[name].sha256 and all(len(h) == 64 for h in locked[name].sha256), name


def test_a_wheel_of_another_version_or_other_bytes_is_not_the_locked_one(tmp_path: Path) -> None:
    locked = read_lock(PROJECT)
    version = locked["msgpack"].version
    other = tmp_path / "msgpack-0.0.1-py3-none-any.whl"
    other.write_bytes(b"x")
    with pytest.raises(UserError, match="is not locked"):
        check_locked_files([other], locked)
    changed = tmp_path / f"msgpack-{version}-py3-none-any.whl"
    changed.write_bytes(b"not the file the lock hashed")
    with pytest.raises(UserError, match=r"does not match any hash in uv\.lock"):
        check_locked_files([changed], locked)
    stranger = tmp_path / "leftpad-1.0-py3-none-any.whl"
    stranger.write_bytes(b"x")
    with pytest.raises(UserError, match="not in the lock"):
        check_locked_files([stranger], locked)


def test_an_environment_that_drifted_from_the_lock_is_refused() -> None:
    locked = read_lock(PROJECT)
    check_locked_versions([("cryptography", locked["cryptography"].version)], PROJECT)
    with pytest.raises(UserError, match=r"cryptography 1\.0 .*make install"):
        check_locked_versions([("cryptography", "1.0")], PROJECT)


def _wheelhouse(folder: Path) -> Path:
    folder.mkdir()
    wheel = folder / "shoal-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"the wheel as built")
    (folder / HASHES_FILE).write_text(hashes_text([wheel]))
    return wheel


def test_a_wheelhouse_is_read_against_its_hashes(tmp_path: Path) -> None:
    wheel = _wheelhouse(tmp_path / "wh")
    digest = hashlib.sha256(b"the wheel as built").hexdigest()
    assert (tmp_path / "wh" / HASHES_FILE).read_text() == f"shoal==0.1.0 --hash=sha256:{digest}\n"
    assert verified_wheelhouse(tmp_path / "wh") == [wheel]
    (tmp_path / "wh" / "extra-1.0-py3-none-any.whl").write_bytes(b"slipped in")
    with pytest.raises(UserError, match=r"is not listed in its requirements\.txt"):
        verified_wheelhouse(tmp_path / "wh")


def test_bootstrap_refuses_a_tampered_wheelhouse_in_one_line(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    assert shoal("init", "--dir", str(cluster)).returncode == 0
    wheel = _wheelhouse(tmp_path / "wh")
    wheel.write_bytes(b"the wheel, changed after it was built")
    done = shoal("bootstrap", "--identity", str(cluster), "--wheelhouse", str(wheel.parent), "me@h")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"shoal: {wheel.name} in {wheel.parent} does not match its hash in requirements.txt: "
        "refused"
    ]


def test_the_host_side_install_refuses_a_wheel_that_does_not_match(tmp_path: Path) -> None:
    """What the host runs: pip --require-hashes against the uploaded requirements.txt."""
    wheel = _wheelhouse(tmp_path / "up")
    wheel.write_bytes(b"changed on the way")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--find-links",
            str(wheel.parent),
            "--require-hashes",
            "--ignore-installed",
            "--dry-run",
            "-q",
            "-r",
            str(wheel.parent / HASHES_FILE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "HASHES" in done.stderr.upper()
