"""Real podman and a real local registry for the container tests.

Each test session (each xdist worker) starts one Debian ``docker-registry`` on a loopback port of
its own, with its storage under the session's temporary folder, builds a busybox image from the
machine's static busybox (``podman import`` of a rootfs tar), pushes it there and stops the
registry at the end. Agents and executors pull it into podman storage of their own
(``--root``/``--runroot`` under the test's folder), so no test shares state with another or with
the host's podman. The containers.conf is the one docs/operations/containers.md gives for hosts
whose defaults fail (runc, cgroupfs, a file events logger, nofile limits a root without
CAP_SYS_RESOURCE may set).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.execution.containers import ContainerRuntime
from tests.support import require_system

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "id", "sleep", "echo", "env", "true", "touch", "trap", "mkdir")


def require_containers() -> None:
    """Skip (fail under ``SHOAL_REQUIRE_SYSTEM_TESTS=1``) where the container tests cannot run."""
    require_system(shutil.which("podman") is not None, "podman is not installed")
    require_system(shutil.which("docker-registry") is not None, "docker-registry is not installed")
    require_system(BUSYBOX.is_file(), "busybox-static (/bin/busybox) is not installed")
    require_system(os.geteuid() == 0, "the container tests run podman as root")


@dataclass(frozen=True)
class Registry:
    address: str
    """``127.0.0.1:PORT``."""
    image: str
    """The busybox image pushed there (``127.0.0.1:PORT/shoal/bb:1``)."""
    conf: Path


def runtime(root: Path, registry: Registry) -> ContainerRuntime:
    """A podman of its own under ``root``, trusting the test registry over plain HTTP."""
    podman = shutil.which("podman", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert podman is not None
    return ContainerRuntime("podman", podman, registry.conf, root, (registry.address,))


def podman(rt: ContainerRuntime, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        rt.command(*args), capture_output=True, text=True, env=rt.env, timeout=120, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"docker-registry exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"docker-registry did not listen on 127.0.0.1:{port}")


def _rootfs(tar_path: Path) -> None:
    """A root file system of the static busybox and its applets' links."""
    with tarfile.open(tar_path, "w") as tar:
        for folder in ("bin", "tmp", "data"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    require_containers()
    base = tmp_path_factory.mktemp("registry")
    conf = base / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    port = _free_port()
    config = base / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {base / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_port(port, proc)
        address = f"127.0.0.1:{port}"
        image = f"{address}/shoal/bb:1"
        builder = runtime(base / "builder", Registry(address, image, conf))
        _rootfs(base / "rootfs.tar")
        podman(
            builder,
            "import",
            '--change=CMD ["/bin/sh"]',
            "--change=ENV PATH=/bin",
            str(base / "rootfs.tar"),
            image,
        )
        try:
            podman(builder, "push", "--tls-verify=false", image)
        finally:
            release(builder)
        yield Registry(address, image, conf)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def fake_dev(root: Path, names: tuple[str, ...]) -> Path:
    """Device nodes under ``root`` (clones of /dev/null: ``mknod c 1 3``), as a GPU host's."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
    return root


def release(rt: ContainerRuntime) -> None:
    """Unmount what podman left mounted under ``rt``'s storage and remove its run folder."""
    assert rt.root is not None
    root = str(rt.root)
    with open("/proc/self/mounts") as f:
        mounted = [line.split()[1] for line in f]
    for point in reversed(mounted):
        if point == root or point.startswith(root + "/"):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)
    if not rt.run_root.is_relative_to(rt.root):
        shutil.rmtree(rt.run_root, ignore_errors=True)
