"""An air-gapped fleet moves images between members: a job's image no registry serves, held by
one agent's podman, is exported there into its content store, moved to the runner chunk by chunk
and loaded into the runner's own podman; the job runs in it. Real podman, no registry at all."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.execution.containers import ContainerRuntime
from agent.job.jobspec import Resources, new_job_id
from tests.agent.agents import Mesh, spec
from tests.agent.containerkit import (
    CONTAINERS_CONF,
    Registry,
    _rootfs,
    podman,
    registry,
    release,
    require_containers,
    runtime,
)
from tests.agent.test_attacks import metric

pytestmark = pytest.mark.slow
__all__ = ["registry"]

IMAGE = "localhost/shoal/air:1"
BIG_GPU = Resources(gpus_per_node=1, min_mem_per_gpu_bytes=40 << 30)
"""Fits the H100 agent only: the job runs where the image is not."""


def own_runtime(root: Path, conf: Path) -> ContainerRuntime:
    program = shutil.which("podman", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert program is not None
    return ContainerRuntime("podman", program, conf, root, ())


def test_an_image_no_registry_serves_moves_from_the_member_that_holds_it(tmp_path: Path) -> None:
    require_containers()
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    roots = [tmp_path / f"podman-{i}" for i in range(2)]
    configs = []
    for i, root in enumerate(roots):
        path = tmp_path / f"agent-{i}.toml"
        path.write_text(
            f'container_runtime = "podman"\ncontainers_conf = "{conf}"\ncontainer_root = "{root}"\n'
        )
        configs.append(path)
    holder = own_runtime(roots[1], conf)
    _rootfs(tmp_path / "rootfs.tar")
    podman(holder, "import", "--change=ENV PATH=/bin", str(tmp_path / "rootfs.tar"), IMAGE)
    mesh = Mesh(tmp_path, ["h100:1", "l4:1"], extra=("--config", str(configs[0])))
    shared = mesh.local.command

    def own_config(agent: object) -> Sequence[str]:
        argv = shared(agent)  # type: ignore[arg-type]
        argv[argv.index(str(configs[0]))] = str(configs[agent.index])  # type: ignore[attr-defined]
        return argv

    mesh.local.command = own_config  # type: ignore[method-assign,assignment]
    mesh.start_all()
    try:
        runner, keeper = mesh.agents
        job_id = new_job_id()
        # busybox's image has no /etc/os-release: the job ran in it, not on the host
        argv = ["sh", "-c", "test ! -e /etc/os-release && echo ran-in-image"]
        body = {"job_id": job_id, "spec": spec(argv, image=IMAGE, resources=BIG_GPU)}
        assert mesh.command(runner, "submit", body)[0] == 200
        mesh.wait(
            "the job to end",
            lambda: mesh.job(runner, job_id)["state"] in ("succeeded", "failed"),
            180.0,
        )
        log = mesh.request(runner, "GET", f"/v1/jobs/{job_id}/logs?lines=50")[1].decode()
        job = mesh.job(runner, job_id)
        assert job["state"] == "succeeded", (job, log, mesh.logs())
        assert "ran-in-image" in log, log
        assert metric(mesh, runner, "shoal_image_pulls_total", what="peer") == 1
        assert metric(mesh, keeper, "shoal_image_pulls_total", what="exported") == 1

        # Each node gossips the images it holds: the mesh sees both copies.
        def gossiped() -> bool:
            nodes = mesh.get(runner, "/v1/nodes")["nodes"]
            return all(
                any(h["kind"] == "image" and h["name"] == IMAGE for h in n.get("content", []))
                for n in nodes
            )

        mesh.wait("both copies gossiped", gossiped, 60.0)
        # The archive is content now: both stores list it, as kind image.
        for a in (runner, keeper):
            doc = mesh.get(a, "/v1/cache")
            images = [i for i in doc["items"] if i["kind"] == "image"]
            assert [i["name"] for i in images] == [IMAGE], json.dumps(doc)
            assert images[0]["held_bytes"] == images[0]["total_bytes"] > 1 << 20
    finally:
        mesh.stop_all()
        for root in roots:
            if root.exists():
                release(own_runtime(root, conf))


def test_an_image_pulled_from_a_registry_is_gossiped_as_held(
    tmp_path: Path, registry: Registry
) -> None:
    """The runner pulled the job's image: the mesh learns the node holds it (its id and size),
    so the policy counts it present there and a peer may ask that node for it."""
    config = tmp_path / "containers.toml"
    config.write_text(
        f'container_runtime = "podman"\ncontainers_conf = "{registry.conf}"\n'
        f'container_root = "{tmp_path / "podman"}"\n'
        f'insecure_registries = ["{registry.address}"]\n'
    )
    mesh = Mesh(tmp_path, ["h100:1", "l4:1"], extra=("--config", str(config)))
    mesh.start_all()
    try:
        runner = mesh.agents[0]
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec(["true"], image=registry.image, resources=BIG_GPU)}
        assert mesh.command(mesh.agents[1], "submit", body)[0] == 200

        def listed() -> bool:
            nodes = {n["node_id"]: n for n in mesh.get(mesh.agents[1], "/v1/nodes")["nodes"]}
            held = nodes[runner.node_id].get("content", [])
            return any(h["kind"] == "image" and h["name"] == registry.image for h in held)

        mesh.wait("the pulled image gossiped", listed, 120.0)
        mesh.wait(
            "the job to end",
            lambda: mesh.job(runner, job_id)["state"] in ("succeeded", "failed"),
            60.0,
        )
        assert mesh.job(runner, job_id)["state"] == "succeeded"
    finally:
        mesh.stop_all()
        release(runtime(tmp_path / "podman", registry))


def test_a_waiting_jobs_image_is_pulled_on_its_forecast_node_before_its_slot_frees(
    tmp_path: Path, registry: Registry
) -> None:
    config = tmp_path / "containers.toml"
    config.write_text(
        f'container_runtime = "podman"\ncontainers_conf = "{registry.conf}"\n'
        f'container_root = "{tmp_path / "podman"}"\n'
        f'insecure_registries = ["{registry.address}"]\n'
    )
    mesh = Mesh(tmp_path, ["h100:1"], extra=("--config", str(config)))
    mesh.start_all()
    try:
        (a,) = mesh.agents
        blocker = new_job_id()
        body = {"job_id": blocker, "spec": spec(["sleep", "300"], resources=BIG_GPU)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait("the blocker running", lambda: mesh.job(a, blocker)["state"] == "running")
        job_id = new_job_id()
        body = {"job_id": job_id, "spec": spec(["true"], image=registry.image, resources=BIG_GPU)}
        assert mesh.command(a, "submit", body)[0] == 200
        mesh.wait(
            "the image pre-pulled while the job waits",
            lambda: metric(mesh, a, "shoal_image_pulls_total", what="prefetched") == 1,
            120.0,
        )
        assert mesh.job(a, job_id)["state"] == "pending"
        assert mesh.command(a, "cancel", {"job_id": blocker})[0] == 200
        mesh.wait(
            "the job to end",
            lambda: mesh.job(a, job_id)["state"] in ("succeeded", "failed"),
            120.0,
        )
        assert mesh.job(a, job_id)["state"] == "succeeded"
        # It found its image held: pulled once, by the pre-pull.
        assert metric(mesh, a, "shoal_image_pulls_total", what="registry") == 1
        assert metric(mesh, a, "shoal_image_pulls_total", what="present") == 1
    finally:
        mesh.stop_all()
        release(runtime(tmp_path / "podman", registry))
