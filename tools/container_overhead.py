"""What a container adds to a job's start: the same job on the host and in podman, side by side.

    .venv/bin/python tools/container_overhead.py [--runs 10] [--json]

Runs as root where podman works (see docs/operations/containers.md for the containers.conf a
host may need: pass it with ``--containers-conf``). Builds a busybox image from the machine's
static busybox into podman storage of its own under a temporary folder (so the image is present:
what is measured is the start, not a pull), then starts ``sh -c 'echo ready'`` through the real
process executor, alternately on the host and in a container, on one simulated NVIDIA device,
and measures from ``start()`` to the job's first line in its log, and to its exit. Prints the
medians and the container's overhead, in milliseconds, as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.execution.containers import ContainerRuntime, DeviceView
from agent.execution.executor import ProcessExecutor
from agent.execution.launch import ExecutorConfig, Launch
from agent.job.jobspec import JobSpec, Resources, new_job_id
from probers.records import DeviceStatic

GPU = DeviceStatic(
    key="GPU-00000000-0000-0000-0000-000000000000",
    vendor="nvidia",
    backend="cuda",
    name="NVIDIA H100 (simulated)",
    source="sim",
    uuid="GPU-00000000-0000-0000-0000-000000000000",
)
IMAGE = "localhost/shoal-overhead:1"


def build_image(rt: ContainerRuntime, base: Path) -> None:
    tar_path = base / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("bin")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        tar.add("/bin/busybox", "bin/busybox")
        for applet in ("sh", "echo"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    argv = rt.command("import", "--change=ENV PATH=/bin", str(tar_path), IMAGE)
    subprocess.run(argv, env=rt.env, check=True, capture_output=True, timeout=120)


async def one(ex: ProcessExecutor, image: str | None) -> tuple[float, float]:
    spec = JobSpec(
        command=("sh", "-c", "echo ready"), image=image, resources=Resources(gpus_per_node=1)
    )
    job_id = new_job_id()
    launch = Launch.from_spec(job_id, spec, attempt=1, devices=[GPU])
    began = time.perf_counter()
    await ex.start(launch)
    first = None
    while first is None:
        if "ready" in ex.tail(job_id, 5):
            first = time.perf_counter() - began
        else:
            await asyncio.sleep(0.002)
    await ex.wait(job_id)
    return first, time.perf_counter() - began


async def main(args: argparse.Namespace) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="shoal-ovh-"))
    podman = shutil.which("podman", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if podman is None:
        raise SystemExit("podman is not installed")
    rt = ContainerRuntime("podman", podman, args.containers_conf, base / "p")
    try:
        build_image(rt, base)
        dev = base / "dev"
        dev.mkdir()
        for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
        ex = ProcessExecutor(
            ExecutorConfig(
                data_dir=base / "data",
                job_user="",
                container_runtime=rt,
                device_view=DeviceView(dev_root=dev, cdi_dirs=(), library_dirs=()),
            )
        )
        host: list[tuple[float, float]] = []
        boxed: list[tuple[float, float]] = []
        await one(ex, IMAGE)  # the first run warms podman's storage
        for _ in range(args.runs):
            host.append(await one(ex, None))
            boxed.append(await one(ex, IMAGE))
        await ex.close()
    finally:
        subprocess.run(["umount", "-l", str(base / "p/storage/overlay")], capture_output=True)
        shutil.rmtree(rt.run_root, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 1)

    return {
        "runs": args.runs,
        "host_first_line_ms_p50": ms([h[0] for h in host]),
        "container_first_line_ms_p50": ms([b[0] for b in boxed]),
        "host_exit_ms_p50": ms([h[1] for h in host]),
        "container_exit_ms_p50": ms([b[1] for b in boxed]),
        "overhead_first_line_ms_p50": ms([b[0] - h[0] for h, b in zip(host, boxed, strict=True)]),
        "overhead_first_line_ms_max": round(
            max(b[0] - h[0] for h, b in zip(host, boxed, strict=True)) * 1000, 1
        ),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--containers-conf", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object (the default)")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
