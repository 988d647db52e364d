"""Real agents build a job's Python environment with uv from a local wheelhouse (a wheel made
here: no network), once per node per requirements file: the first job builds it, the next with
the same file finds it (a hit) and both run with it activated; a build that fails ends the
attempt with uv's last lines as its reason."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.agent.agents import Mesh
from tests.agent.test_attacks import metric
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

WAIT_S = 120.0
REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os, sys
import shoalprobe
with open(sys.argv[1], "w") as fh:
    json.dump({"value": shoalprobe.VALUE, "prefix": sys.prefix,
               "venv": os.environ.get("VIRTUAL_ENV"), "path": os.environ["PATH"]}, fh)
"""


def find_uv() -> str:
    for candidate in (REPO / ".tools" / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.skip("no uv on this machine")


def make_wheel(folder: Path, name: str = "shoalprobe", version: str = "1.0") -> Path:
    """A pure-Python wheel of one module, ``VALUE = 42``, written by hand."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: shoal-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def ended(mesh: Mesh, job_id: str) -> dict[str, Any]:
    a = mesh.agents[0]
    mesh.wait(
        f"job {job_id[:8]} ended",
        lambda: mesh.job(a, job_id)["state"] in ("succeeded", "failed", "cancelled"),
        WAIT_S,
    )
    return mesh.job(a, job_id)


def test_an_environment_is_built_once_and_reused_and_a_failed_build_says_why(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    mesh = Mesh(tmp_path, ["l4:1"], extra=("--uv", find_uv(), "--wheelhouse", str(wheels)))
    top = tmp_path / "proj"
    top.mkdir()
    (top / "requirements.txt").write_text("shoalprobe==1.0\n")
    mesh.start_all()
    try:
        a = mesh.agents[0]
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        ids = []
        for n in range(2):
            out = tmp_path / f"probe{n}.json"
            done = shoal(
                "submit",
                *flags,
                "--json",
                "--workdir",
                str(top),
                "--python-requirements",
                "requirements.txt",
                "--",
                "python",
                "-c",
                PROBE,
                str(out),
            )
            assert done.returncode == 0, done.stderr
            job_id = json.loads(done.stdout)["job_id"]
            ids.append(job_id)
            job = ended(mesh, job_id)
            assert job["state"] == "succeeded", (job, mesh.logs())
            got = json.loads(out.read_text())
            assert got["value"] == 42
            assert got["venv"] == got["prefix"], got
            assert got["path"].startswith(got["venv"] + "/bin:"), got
        first, second = (json.loads((tmp_path / f"probe{n}.json").read_text()) for n in (0, 1))
        assert first["venv"] == second["venv"]
        assert metric(mesh, a, "shoal_env_builds_total", what="builds") == 1
        assert metric(mesh, a, "shoal_env_builds_total", what="hits") == 1

        def env_listed() -> bool:
            done = shoal("cache", *flags, "--json")
            assert done.returncode == 0, done.stderr
            (doc,) = json.loads(done.stdout)["nodes"]
            return any(i["kind"] == "env" and i["in_place"] for i in doc["items"])

        mesh.wait("the environment listed in the node's cache", env_listed, WAIT_S)

        # A requirement the wheelhouse lacks: the attempt fails with uv's own words.
        (top / "requirements.txt").write_text("shoalprobe==9.9\n")
        done = shoal(
            "submit",
            *flags,
            "--json",
            "--workdir",
            str(top),
            "--python-requirements",
            "requirements.txt",
            "--",
            "python",
            "-c",
            "pass",
        )
        assert done.returncode == 0, done.stderr
        job = ended(mesh, json.loads(done.stdout)["job_id"])
        assert job["state"] == "failed", job
        reason = job.get("reason") or ""
        assert "environment build failed" in reason and "shoalprobe" in reason, job
        assert metric(mesh, a, "shoal_env_builds_total", what="failed") >= 1
    finally:
        mesh.stop_all()


def test_a_waiting_jobs_environment_is_built_on_its_forecast_node_before_its_slot_frees(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    mesh = Mesh(tmp_path, ["h100:1"], extra=("--uv", find_uv(), "--wheelhouse", str(wheels)))
    top = tmp_path / "proj"
    top.mkdir()
    (top / "requirements.txt").write_text("shoalprobe==1.0\n")
    mesh.start_all()
    try:
        (a,) = mesh.agents
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        gpu = ["--gpus", "1", "--mem", "40GiB"]
        blocker = shoal("submit", *flags, "--json", *gpu, "--", "sleep", "300")
        assert blocker.returncode == 0, blocker.stderr
        blocker_id = json.loads(blocker.stdout)["job_id"]
        mesh.wait("the blocker running", lambda: mesh.job(a, blocker_id)["state"] == "running")
        out = tmp_path / "probe.json"
        done = shoal(
            "submit",
            *flags,
            "--json",
            *gpu,
            "--workdir",
            str(top),
            "--python-requirements",
            "requirements.txt",
            "--",
            "python",
            "-c",
            PROBE,
            str(out),
        )
        assert done.returncode == 0, done.stderr
        job_id = json.loads(done.stdout)["job_id"]
        mesh.wait(
            "the environment built while the job waits",
            lambda: metric(mesh, a, "shoal_env_builds_total", what="prebuilt") == 1,
            WAIT_S,
        )
        assert mesh.job(a, job_id)["state"] == "pending"
        assert mesh.command(a, "cancel", {"job_id": blocker_id})[0] == 200
        job = ended(mesh, job_id)
        assert job["state"] == "succeeded", (job, mesh.logs())
        assert json.loads(out.read_text())["value"] == 42
        assert metric(mesh, a, "shoal_env_builds_total", what="builds") == 1
        assert metric(mesh, a, "shoal_env_builds_total", what="hits") == 1
    finally:
        mesh.stop_all()


async def test_a_uv_lock_builds_its_environment_once(tmp_path: Path) -> None:
    """``python_env = {lock = "uv.lock"}``: ``uv sync --frozen`` from the wheelhouse; the same
    lock again is a hit; a lock changed is another environment."""
    import subprocess
    import sys

    from agent.job.jobspec import PythonEnv
    from agent.running.pyenvs import PythonEnvs

    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text(
        '[project]\nname = "proj"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
        'dependencies = ["shoalprobe==1.0"]\n'
    )
    uv = find_uv()
    lock = [uv, "lock", "--offline", "--no-index", "--find-links", str(wheels)]
    subprocess.run(lock, cwd=proj, check=True, capture_output=True, timeout=60)
    envs = PythonEnvs(tmp_path / "envs", Path(uv), wheels)
    first = await envs.prepare("j1", PythonEnv("lock", "uv.lock"), proj)
    again = await envs.prepare("j2", PythonEnv("lock", "uv.lock"), proj)
    assert first == again and (envs.counts["builds"], envs.counts["hits"]) == (1, 1)
    python = Path(first["VIRTUAL_ENV"]) / "bin" / "python"
    done = subprocess.run(
        [
            str(python),
            "-c",
            "import shoalprobe, sys; print(shoalprobe.VALUE, sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split()[0] == "42" and f"{sys.version_info[:2]}" in done.stdout
    (proj / "pyproject.toml").write_text((proj / "pyproject.toml").read_text() + "\n")
    other = await envs.prepare("j3", PythonEnv("lock", "uv.lock"), proj)
    assert other != first and envs.counts["builds"] == 2
