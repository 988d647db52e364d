"""The locked dependency set, and wheels shipped by hash.

A checkout installs exactly ``uv.lock`` (``make install``). What bootstrap ships to a host must be
that same set, so a host never runs versions nobody tested:

- wheels fetched for another platform are fetched with every locked version as a constraint and
  kept only if their SHA-256 is one the lock lists for that name and version;
- the wheels of this environment, repacked for a host of this platform, must be the locked
  versions (an environment that drifted from the lock is refused: ``make install`` mends it);
- a wheelhouse (``--build-wheelhouse``) carries ``requirements.txt``: each wheel it holds, pinned,
  with its SHA-256. Bootstrap checks every wheel against it before uploading, and the host installs
  with ``pip --require-hashes`` from the same file, so a wheel changed on the way is refused there
  too.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.common.errors import UserError

LOCK_FILE = "uv.lock"
HASHES_FILE = "requirements.txt"
"""In a wheelhouse, and in what is uploaded to a host: each wheel, pinned, with its SHA-256."""
_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class LockedPackage:
    """One package of ``uv.lock``: its version and the SHA-256 of each of its files."""

    name: str
    version: str
    sha256: frozenset[str]


def read_lock(root: Path) -> dict[str, LockedPackage]:
    """The packages ``root/uv.lock`` pins, by normalized name (empty when there is no lock)."""
    path = root / LOCK_FILE
    try:
        doc = tomllib.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    locked: dict[str, LockedPackage] = {}
    for package in doc.get("package", []):
        files = [*package.get("wheels", []), package.get("sdist") or {}]
        digests = frozenset(str(f["hash"]).removeprefix("sha256:") for f in files if "hash" in f)
        name = normalize(str(package["name"]))
        locked[name] = LockedPackage(name, str(package["version"]), digests)
    return locked


def constraints(locked: dict[str, LockedPackage]) -> list[str]:
    """Every locked version as a pip constraint (Shoal itself, built from the checkout, aside)."""
    return [f"{p.name}=={p.version}" for p in locked.values() if p.name != "shoal"]


def wheel_identity(wheel: Path) -> tuple[str, str]:
    """(normalized name, version) from a wheel's file name."""
    match = _WHEEL_NAME.match(wheel.name)
    if match is None:
        raise UserError(f"{wheel.name} is not a wheel's file name")
    return normalize(match["name"]), match["version"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_locked_files(wheels: Iterable[Path], locked: dict[str, LockedPackage]) -> None:
    """Each wheel (Shoal's aside) must be a locked version with a hash the lock lists."""
    for wheel in wheels:
        name, version = wheel_identity(wheel)
        if name == "shoal":
            continue
        package = locked.get(name)
        if package is None or package.version != version:
            want = f"the lock has {package.version}" if package else "it is not in the lock"
            raise UserError(f"{wheel.name}: version {version} is not locked ({want})")
        if sha256_of(wheel) not in package.sha256:
            raise UserError(f"{wheel.name} does not match any hash in {LOCK_FILE}: refused")


def check_locked_versions(installed: Iterable[tuple[str, str]], root: Path) -> None:
    """This environment's versions must be the lock's (when the checkout has one)."""
    locked = read_lock(root)
    if not locked:
        return
    drifted = [
        f"{name} {version} (locked: {locked[normalize(name)].version})"
        for name, version in installed
        if normalize(name) in locked and locked[normalize(name)].version != version
    ]
    if drifted:
        raise UserError(
            f"this environment is not the locked one ({', '.join(drifted[:3])}); "
            "run 'make install' to install exactly uv.lock"
        )


def hashes_text(wheels: Sequence[Path]) -> str:
    """``requirements.txt`` pinning each wheel to its own bytes."""
    lines = []
    for wheel in sorted(wheels, key=lambda w: w.name):
        name, version = wheel_identity(wheel)
        lines.append(f"{name}=={version} --hash=sha256:{sha256_of(wheel)}")
    return "\n".join(lines) + "\n"


def verified_wheelhouse(folder: Path) -> list[Path]:
    """The wheels of a wheelhouse, each checked against its ``requirements.txt``."""
    listing = folder / HASHES_FILE
    try:
        text = listing.read_text("utf-8")
    except FileNotFoundError:
        raise UserError(
            f"the wheelhouse {folder} has no {HASHES_FILE} with the wheels' hashes "
            "(build it with: shoal bootstrap --build-wheelhouse DIR)"
        ) from None
    expected: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        pin, _, digest = line.partition(" --hash=sha256:")
        name, _, version = pin.partition("==")
        if name and version and digest:
            expected[(normalize(name), version.strip())] = digest.strip()
    wheels = sorted(p for p in folder.iterdir() if p.name.endswith(".whl"))
    for wheel in wheels:
        listed = expected.get(wheel_identity(wheel))
        if listed is None:
            raise UserError(f"{wheel.name} in {folder} is not listed in its {HASHES_FILE}")
        if sha256_of(wheel) != listed:
            raise UserError(
                f"{wheel.name} in {folder} does not match its hash in {HASHES_FILE}: refused"
            )
    return wheels
