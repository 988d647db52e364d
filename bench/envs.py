"""Jobs that bring their environment: images, working folders, Python environments, on loopback.

``python -m bench.envs --json`` starts real agents (``LocalMesh``: processes, mutual TLS on
127.0.0.1). The runner has one GPU; a blocker job holds it, the measured job is submitted and
waits, and the blocker ends: each start is measured from the moment the slot frees (the
blocker's last file, written as it exits) to the measured job's first file (both mtimes, on the
runner's disk). Cold: the runner lacks the image (pulled from a local registry) or the
environment (built with uv from a local wheelhouse). One JSON object:

- ``image_cold_start_s``, ``image_prefetched_start_s``: a job in a ``--image-mib`` image
  (busybox and a layer of random bytes, pushed to Debian's ``docker-registry`` on 127.0.0.1);
- ``env_cold_start_s``, ``env_prefetched_start_s``: a job with a requirements file of one wheel
  made here (no network);
- ``workdir_remote_run_s``: ``shoal submit --workdir`` of ``--workdir-mib`` MiB in
  ``--workdir-files`` files through one agent, run on the other, from the command to the job's end;
- ``container_overhead_s``: a container job's start (image held) less a host job's
  (``host_start_s``, measured the same way); ``*_prefetched_over_host_s``: a pre-fetched start
  less a host job's (the slot-frees-to-start step the scheduler adds to every job cancels).

Cold starts are measured on a free slot from the submission (no time for a pre-fetch);
pre-fetched ones after the owner's forecast had the runner pull the image or build the
environment while the job waited (the runner's ``shoal_image_pulls_total{what="prefetched"}`` or
``shoal_env_builds_total{what="prebuilt"}`` went up before the blocker ended).

The image figures are ``null`` (with ``image_skipped``) where podman, docker-registry or
busybox-static is missing or the bench does not run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from agent.job.jobspec import new_job_id
from agent.sandbox.localmesh import AgentProcess, LocalMesh
from gossip import envelope
from gossip.certtrust import CertSigner
from gossip.tls import client_context

REPO = Path(__file__).resolve().parents[1]
GPU = {"gpus_per_node": 1, "min_mem_per_gpu_bytes": 40 << 30}
"""Fits the runner (an H100) only."""
GPU_FLAGS = ("--gpus", "1", "--mem", "40GiB")
PASS = ("--", sys.executable, "-c", "pass")
CONTAINERS_CONF = (
    '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
)
APPLETS = ("sh", "touch", "true", "sleep", "cat", "echo")


class Bench:
    def __init__(self, root: Path, extra: list[str]) -> None:
        self.root = root
        self.mesh = LocalMesh(root / "mesh", 2, profiles=("h100:1", "l4:1"), extra_args=extra)
        self.mesh.create()
        assert self.mesh.operator is not None
        self.ctx = client_context(self.mesh.operator, self.mesh.operator.ca_certificate)
        self.signer = CertSigner(self.mesh.operator)

    @property
    def runner(self) -> AgentProcess:
        return self.mesh.agents[0]

    def command(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        sealed = envelope.seal(self.signer, kind, json.dumps(body).encode(), time.time())
        request = urllib.request.Request(
            f"https://{self.runner.address}/v1/commands",
            data=sealed,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(request, context=self.ctx, timeout=60) as r:
            answer: dict[str, Any] = json.loads(r.read())
            return answer

    def job(self, job_id: str) -> dict[str, Any]:
        url = f"https://{self.runner.address}/v1/jobs/{job_id}"
        try:
            with urllib.request.urlopen(url, context=self.ctx, timeout=30) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except urllib.error.HTTPError as exc:
            exc.close()  # its response holds the socket: closed here, not whenever collected
            if exc.code == 404:  # not heard of here yet (gossip carries it)
                return {}
            raise

    def submit(self, command: list[str], **extra: Any) -> str:
        job_id = new_job_id()
        spec = {"command": command, "resources": GPU, **extra}
        self.command("submit", {"job_id": job_id, "spec": spec})
        return job_id

    def ended(self, job_id: str, timeout_s: float = 300.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            doc = self.job(job_id)
            if doc.get("state") in ("succeeded", "failed", "cancelled"):
                return doc
            time.sleep(0.05)
        raise SystemExit(f"job {job_id} did not end in {timeout_s} s")

    def folder(self, job_id: str) -> Path:
        return self.runner.directory / "jobs" / job_id

    def metric(self, name: str, what: str) -> float:
        url = f"https://{self.runner.address}/metrics"
        with urllib.request.urlopen(url, context=self.ctx, timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f'{name}{{what="{what}"}} '):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def why_no_prefetch(self) -> str:
        """What the agents counted and logged about pre-fetches: said when one never came."""
        said = []
        for agent in self.mesh.agents:
            url = f"https://{agent.address}/metrics"
            try:
                with urllib.request.urlopen(url, context=self.ctx, timeout=30) as r:
                    lines = r.read().decode().splitlines()
            except OSError as exc:
                lines = [f"metrics not read: {exc}"]
            counted = [x for x in lines if x[0] != "#" and ("prefetch" in x or "image_pulls" in x)]
            said += [f"{agent.address} {x}" for x in counted]
            logged = agent.log_path.read_text(errors="replace").splitlines()
            kept = [x for x in logged if "pre-pull" in x or "prefetch" in x]
            said += [f"{agent.address} {x}" for x in kept[-20:]]
        return "\n".join(said)

    def start_on_a_free_slot(self, command: list[str], mark: str, **extra: Any) -> float:
        """Seconds from the submission, the slot free, to the job's ``mark`` file (cold: no
        time for a pre-fetch)."""
        began = time.time()
        measured = self.submit(command, **extra)
        self._succeeded(measured)
        return round((self.folder(measured) / mark).stat().st_mtime - began, 3)

    def start_after_slot_frees(
        self, command: list[str], mark: str, ready: tuple[str, str] | None = None, **extra: Any
    ) -> float:
        """Seconds from the blocker's exit to the measured job's ``mark`` file. The blocker
        holds the slot until the runner's metric ``ready`` (name, what) goes up: the waiting
        job's pre-fetch is done."""
        waiter = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.02)\n"
        blocker = self.submit([sys.executable, "-c", waiter + "open('freed', 'w').close()"])
        while self.job(blocker).get("state") != "running":
            time.sleep(0.05)
        before = self.metric(*ready) if ready is not None else 0.0
        measured = self.submit(command, **extra)
        deadline = time.monotonic() + 300
        while ready is not None and self.metric(*ready) <= before:
            if time.monotonic() > deadline:
                raise SystemExit(f"no pre-fetch ({ready}) within 300 s\n{self.why_no_prefetch()}")
            time.sleep(0.1)
        (self.folder(blocker) / "go").touch()
        for job_id in (blocker, measured):
            self._succeeded(job_id)
        freed = (self.folder(blocker) / "freed").stat().st_mtime
        return round((self.folder(measured) / mark).stat().st_mtime - freed, 3)

    def _succeeded(self, job_id: str) -> None:
        doc = self.ended(job_id)
        if doc.get("state") != "succeeded":
            raise SystemExit(f"job {job_id} ended {doc.get('state')}: {doc.get('reason')}")


