"""Shipping the Shoal that runs here, when it is not the package index's release.

Shoal run from a checkout (``make``, ``pip install -e .``) is not on any index: ``pip install
shoal==X`` on a host would fail, or install someone else's build. So bootstrap ships this very
build, without being asked:

1. **This checkout's wheel**, built once per source tree (``pip wheel --no-deps`` of a copy of its
   files, cached under the digest of those files, so a rerun with nothing changed ships the same
   bytes and changes nothing on the hosts).
2. **Its dependencies**, for each host's platform (OS, architecture, Python X.Y), at the versions
   installed here, which must be those of ``uv.lock`` (:mod:`agent.bootstrap.locked`). For a
   host of this machine's platform they are the wheels of this very environment, repacked from
   what is installed (no network, the exact files the operator runs); for any other platform
   they are downloaded from the package index (``pip download --only-binary=:all: --platform
   ...``, every locked version a constraint, each wheel's hash checked against the lock), and a
   host whose wheels cannot be had gets one line saying to build a wheelhouse where the index is
   reachable.

Everything is kept under ``~/.cache/shoal/wheels`` (``$XDG_CACHE_HOME``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import csv
import hashlib
import importlib.metadata
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.bootstrap.locked import check_locked_files, check_locked_versions, constraints, read_lock
from agent.bootstrap.ssh import BootstrapError
from agent.bootstrap.wheelhouse import project_root, requirements
from agent.common.errors import UserError
from agent.common.paths import cache_home

SOURCE_DATE_EPOCH = "315532800"
"""1980-01-01, the earliest a zip can record: the wheel's bytes depend on its sources alone."""
BUILD_TIMEOUT_S = 300.0
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_SKIPPED_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def wheels_dir() -> Path:
    return cache_home() / "wheels"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- the platform a host needs wheels for --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostPlatform:
    """What decides which binary wheels a host can install."""

    os: str
    """``uname -s``: Linux, Darwin."""
    arch: str
    """``uname -m``: x86_64, aarch64, arm64."""
    python: tuple[int, int]

    @property
    def key(self) -> str:
        return f"{self.os.lower()}-{self.arch}-cp{self.python[0]}{self.python[1]}"

    def __str__(self) -> str:
        return f"{self.os} {self.arch}, Python {self.python[0]}.{self.python[1]}"

    def pip_platforms(self) -> list[str]:
        """``pip download --platform`` tags for this platform."""
        if self.os == "Darwin":
            if self.arch == "arm64":
                return ["macosx_11_0_arm64", "macosx_11_0_universal2"]
            return [f"macosx_10_12_{self.arch}", "macosx_10_12_universal2"]
        return [f"manylinux2014_{self.arch}", f"manylinux_2_28_{self.arch}"]


def local_platform() -> HostPlatform:
    return HostPlatform(
        platform.system(), platform.machine(), (sys.version_info[0], sys.version_info[1])
    )


# -- this checkout's wheel -----------------------------------------------------------------------


def _package_dirs(root: Path) -> list[str]:
    """The top-level packages pyproject.toml names (``[tool.setuptools.packages.find]``)."""
    doc = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    find = doc.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    return sorted({p.split("*")[0].split(".")[0] for p in find.get("include", []) if p})


def _source_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml", root / "README.md"]
    for package in _package_dirs(root):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append(path)
    return [f for f in files if f.is_file()]


