"""A full disk under an agent's data folder (a real one: a small tmpfs mounted there) loses no
acknowledged job. While it is full, every submission anywhere is acknowledged or refused with a
reason (503, or 507 from the full agent), never a 500; once there is room again and the agent has
restarted, every job acknowledged before or during the fill ends, as every agent sees it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from tests.agent.agents import Mesh, spec
from tests.support import require_system

pytestmark = [pytest.mark.slow, pytest.mark.system]

NAP = [sys.executable, "-c", "import time; time.sleep(2); print('done')"]


def _tmpfs_mountable(probe: Path) -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "mounting a tmpfs needs root"
    probe.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return False, f"mount -t tmpfs failed: {done.stderr.strip()}"
    subprocess.run(["umount", str(probe)], check=True)
    return True, ""


def small_disk_mesh(tmp_path: Path, profiles: list[str], size: str) -> Iterator[Mesh]:
    """A mesh whose agent 0 keeps its data folder on a tmpfs of ``size`` that the test mounts
    (the disk a test fills is its own), started; stopped and unmounted afterwards."""
    ok, why = _tmpfs_mountable(tmp_path / "probe")
    require_system(ok, why)
    m = Mesh(tmp_path, profiles)
    folder = m.agents[0].directory
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        shutil.copytree(kept, folder, dirs_exist_ok=True)
        m.start_all()
        yield m
    finally:
        m.stop_all()
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    yield from small_disk_mesh(tmp_path, ["h100:1", "l4:1", "mi300x:1"], "8m")


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        try:
            for _ in range(10_000):  # bounded: 640 MiB, far beyond the tmpfs
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert "No space" in str(exc), exc
            return filler
    raise AssertionError("the tmpfs never filled")


def _submit(mesh: Mesh, via: int) -> tuple[str, int, dict[str, object]]:
    job_id = new_job_id()
    status, answer = mesh.command(
        mesh.agents[via], "submit", {"job_id": job_id, "spec": spec(NAP, gpus=0)}
    )
    return job_id, status, answer


def test_a_full_data_folder_loses_no_acknowledged_job(mesh: Mesh) -> None:
    full = mesh.agents[0]
    acked = []
    for via in (0, 1, 2, 0):
        job_id, status, answer = _submit(mesh, via)
        assert status == 200, answer
        acked.append(job_id)
    filler = _fill(full.directory)
    refused = 0
    for via in (0, 1, 2) * 3:
        job_id, status, answer = _submit(mesh, via)
        assert status in (200, 503, 507), (status, answer)
        if status == 200:
            acked.append(job_id)
        else:
            refused += 1
            assert "full" in str(answer) or "replica" in str(answer), answer
    assert refused, "a full agent is owner or replica of some of nine jobs"
    assert mesh.get(full, "/healthz")["ok"] is True  # it stays up, and says so
    filler.unlink()
    assert mesh.terminate(0) == 0
    mesh.start(0)
    mesh.wait_converged()
    for job_id in acked:
        for a in mesh.agents:
            mesh.wait(
                f"job {job_id[:8]} succeeded on agent {a.index}",
                lambda a=a, j=job_id: mesh.job(a, j)["state"] == "succeeded",
                deadline_s=60,
            )