def _wheel(folder: Path, name: str = "shoalbench", version: str = "1.0") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 1\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    rows = [
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
        f"{len(d)}"
        for p, d in files.items()
    ]
    files[f"{dist}/RECORD"] = ("\n".join([*rows, f"{dist}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for p, d in files.items():
            z.writestr(p, d)


def _workdir(top: Path, mib: int, files: int) -> None:
    each = (mib << 20) // files
    for i in range(files):
        path = top / f"d{i % 20:02d}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(each))


def _image_ready() -> str | None:
    for tool in ("podman", "docker-registry"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"{tool} is not installed"
    if not Path("/bin/busybox").is_file():
        return "busybox-static is not installed"
    if os.geteuid() != 0:
        return "podman runs as root here"
    return None


def _podman(root: Path, conf: Path, *args: str) -> None:
    argv = ["podman", f"--root={root / 'storage'}", f"--runroot={root / 'run'}", *args]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CONTAINERS_CONF": str(conf)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"podman {' '.join(args)}: {done.stderr.strip()[-300:]}")


def _registry(base: Path, image_mib: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A local registry holding ``127.0.0.1:PORT/bench/big:1``; the process, image and conf."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base.mkdir(parents=True, exist_ok=True)
    config = base / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {base / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.connect(("127.0.0.1", port))
            break
        time.sleep(0.05)
    conf = base / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    image = f"127.0.0.1:{port}/bench/big:1"
    rootfs = base / "rootfs.tar"
    (base / "big.bin").write_bytes(os.urandom(image_mib << 20))
    with tarfile.open(rootfs, "w") as tar:
        for folder in ("bin", "tmp"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
        tar.add("/bin/busybox", "bin/busybox")
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        tar.add(base / "big.bin", "big.bin")
    builder = base / "builder"
    _podman(builder, conf, "import", "--change=ENV PATH=/bin", str(rootfs), image)
    _podman(builder, conf, "push", "--tls-verify=false", image)
    return proc, image, conf


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"cores": os.cpu_count()}
    uv = REPO / ".tools" / "bin" / "uv"
    wheels = root / "wheels"
    _wheel(wheels)
    extra = [
        "--job-user",
        "",
        "--uv",
        str(uv if uv.exists() else shutil.which("uv")),
        "--wheelhouse",
        str(wheels),
    ]
    skipped = _image_ready()
    registry = None
    if skipped is None:
        registry, image, conf = _registry(root / "registry", args.image_mib)
        cfg = root / "containers.toml"
        cfg.write_text(
            f'container_runtime = "podman"\ncontainers_conf = "{conf}"\n'
            f'container_root = "{root / "podman"}"\n'
            f'insecure_registries = ["{image.split("/")[0]}"]\n'
        )
        extra += ["--config", str(cfg)]
    bench = Bench(root, extra)
    top = root / "proj"
    _workdir(top, args.workdir_mib, args.workdir_files)
    bench.mesh.start()
    try:
        asyncio.run(bench.mesh.wait_converged(timeout_s=60))
        host_job = [sys.executable, "-c", "open('started','w')"]
        out["host_first_start_s"] = bench.start_after_slot_frees(host_job, "started")
        host = bench.start_after_slot_frees(host_job, "started")
        out["host_start_s"] = host
        # The working folder, from the operator's machine through the other agent.
        far = bench.mesh.agents[1]
        flags = ["--agent", far.address, "--identity", str(bench.mesh.root / "cluster")]
        shoal = [sys.executable, "-m", "agent.cli"]
        began = time.monotonic()
        done = subprocess.run(
            [
                *shoal,
                "submit",
                *flags,
                "--json",
                "--workdir",
                str(top),
                "--gpus",
                "1",
                "--mem",
                "40GiB",
                "--",
                sys.executable,
                "-c",
                "pass",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"shoal submit --workdir: {done.stderr.strip()}")
        bench.ended(json.loads(done.stdout)["job_id"])
        out["workdir_remote_run_s"] = round(time.monotonic() - began, 3)
        # Python environments: cold (built on the way), then pre-built while the job waits;
        # two folders of one file each, so each has its own environment.
        digests = []
        for n in (1, 2):
            small = root / f"small{n}"
            small.mkdir()
            (small / "requirements.txt").write_text(f"shoalbench==1.0\n# folder {n}\n")
            sent = subprocess.run(
                [*shoal, "submit", *flags, "--json", "--workdir", str(small), *GPU_FLAGS, *PASS],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if sent.returncode != 0:
                raise SystemExit(f"shoal submit --workdir: {sent.stderr.strip()}")
            bench.ended(json.loads(sent.stdout)["job_id"])
            digests.append(json.loads(sent.stdout)["workdir"]["digest"])
        probe = ["python", "-c", "import shoalbench; open('../started', 'w')"]
        reqs = {"requirements": "requirements.txt"}
        out["env_cold_start_s"] = bench.start_on_a_free_slot(
            probe, "started", workdir_digest=digests[0], python_env=reqs
        )
        out["env_prefetched_start_s"] = bench.start_after_slot_frees(
            probe,
            "started",
            ("shoal_env_builds_total", "prebuilt"),
            workdir_digest=digests[1],
            python_env=reqs,
        )
        out["image_skipped"] = skipped
        for key in ("image_cold_start_s", "image_prefetched_start_s", "container_overhead_s"):
            out[key] = None
        if registry is not None:
            touch = ["touch", "started"]
            out["image_cold_start_s"] = bench.start_on_a_free_slot(touch, "started", image=image)
            held = bench.start_after_slot_frees(touch, "started", image=image)
            out["container_overhead_s"] = round(held - host, 3)
            _podman(root / "podman", conf, "rmi", image)
            out["image_prefetched_start_s"] = bench.start_after_slot_frees(
                touch, "started", ("shoal_image_pulls_total", "prefetched"), image=image
            )
            out["image_mib"] = args.image_mib
        for key in ("env_prefetched_start_s", "image_prefetched_start_s"):
            if out.get(key) is not None:
                out[key.replace("_start_s", "_over_host_s")] = round(out[key] - host, 3)
    finally:
        bench.mesh.stop(grace_s=20.0)
        if registry is not None:
            registry.terminate()
            registry.wait(timeout=10)
    out["workdir_mib"], out["workdir_files"] = args.workdir_mib, args.workdir_files
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-mib", type=int, default=200)
    parser.add_argument("--workdir-mib", type=int, default=50)
    parser.add_argument("--workdir-files", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-envs-") as tmp:
        out = run(args, Path(tmp))
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