def source_digest(root: Path) -> str:
    """SHA-256 over the names and bytes of every file the wheel is built from."""
    digest = hashlib.sha256()
    for path in _source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _setuptools_builds_offline() -> bool:
    """Whether the setuptools here builds our pyproject (77 or newer), so pip need not fetch one
    (``--no-build-isolation``)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


def _pip_env() -> dict[str, str]:
    return {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PIP_NO_INPUT": "1"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "?"


def build_checkout_wheel(root: Path, version: str) -> Path:
    """This checkout's wheel (cached by :func:`source_digest`); one UserError line on failure."""
    out = wheels_dir() / "shoal" / source_digest(root)[:20]
    found = sorted(out.glob(f"shoal-{version}-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(prefix="shoal-build-") as tmp:
        src = Path(tmp) / "src"
        for path in _source_files(root):
            target = src / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--no-cache-dir"]
        if _setuptools_builds_offline():
            argv.append("--no-build-isolation")
        built = Path(tmp) / "out"
        argv += [str(src), "-w", str(built)]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                check=False,
                env=_pip_env(),
                timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"building the wheel of {root} ran past {BUILD_TIMEOUT_S:.0f} s"
            ) from None
        wheels = sorted(built.glob("shoal-*.whl"))
        if done.returncode != 0 or not wheels:
            raise UserError(
                f"cannot build the wheel of {root}: {_last_line(done.stderr or done.stdout)}"
            )
        out.mkdir(parents=True, exist_ok=True)
        final = out / wheels[0].name
        shutil.move(str(wheels[0]), final)
        return final


# -- dependencies: the closure installed here ----------------------------------------------------


def _split_requirement(text: str) -> tuple[str, set[str], str]:
    """``name[a,b] (>=1) ; marker`` -> (name, {a, b}, marker)."""
    spec, _, marker = text.partition(";")
    match = _REQUIREMENT.match(spec)
    if match is None:
        return "", set(), marker
    extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    return match.group(1), extras, marker


def installed_closure(root: str = "shoal") -> list[importlib.metadata.Distribution]:
    """Every distribution ``root`` needs, as installed here (``root`` itself left out).

    A requirement whose marker names an extra counts only where that extra was asked for; one
    not installed here was not needed here (its marker is false on this platform).
    """
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo: list[tuple[str, set[str]]] = [(root, set())]
    extras_done: set[tuple[str, str]] = set()
    while todo:
        name, extras = todo.pop()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        key = normalize(dist.metadata["Name"] or name)
        fresh = key not in seen
        wanted = {e for e in extras if (key, e) not in extras_done}
        if not fresh and not wanted:
            continue
        seen[key] = dist
        extras_done |= {(key, e) for e in wanted}
        for requirement in dist.requires or []:
            dep, dep_extras, marker = _split_requirement(requirement)
            needed_extra = _EXTRA_MARKER.search(marker)
            if needed_extra is not None:
                if needed_extra.group(1) not in wanted:
                    continue
            elif not fresh:
                continue
            if dep:
                todo.append((dep, dep_extras))
    seen.pop(normalize(root), None)
    return sorted(seen.values(), key=lambda d: normalize(d.metadata["Name"] or ""))


def pins(dists: Iterable[importlib.metadata.Distribution]) -> list[str]:
    return [f"{d.metadata['Name']}=={d.version}" for d in dists]


class NotRepackable(Exception):
    """An installed distribution lacks what a wheel is made from (no RECORD or WHEEL)."""


def _wheel_name(dist: importlib.metadata.Distribution) -> str:
    text = dist.read_text("WHEEL")
    if not text:
        raise NotRepackable(f"{dist.metadata['Name']}: no WHEEL file")
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    if not tags:
        raise NotRepackable(f"{dist.metadata['Name']}: no tags in WHEEL")
    parts = [t.split("-") for t in tags]
    pys, abis, plats = (".".join(sorted({p[i] for p in parts})) for i in range(3))
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"] or "")
    return f"{name}-{dist.version}-{pys}-{abis}-{plats}.whl"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def repack(dist: importlib.metadata.Distribution, out: Path) -> Path:
    """The wheel ``dist`` was installed from, made again from its installed files (RECORD)."""
    files = dist.files
    if not files:
        raise NotRepackable(f"{dist.metadata['Name']}: no RECORD")
    wheel = out / _wheel_name(dist)
    info_dir: str | None = None
    entries: list[tuple[str, Path]] = []
    for item in files:
        name = item.as_posix()
        if name.startswith("..") or "__pycache__" in item.parts or name.endswith(".pyc"):
            continue  # scripts and data outside site-packages, bytecode: made again on install
        if item.parts[0].endswith(".dist-info"):
            info_dir = item.parts[0]
            if item.name in _SKIPPED_INFO and len(item.parts) == 2:
                continue
        entries.append((name, Path(str(dist.locate_file(item)))))
    if info_dir is None:
        raise NotRepackable(f"{dist.metadata['Name']}: no .dist-info in RECORD")
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, path in entries:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise NotRepackable(f"{name}: {exc.strerror or exc}") from None
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0xFFFF) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            writer.writerow([name, _record_hash(data), len(data)])
        writer.writerow([f"{info_dir}/RECORD", "", ""])
        record = zipfile.ZipInfo(f"{info_dir}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        record.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(record, rows.getvalue())
    tmp.replace(wheel)
    return wheel


def repack_environment(dists: Sequence[importlib.metadata.Distribution], out: Path) -> None:
    for dist in dists:
        repack(dist, out)


def download_wheels(requirements: Sequence[str], target: HostPlatform, out: Path) -> None:
    """``pip download`` the binary wheels of ``requirements`` for ``target``, every version the
    checkout locks a constraint and every wheel's hash one the lock lists; BootstrapError with
    pip's last line, and what to do instead, when it cannot."""
    root = project_root()
    locked = read_lock(root) if root is not None else {}
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    for tag in target.pip_platforms():
        argv += ["--platform", tag]
    argv += ["--python-version", f"{target.python[0]}.{target.python[1]}"]
    argv += ["--retries", "1", "--timeout", "10", "-d", str(out)]
    with tempfile.TemporaryDirectory(prefix="shoal-constraints-") as tmp:
        if locked:
            pinned = Path(tmp) / "constraints.txt"
            pinned.write_text("\n".join(constraints(locked)) + "\n")
            argv += ["-c", str(pinned)]
        done = subprocess.run(
            [*argv, *requirements],
            capture_output=True,
            text=True,
            check=False,
            env=_pip_env(),
            timeout=900,
        )
    if done.returncode != 0:
        raise BootstrapError(
            f"cannot get Shoal's dependencies for {target} from the package index "
            f"({_last_line(done.stderr or done.stdout)}); build a wheelhouse where the index is "
            "reachable (shoal bootstrap --build-wheelhouse DIR --platform TAG --target-python "
            "X.Y) and pass --wheelhouse DIR"
        )
    if locked:
        try:
            check_locked_files(out.glob("*.whl"), locked)
        except UserError as exc:
            raise BootstrapError(str(exc)) from None


def dependency_wheels(target: HostPlatform) -> list[Path]:
    """The wheels of Shoal's dependencies for ``target`` (see the module's docstring)."""
    dists = installed_closure()
    root = project_root()
    if root is not None:
        check_locked_versions(((d.metadata["Name"] or "", d.version) for d in dists), root)
    pinned = pins(dists)
    digest = hashlib.sha256("\n".join([target.key, *pinned]).encode()).hexdigest()[:16]
    out = wheels_dir() / "deps" / f"{target.key}-{digest}"
    done_mark = out / ".complete"
    if not done_mark.exists():
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(out)
        out.mkdir(parents=True)
        try:
            if target == local_platform():
                try:
                    repack_environment(dists, out)
                except NotRepackable:
                    download_wheels([*pinned, *requirements()], target, out)
            else:
                download_wheels([*pinned, *requirements()], target, out)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        done_mark.write_text("\n".join(pinned) + "\n")
    return sorted(out.glob("*.whl"))


@dataclass
class LocalBuild:
    """This checkout's wheel, and its dependencies per platform, made once for a whole run."""

    wheel: Path
    checkout: Path
    _by_platform: dict[HostPlatform, asyncio.Future[list[Path]]] = field(default_factory=dict)

    async def wheels_for(self, target: HostPlatform) -> list[Path]:
        """The wheel and its dependencies for ``target`` (made in a thread, once per platform)."""
        future = self._by_platform.get(target)
        if future is None:
            future = asyncio.ensure_future(asyncio.to_thread(dependency_wheels, target))
            self._by_platform[target] = future
        deps = await asyncio.shield(future)
        return [self.wheel, *deps]
