"""Jobs in containers through the real podman, pulling from a real local registry.

Skipped with the reason where podman, docker-registry or busybox-static is missing (or the tests
do not run as root); failed instead under ``SHOAL_REQUIRE_SYSTEM_TESTS=1``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from agent.execution.containers import DeviceView
from agent.execution.executor import ProcessExecutor
from agent.execution.jobuser import lookup_job_user
from agent.execution.launch import ExecutorConfig, Launch, LaunchError
from agent.execution.pinning import GangRank
from agent.job.jobspec import JobSpec, Resources, new_job_id
from probers.records import DeviceStatic
from tests.agent.agents import Mesh, spec
from tests.agent.containerkit import Registry, fake_dev, podman, registry, release, runtime

__all__ = ["registry"]

NVIDIA = tuple(
    DeviceStatic(
        key=f"GPU-{i}0000000-0000-0000-0000-000000000000",
        vendor="nvidia",
        backend="cuda",
        name="NVIDIA H100",
        source="test",
        vendor_index=i,
        uuid=f"GPU-{i}0000000-0000-0000-0000-000000000000",
    )
    for i in range(4)
)
AMD = DeviceStatic(
    key="drm:card1", vendor="amd", backend="rocm", name="MI300X", source="test", vendor_index=1
)
DEV_NODES = (
    *(f"nvidia{i}" for i in range(4)),
    "nvidiactl",
    "nvidia-uvm",
    "kfd",
    "dri/renderD128",
    "dri/renderD129",
)


@pytest.fixture
async def executor(tmp_path: Path, registry: Registry) -> AsyncIterator[ProcessExecutor]:
    config = ExecutorConfig(
        data_dir=tmp_path / "data",
        grace_s=2.0,
        job_user="nobody",
        container_runtime=runtime(tmp_path / "podman", registry),
        device_view=DeviceView(
            dev_root=fake_dev(tmp_path / "dev", DEV_NODES),
            sys_root=tmp_path / "sys",
            cdi_dirs=(tmp_path / "cdi",),
            library_dirs=(),
        ),
    )
    ex = ProcessExecutor(config)
    try:
        yield ex
    finally:
        await asyncio.wait_for(ex.close(), 30)
        assert config.container_runtime is not None
        release(config.container_runtime)


def job(registry: Registry, script: str, **spec: object) -> tuple[str, JobSpec]:
    return new_job_id(), JobSpec(command=("sh", "-c", script), image=registry.image, **spec)  # type: ignore[arg-type]


async def run(ex: ProcessExecutor, launch: Launch) -> tuple[int | None, list[str]]:
    await ex.start(launch)
    exited = await asyncio.wait_for(ex.wait(launch.job_id), 60)
    return exited.exit_code, ex.tail(launch.job_id, 100)


async def test_a_container_sees_only_its_devices_and_its_variables(
    executor: ProcessExecutor, registry: Registry
) -> None:
    job_id, spec = job(
        registry,
        "ls /dev; echo CUDA=$CUDA_VISIBLE_DEVICES; echo ROCR=$ROCR_VISIBLE_DEVICES;"
        " echo HIP=$HIP_VISIBLE_DEVICES; echo MINE=$MINE; echo JOB=$SHOAL_JOB_ID; id -u; pwd;"
        " echo RANK=$RANK/$WORLD_SIZE@$MASTER_ADDR:$MASTER_PORT; echo HOME=$HOME",
        env={"MINE": "a value with spaces = and 'quotes'"},
        resources=Resources(gpus_per_node=1),
    )
    gang = GangRank(1, 2, 0, "127.0.0.1", 29500, node_rank=1, nnodes=2)
    launch = Launch.from_spec(job_id, spec, attempt=1, devices=[NVIDIA[2]], gang=gang)
    code, lines = await run(executor, launch)
    assert code == 0, lines
    nobody = lookup_job_user("nobody")
    assert "nvidia2" in lines and "nvidiactl" in lines and "nvidia-uvm" in lines
    assert not {"nvidia0", "nvidia1", "nvidia3", "kfd"} & set(lines), lines
    assert f"CUDA={NVIDIA[2].uuid}" in lines
    assert "ROCR=" in lines and "HIP=-1" in lines
    assert "MINE=a value with spaces = and 'quotes'" in lines
    assert f"JOB={job_id}" in lines
    assert str(nobody.uid) in lines
    assert str(executor.job_dir(job_id)) in lines  # its folder, at its own path, is its cwd
    assert f"HOME={executor.job_dir(job_id)}" in lines
    assert "RANK=1/2@127.0.0.1:29500" in lines  # the gang's variables, host networking

    amd_id, amd_spec = job(registry, "ls /dev /dev/dri; echo ROCR=$ROCR_VISIBLE_DEVICES")
    launch = Launch.from_spec(amd_id, amd_spec, attempt=1, devices=[AMD])
    code, lines = await run(executor, launch)
    assert code == 0, lines
    assert "kfd" in lines and "renderD129" in lines and "renderD128" not in lines
    assert not any(line.startswith("nvidia") for line in lines), lines
    assert "ROCR=1" in lines


async def test_exit_codes_pass_through(executor: ProcessExecutor, registry: Registry) -> None:
    job_id, spec = job(registry, "echo out; echo err >&2; exit 3")
    code, lines = await run(executor, Launch.from_spec(job_id, spec, attempt=1))
    assert code == 3 and "out" in lines and "err" in lines
    assert lines[-1].startswith("[shoal] attempt 1 exited with code 3")
    missing = Launch(
        job_id=new_job_id(), attempt=1, argv=("no-such-program",), image=registry.image
    )
    code, lines = await run(executor, missing)
    # The container's init (``--init``) says it, and ends with 1 (a host job's shell: 127).
    assert code == 1 and any("failed to exec pid1" in line for line in lines), lines
    rt = executor.config.container_runtime
    assert rt is not None
    assert podman(rt, "ps", "--all", "--format={{.Names}}").strip() == ""  # none left behind


async def test_a_read_only_mount_is_read_only_and_the_job_folder_writable(
    executor: ProcessExecutor, registry: Registry, tmp_path: Path
) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    data.chmod(0o777)  # the job user may write there on the host: the mount alone forbids it
    (data / "part-0").write_text("the data\n")
    job_id, spec = job(
        registry,
        f"cat {data}/part-0; touch {data}/x && echo WROTE-DATA; touch ./mine && echo WROTE-OWN",
    )
    launch = Launch.from_spec(job_id, spec, attempt=1, read_only=[str(data)])
    code, lines = await run(executor, launch)
    assert code == 0 and "the data" in lines and "WROTE-OWN" in lines, lines
    assert "WROTE-DATA" not in lines and not (data / "x").exists()
    assert any("Read-only file system" in line for line in lines), lines
    nobody = lookup_job_user("nobody")
    assert (executor.job_dir(job_id) / "mine").stat().st_uid == nobody.uid


async def test_a_stop_sends_the_signal_then_kills_after_the_grace(
    executor: ProcessExecutor, registry: Registry
) -> None:
    # A job that ends on its signal: its own exit code.
    job_id, spec = job(
        registry, "trap 'echo got-term; exit 7' TERM; echo ready; while true; do sleep 0.1; done"
    )
    await executor.start(Launch.from_spec(job_id, spec, attempt=1))
    await _line(executor, job_id, "ready")
    exited = await asyncio.wait_for(executor.stop(job_id, grace_s=10), 60)
    assert exited is not None and (exited.exit_code, exited.cause) == (7, "cancel")
    assert "got-term" in executor.tail(job_id, 20)
    # A job that ignores it: killed once the grace is over, exit 137.
    job_id, spec = job(registry, "trap '' TERM; echo ready; while true; do sleep 0.1; done")
    await executor.start(Launch.from_spec(job_id, spec, attempt=1))
    await _line(executor, job_id, "ready")
    began = time.monotonic()
    exited = await asyncio.wait_for(executor.stop(job_id, grace_s=1.5), 60)
    assert exited is not None and exited.exit_code == 137, executor.tail(job_id, 20)
    assert time.monotonic() - began >= 1.5
    rt = executor.config.container_runtime
    assert rt is not None
    assert podman(rt, "ps", "--all", "--format={{.Names}}").strip() == ""


async def test_max_runtime_stops_a_container(executor: ProcessExecutor, registry: Registry) -> None:
    job_id, spec = job(registry, "trap '' TERM; while true; do sleep 0.1; done", max_runtime_s=1.0)
    code, lines = await run(executor, Launch.from_spec(job_id, spec, attempt=1))
    assert code == 137
    assert any("stopping (timeout)" in line for line in lines), lines


async def test_an_image_that_cannot_be_pulled_fails_the_launch_in_one_line(
    executor: ProcessExecutor, registry: Registry
) -> None:
    absent = f"{registry.address}/shoal/absent:1"
    launch = Launch(job_id=new_job_id(), attempt=1, argv=("true",), image=absent)
    with pytest.raises(LaunchError, match=f"cannot pull image {absent}") as info:
        await executor.start(launch)
    assert "\n" not in str(info.value)
    assert executor.running() == ()


async def test_a_value_that_could_inject_is_refused(
    executor: ProcessExecutor, registry: Registry, tmp_path: Path
) -> None:
    newline = Launch(
        job_id=new_job_id(), attempt=1, argv=("true",), image=registry.image, env={"X": "a\nY=b"}
    )
    with pytest.raises(LaunchError, match="line break"):
        await executor.start(newline)
    with pytest.raises(ValueError, match="starts with '-'"):
        Launch(job_id=new_job_id(), attempt=1, argv=("true",), image="--privileged")
    with pytest.raises(ValueError, match="cannot hold"):
        Launch(
            job_id=new_job_id(),
            attempt=1,
            argv=("true",),
            image=registry.image,
            read_only=("/data:/etc",),
        )
    for system in ("/", "/dev", "/sys/class", "/proc/1/root/.."):
        with pytest.raises(ValueError, match="is not given the host's"):
            Launch(
                job_id=new_job_id(),
                attempt=1,
                argv=("x",),
                image=registry.image,
                read_only=(system,),
            )
    (tmp_path / "devices").symlink_to("/dev")  # through a link too
    host_dev = JobSpec(
        command=("true",), image=registry.image, checkpoint_dir=str(tmp_path / "devices")
    )
    with pytest.raises(LaunchError, match="is not given the host's /dev"):
        await executor.start(Launch.from_spec(new_job_id(), host_dev, attempt=1))


async def test_a_restarted_executor_removes_what_a_dead_agent_left(
    executor: ProcessExecutor, registry: Registry
) -> None:
    rt = executor.config.container_runtime
    assert rt is not None
    job_id, spec = job(registry, "echo ready; while true; do sleep 0.1; done")
    started = await executor.start(Launch.from_spec(job_id, spec, attempt=1))
    await _line(executor, job_id, "ready")
    # The agent dies: its client goes (SIGKILL), the container would run on.
    assert started.pgid is not None
    os.killpg(started.pgid, signal.SIGKILL)
    names = podman(rt, "ps", "--format={{.Names}}").split()
    exited = await asyncio.wait_for(executor.wait(job_id), 60)
    assert exited.exit_code is None or exited.exit_code != 0
    assert podman(rt, "ps", "--all", "--format={{.Names}}").strip() == "", names
    # Left by a run that died before it could clean up: the next run removes it.
    podman(
        rt,
        "run",
        "-d",
        f"--name=shoal-{executor.container_key}-{job_id}-2",
        f"--label=io.shoal.agent={executor.container_key}",
        registry.image,
        "sleep",
        "600",
    )
    (executor.containers_folder / f"shoal-{executor.container_key}-{job_id}-2.env").write_text("")
    again = ProcessExecutor(replace(executor.config))
    assert podman(rt, "ps", "--all", "--format={{.Names}}").strip() == ""
    await again.close()


async def _line(ex: ProcessExecutor, job_id: str, text: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if text in ex.tail(job_id, 50):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no line {text!r} in {ex.tail(job_id, 50)}")


# -- real agents -----------------------------------------------------------------------------------


def _agents_config(tmp_path: Path, registry: Registry) -> Path:
    config = tmp_path / "containers.toml"
    config.write_text(
        f'container_runtime = "podman"\ncontainers_conf = "{registry.conf}"\n'
        f'container_root = "{tmp_path / "podman"}"\n'
        f'insecure_registries = ["{registry.address}"]\n'
    )
    return config


@pytest.mark.slow
def test_an_agent_pulls_and_runs_a_job_in_its_image(tmp_path: Path, registry: Registry) -> None:
    config = _agents_config(tmp_path, registry)
    mesh = Mesh(tmp_path, ["h100:2"], extra=("--config", str(config)))
    mesh.start_all()
    try:
        (a,) = mesh.agents
        node = mesh.get(a, "/v1/nodes")["nodes"][0]
        assert node["container_runtime"] == "podman" and "image" in node["features"]
        assert "container_runtime" not in node["labels"]
        job_id = new_job_id()
        script = "echo CUDA=$CUDA_VISIBLE_DEVICES; echo GPUS=$SHOAL_GPUS; cat /etc/os-release"
        body = {"job_id": job_id, "spec": spec(["sh", "-c", script], image=registry.image)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("the job to end", lambda: mesh.job(a, job_id)["state"] in ("succeeded", "failed"))
        log = mesh.request(a, "GET", f"/v1/jobs/{job_id}/logs?lines=50")[1].decode()
        # busybox's image has no /etc/os-release: the job ran in it, not on the host.
        assert mesh.job(a, job_id)["state"] == "failed", log
        assert "CUDA=GPU-" in log and "GPUS=1" in log and "No such file" in log, log
    finally:
        mesh.stop_all()
        release(runtime(tmp_path / "podman", registry))


@pytest.mark.slow
def test_an_agent_killed_under_a_container_job_loses_it_not(
    tmp_path: Path, registry: Registry
) -> None:
    config = _agents_config(tmp_path, registry)
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"], extra=("--config", str(config)))
    mesh.start_all()
    try:
        a, b = mesh.agents
        mesh.command(a, "drain", {"node": a.node_id, "grace_s": 0})
        mesh.wait(
            "b to see a drained",
            lambda: (
                {n["node_id"]: n for n in mesh.get(b, "/v1/nodes")["nodes"]}[a.node_id]["drain"]
                == "drained"
            ),
        )
        job_id = new_job_id()
        ticker = "while true; do echo tick $SHOAL_ATTEMPT; sleep 0.1; done"
        body = {"job_id": job_id, "spec": spec(["sh", "-c", ticker], image=registry.image)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("running on b", lambda: mesh.job(a, job_id)["runner"] == b.node_id)
        rt = runtime(tmp_path / "podman", registry)
        mesh.wait("its container up", lambda: f"{job_id}-1" in podman(rt, "ps"))
        mesh.kill(mesh.node_index(b.node_id))
        # Its output was the dead agent's pipe: the job ends at its next line.
        mesh.wait("attempt 1's container gone", lambda: f"{job_id}-1" not in podman(rt, "ps"))
        mesh.start(mesh.node_index(b.node_id))
        mesh.command(a, "undrain", {"node": a.node_id})
        mesh.wait(
            "the lost job requeued and running again",
            lambda: (j := mesh.job(a, job_id))["state"] == "running" and j["attempt"] >= 2,
            deadline_s=60,
        )
        names = podman(rt, "ps", "--all", "--format={{.Names}}").split()
        assert not any(n.endswith(f"{job_id}-1") for n in names), names
    finally:
        mesh.stop_all()
        release(runtime(tmp_path / "podman", registry))
