#!/usr/bin/env bash
# A container job with one real GPU, through a local agent: prints `nvidia-smi -L` from inside.
#
#   sudo tools/gpu_container_check.sh            # from the repository root, after `make install`
#
# Needs root, podman and an NVIDIA driver (nvidia-smi) on this host; no registry: the image is
# built here from the host's own C library (what nvidia-smi links against) and imported into
# podman storage of its own under a temporary folder. One agent probes the host's real GPUs,
# finds podman, takes a job with `--gpus 1 --image ...` and runs it: the GPU reaches the
# container by CDI where the NVIDIA Container Toolkit wrote its specs (/etc/cdi, /var/run/cdi),
# else as /dev/nvidiaN with the driver's libraries. Prints the host's `nvidia-smi -L`, the
# container's (expected: one GPU, the one CUDA_VISIBLE_DEVICES names) and exits 0 when the
# container saw exactly one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" - "$@" <<'PYTHON'
from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from agent.execution.containers import DeviceView
from agent.job.jobspec import new_job_id
from agent.sandbox.localmesh import LocalMesh

CONF = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
IMAGE = "localhost/shoal-gpu-check:1"


def need(ok: bool, why: str) -> None:
    if not ok:
        sys.exit(f"gpu_container_check: {why}")


need(os.geteuid() == 0, "run it as root (podman runs the container as root here)")
need(shutil.which("podman") is not None, "podman is not installed")
smi = shutil.which("nvidia-smi")
need(smi is not None, "nvidia-smi is not installed: no NVIDIA driver here")
print("host:", subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip())
print("CDI specs:", "yes" if DeviceView().has_cdi() else "no (device nodes and libraries)")

work = Path(tempfile.mkdtemp(prefix="shoal-gpu-", dir="/tmp"))
code = 1
root = work / "p"
config = work / "agent.toml"
lines = ['container_runtime = "podman"', f'container_root = "{root}"']
if shutil.which("runc") is not None:  # runc and cgroupfs: what works on most hosts
    (work / "containers.conf").write_text(CONF)
    lines.append(f'containers_conf = "{work / "containers.conf"}"')
config.write_text("\n".join(lines) + "\n")


class RealMesh(LocalMesh):
    """One agent on this host's real devices (the local mesh without --sim)."""

    def command(self, agent):  # type: ignore[no-untyped-def]
        argv = super().command(agent)
        i = argv.index("--sim")
        del argv[i : i + 4]  # --sim PROFILE --sim-seed N
        return argv


try:
    # The image: the host's C library and loader (nvidia-smi itself, and libnvidia-ml, come in
    # through CDI or the agent's read-only mounts).
    deps = subprocess.run(["ldd", smi], capture_output=True, text=True).stdout
    files = {p for p in re.findall(r"(/\S+)", deps) if "nvidia" not in p}
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        for path in sorted(files):
            real = os.path.realpath(path)
            tar.add(real, path.lstrip("/"))
        for folder in ("usr/bin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if len(lines) > 2:
        env["CONTAINERS_CONF"] = str(work / "containers.conf")
    podman = ["podman", f"--root={root / 'storage'}", f"--runroot={root / 'run'}"]
    subprocess.run(
        [*podman, "import", "--change=ENV PATH=/usr/bin:/bin", str(work / "rootfs.tar"), IMAGE],
        check=True,
        env=env,
        capture_output=True,
    )
    mesh = RealMesh(
        work, 1, profiles=("real",), extra_args=("--config", str(config), "--job-user", "")
    )
    with mesh:
        asyncio.run(mesh.wait_converged(timeout_s=60))
        agent = mesh.agents[0].address
        cli = [sys.executable, "-m", "agent.cli"]
        common = ["--agent", agent, "--identity", str(work / "cluster")]
        job_id = new_job_id()
        subprocess.run(
            [*cli, "submit", *common, "--gpus", "1", "--image", IMAGE, "--job-id", job_id,
             "--", "nvidia-smi", "-L"],
            check=True,
        )
        followed = subprocess.run(
            [*cli, "logs", *common, "-f", job_id], capture_output=True, text=True, timeout=300
        )
        print("container:")
        print(followed.stdout)
        seen = re.findall(r"^GPU \d+:", followed.stdout, flags=re.M)
        print(f"the container saw {len(seen)} GPU(s)")
        code = 0 if len(seen) == 1 else 1
finally:
    subprocess.run(["umount", "-l", str(root / "storage/overlay")], capture_output=True)
    shutil.rmtree(work, ignore_errors=True)
sys.exit(code)
PYTHON
