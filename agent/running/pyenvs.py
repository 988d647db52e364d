"""Python environments built on the runner with uv, once per node per lock.

A spec's ``python_env`` names a file of its working folder: a ``uv.lock`` (with the
``pyproject.toml`` beside it) or a requirements file. Its key is the SHA-256 of the kind, the
Python it is built on and the file's bytes (for a lock, the ``pyproject.toml``'s too): jobs whose
files are byte for byte the same share one environment. The first job with a key builds it while
it waits (its reason says ``building environment``); every later one finds it built and starts at
once (a hit). A build runs uv with ``--no-build`` (wheels only: no package's code runs while it
installs, with the agent's rights), from the agent's wheelhouse or index, and on the agent's own
Python. A failed build ends the attempt with the build's last lines as its reason.

Built environments live in ``<data dir>/envs/<key>`` (a venv is not relocatable: it is used where it
was built), are indexed in the content store as kind ``env`` (so ``shoal cache`` lists them and
the store's rules evict them with the rest), and the node gossips their keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.job.jobspec import PythonEnv

log = logging.getLogger(__name__)

BUILT_MARK: Final = ".shoal-built"
BUILD_TIMEOUT_S: Final = 1800.0
TAIL_LINES: Final = 5
TAIL_CHARS: Final = 600
BUILDING_LINE: Final = "building environment"


class EnvBuildFailed(Exception):
    """The environment could not be built: the attempt fails with this (the build's last lines)."""


class NoBuilder(Exception):
    """This node cannot build environments (no uv): the offer is declined, another may."""


@dataclass(frozen=True, slots=True)
class EnvKey:
    key: str
    kind: str
    file: Path


def env_key(env: PythonEnv, workdir: Path, python: str = sys.executable) -> EnvKey:
    """The key of ``env`` as the working folder ``workdir`` holds it; ``EnvBuildFailed`` when the
    file is not there."""
    file = workdir / env.file
    h = hashlib.sha256(f"{env.kind}\0{_python_version(python)}\0".encode())
    try:
        h.update(file.read_bytes())
        if env.kind == "lock":
            h.update(b"\0" + (file.parent / "pyproject.toml").read_bytes())
    except OSError as exc:
        raise EnvBuildFailed(
            f"python_env: {env.file}: {exc.strerror or exc} in the working folder"
        ) from None
    return EnvKey(h.hexdigest(), env.kind, file)


def _python_version(python: str) -> str:
    if python == sys.executable:
        return ".".join(map(str, sys.version_info[:3]))
    return python


class PythonEnvs:
    """The environments of this node and the builds under way."""

    def __init__(
        self,
        root: Path,
        uv: Path | None,
        wheelhouse: Path | None = None,
        index_url: str | None = None,
        on_built: Callable[[str, Path], None] | None = None,
    ) -> None:
        self.root = root
        self.uv = uv if uv is not None else _which_uv()
        self.wheelhouse = wheelhouse
        self.index_url = index_url
        self.counts: Counter[str] = Counter()
        """``hits``, ``builds``, ``failed`` (``shoal_env_builds_total``)."""
        self.prebuilding: set[str] = set()
        """Working-folder digests whose environment is being built ahead of their job."""
        self.building: dict[str, str] = {}
        """Job -> its waiting line while its environment builds."""
        self.build_seconds: list[float] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self.on_built = on_built
        self.changed: Callable[[], None] = lambda: None
        """Told when an environment is built (the node gossips what it holds)."""

    def held(self) -> list[str]:
        """The keys of the environments built here."""
        try:
            return sorted(p.name for p in self.root.iterdir() if (p / BUILT_MARK).exists())
        except OSError:
            return []

    async def prepare(self, job_id: str, env: PythonEnv, workdir: Path) -> Mapping[str, str]:
        """The environment of ``env`` built (or found): the variables that activate it. Raises
        :class:`EnvBuildFailed` (the attempt fails), :class:`NoBuilder` (declined here)."""
        key = await asyncio.to_thread(env_key, env, workdir)
        dest = self.root / key.key
        lock = self._locks.setdefault(key.key, asyncio.Lock())
        async with lock:
            if (dest / BUILT_MARK).exists():
                self.counts["hits"] += 1
                os.utime(dest / BUILT_MARK)
            else:
                if self.uv is None:
                    raise NoBuilder("python_env: no uv on this node (the agent's --uv or PATH)")
                if job_id:
                    self.building[job_id] = BUILDING_LINE
                began = time.monotonic()
                try:
                    await self._build(key, dest)
                except EnvBuildFailed:
                    self.counts["failed"] += 1
                    raise
                finally:
                    self.building.pop(job_id, None)
                self.counts["builds"] += 1
                self.build_seconds.append(time.monotonic() - began)
                if self.on_built is not None:
                    await asyncio.to_thread(self.on_built, key.key, dest)
                self.changed()
        return {"VIRTUAL_ENV": str(dest)}

    async def _build(self, key: EnvKey, dest: Path) -> None:
        await asyncio.to_thread(_fresh, dest)
        uv = str(self.uv)
        source: list[str] = []
        if self.wheelhouse is not None:
            source = ["--no-index", "--find-links", str(self.wheelhouse)]
        elif self.index_url is not None:
            source = ["--index-url", self.index_url]
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": os.environ.get("HOME", str(self.root)),
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_CONFIG": "1",
        }
        if cache := os.environ.get("UV_CACHE_DIR"):
            env["UV_CACHE_DIR"] = cache
        steps = [[uv, "venv", "--quiet", "--python", sys.executable, str(dest)]]
        if key.kind == "requirements":
            python = str(dest / "bin" / "python")
            install = [uv, "pip", "install", "--quiet", "--no-build", "--python", python]
            steps.append([*install, *source, "-r", str(key.file)])
        else:
            env["UV_PROJECT_ENVIRONMENT"] = str(dest)
            sync = [uv, "sync", "--quiet", "--frozen", "--no-build", "--no-install-project"]
            project = ["--python", sys.executable, "--project", str(key.file.parent)]
            steps.append([*sync, *project, *source])
        for argv in steps:
            await _run(argv, env, key.file.parent)
        await asyncio.to_thread((dest / BUILT_MARK).write_text, key.key + "\n")


async def _run(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise EnvBuildFailed(f"environment build: cannot run uv: {exc}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BUILD_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise EnvBuildFailed(f"environment build: over {BUILD_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
        tail = " | ".join(ln.strip() for ln in lines[-TAIL_LINES:])[-TAIL_CHARS:]
        raise EnvBuildFailed(f"environment build failed (uv exit {proc.returncode}): {tail}")


def _fresh(dest: Path) -> None:
    """No half-built environment left at ``dest``; its parent there, reachable by jobs."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(dest.parent, 0o755)
    if os.path.lexists(dest):
        shutil.rmtree(dest, ignore_errors=True)


def _which_uv() -> Path | None:
    found = shutil.which("uv")
    return None if found is None else Path(found)
