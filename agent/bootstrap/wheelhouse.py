"""``shoal bootstrap --build-wheelhouse DIR``: everything an offline host needs, in one folder.

The Shoal wheel is built from this checkout (``pip wheel --no-deps``); its dependencies are
downloaded as binary wheels for each target platform (``pip download --only-binary=:all:
--platform TAG --python-version X.Y``), at the versions of ``uv.lock`` and kept only if their hashes
are the lock's. ``requirements.txt`` beside them pins every wheel to its SHA-256 (see
:mod:`agent.bootstrap.locked`). Upload it with ``shoal bootstrap --wheelhouse DIR``.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agent.bootstrap.locked import (
    HASHES_FILE,
    check_locked_files,
    constraints,
    hashes_text,
    read_lock,
)
from agent.common.errors import UserError


def local_version() -> str:
    """The Shoal version the operator runs: what bootstrap installs unless told otherwise."""
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def project_root() -> Path | None:
    """The checkout this Shoal runs from (a folder with pyproject.toml), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def requirements() -> list[str]:
    """Shoal's runtime requirements, markers kept (pip evaluates them per platform)."""
    try:
        reqs = importlib.metadata.requires("shoal") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [r for r in reqs if "extra ==" not in r]


def wheel_command(root: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "wheel", "--no-deps", str(root), "-w", str(out)]


def download_command(
    requirements: Sequence[str],
    out: Path,
    platform: str,
    python_version: str,
    constraints_file: Path | None = None,
) -> list[str]:
    constrain = ["-c", str(constraints_file)] if constraints_file is not None else []
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--only-binary=:all:",
        "--platform",
        platform,
        "--python-version",
        python_version,
        "-d",
        str(out),
        *constrain,
        *requirements,
    ]


def build_wheelhouse(out: Path, platforms: Sequence[str], python_version: str) -> list[Path]:
    """Fill ``out`` with the locked set; returns the wheels in it. Each failure is one line."""
    root = project_root()
    if root is None:
        raise UserError("--build-wheelhouse needs Shoal's source checkout (pyproject.toml)")
    locked = read_lock(root)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shoal-constraints-") as tmp:
        pinned = Path(tmp) / "constraints.txt"
        pinned.write_text("\n".join(constraints(locked)) + "\n")
        steps = [wheel_command(root, out)]
        steps += [
            download_command(requirements(), out, p, python_version, pinned) for p in platforms
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                raise UserError(f"{' '.join(argv[2:4])} failed: {lines[-1] if lines else '?'}")
    wheels = sorted(out.glob("*.whl"))
    if locked:
        check_locked_files(wheels, locked)
    (out / HASHES_FILE).write_text(hashes_text(wheels))
    return wheels
