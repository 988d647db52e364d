"""What a host has, learned over SSH with one POSIX ``sh`` script: OS, architecture, the user,
the service managers, the Python interpreters and the GPU drivers.

The script prints ``key=value`` lines; :func:`parse_probe` turns them into :class:`HostFacts`.
GPU drivers are reported, not required: a host without any still runs an agent (CPU only).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

MIN_PYTHON = (3, 11)
PYTHON_CANDIDATES = ("python3.14", "python3.13", "python3.12", "python3.11", "python3", "python")

_VERSION_CODE = 'import sys; print("%d.%d.%d" % sys.version_info[:3])'

_NVML_LIBS = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/libnvidia-ml.so.1",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
)


def probe_script(pythons: tuple[str, ...] = PYTHON_CANDIDATES) -> str:
    """The script run on the host; ``pythons`` are names or paths to try, best first."""
    candidates = " ".join(shlex.quote(p) for p in pythons)
    libs = " ".join(_NVML_LIBS)
    return f"""
echo "os=$(uname -s)"
echo "arch=$(uname -m)"
echo "uid=$(id -u)"
echo "user=$(id -un)"
echo "home=$HOME"
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then echo "systemd=1"; fi
if command -v launchctl >/dev/null 2>&1; then echo "launchd=1"; fi
if command -v loginctl >/dev/null 2>&1; then echo "loginctl=1"; fi
for p in {candidates}; do
  path=$(command -v "$p" 2>/dev/null) || continue
  v=$("$path" -c {shlex.quote(_VERSION_CODE)} 2>/dev/null) || continue
  echo "python=$v $path"
done
if path=$(command -v nvidia-smi 2>/dev/null); then echo "gpu=nvidia-smi $path"; fi
for lib in {libs}; do
  if [ -e "$lib" ]; then echo "gpu=libnvidia-ml $lib"; fi
done
for u in /sys/class/drm/card[0-9]*/device/uevent; do
  [ -r "$u" ] || continue
  d=$(sed -n 's/^DRIVER=//p' "$u")
  case "$d" in amdgpu|xe|i915|nvidia) echo "gpu=$d ${{u%/device/uevent}}";; esac
done
if [ -e /dev/kfd ]; then echo "gpu=kfd /dev/kfd"; fi
if [ "$(uname -s)" = Darwin ]; then
  system_profiler SPDisplaysDataType 2>/dev/null \\
    | sed -n 's/^ *Metal[^:]*: *\\(.*\\)$/gpu=metal \\1/p'
fi
exit 0
"""


@dataclass(frozen=True, slots=True)
class PythonFound:
    path: str
    version: tuple[int, int, int]

    @property
    def version_text(self) -> str:
        return ".".join(str(v) for v in self.version)

    @property
    def usable(self) -> bool:
        return self.version[:2] >= MIN_PYTHON


@dataclass(frozen=True, slots=True)
class GpuDriver:
    """One sign of a GPU driver: ``kind`` (nvidia-smi, libnvidia-ml, amdgpu, xe, i915, nvidia,
    kfd, metal) and where it was seen."""

    kind: str
    where: str


@dataclass(frozen=True, slots=True)
class HostFacts:
    os: str
    arch: str
    uid: int | None
    user: str
    home: str
    systemd: bool
    launchd: bool
    loginctl: bool
    pythons: tuple[PythonFound, ...]
    gpu_drivers: tuple[GpuDriver, ...]

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    @property
    def python(self) -> PythonFound | None:
        """The first usable interpreter, in the order they were tried."""
        return next((p for p in self.pythons if p.usable), None)

    def gpu_summary(self) -> str:
        """``nvidia (nvidia-smi, libnvidia-ml), amdgpu x2`` or ``none``."""
        if not self.gpu_drivers:
            return "none"
        counts: dict[str, int] = {}
        for d in self.gpu_drivers:
            counts[d.kind] = counts.get(d.kind, 0) + 1
        return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in counts.items())


class NoPython(Exception):
    """No interpreter >= 3.11; ``str()`` is the one-line reason."""


def parse_probe(text: str) -> HostFacts:
    values: dict[str, str] = {}
    pythons: list[PythonFound] = []
    seen_paths: set[str] = set()
    gpus: list[GpuDriver] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "python":
            version_text, _, path = value.partition(" ")
            version = _version(version_text)
            if version is not None and path and path not in seen_paths:
                seen_paths.add(path)
                pythons.append(PythonFound(path=path, version=version))
        elif key == "gpu":
            kind, _, where = value.partition(" ")
            if kind:
                gpus.append(GpuDriver(kind=kind, where=where))
        else:
            values[key] = value
    uid = values.get("uid", "")
    return HostFacts(
        os=values.get("os", "") or "unknown",
        arch=values.get("arch", "") or "unknown",
        uid=int(uid) if uid.isdigit() else None,
        user=values.get("user", ""),
        home=values.get("home", ""),
        systemd=values.get("systemd") == "1",
        launchd=values.get("launchd") == "1",
        loginctl=values.get("loginctl") == "1",
        pythons=tuple(pythons),
        gpu_drivers=tuple(gpus),
    )


def _version(text: str) -> tuple[int, int, int] | None:
    parts = text.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


PYTHON_HINT = (
    "install Python 3.11 or newer (e.g. apt-get install python3.11 python3.11-venv, "
    "dnf install python3.11, brew install python@3.12) and pass --python PATH unless it is on PATH"
)


def require_python(
    facts: HostFacts,
    host: str,
    wanted: str | None = None,
    prefer: tuple[int, int] | None = None,
) -> PythonFound:
    """The interpreter to build the venv from, or NoPython with the one line to show.

    ``wanted`` is the one interpreter asked for (``--python`` or the hosts file); ``prefer`` a
    version to choose among several usable ones (the operator's own, whose wheels can ship).
    """
    usable = [p for p in facts.pythons if p.usable]
    if prefer is not None:
        same = [p for p in usable if p.version[:2] == prefer]
        if same:
            return same[0]
    if usable:
        return usable[0]
    if facts.pythons:
        best = max(facts.pythons, key=lambda p: p.version)
        raise NoPython(
            f"host {host}: Python 3.11+ not found (found {best.version_text} at {best.path}); "
            + PYTHON_HINT
        )
    if wanted is not None:
        raise NoPython(
            f"host {host}: the interpreter {wanted} does not exist there or does not run; "
            "pass --python with the path of Python 3.11 or newer on that host"
        )
    tried = ", ".join(PYTHON_CANDIDATES[:-2])
    raise NoPython(
        f"host {host}: Python 3.11+ not found (none of {tried}, python3 or python on PATH); "
        + PYTHON_HINT
    )
