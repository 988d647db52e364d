"""Pinning variables for each vendor, Shoal's job variables, gang ranks, refused grants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.execution.pinning import GangRank, device_env, job_env
from agent.job.envnames import reserved_env
from probers.records import DeviceStatic

JOB = "0f9c6c1e2b8d4a7f9e3c5b1a2d4f6e8c"


def nvidia(index: int, uuid: str | None) -> DeviceStatic:
    return DeviceStatic(
        key=uuid or f"pci:0000:0{index}:00.0",
        vendor="nvidia",
        backend="cuda",
        name="NVIDIA H100 80GB HBM3",
        source="nvml",
        vendor_index=index,
        uuid=uuid,
    )


def amd(index: int) -> DeviceStatic:
    return DeviceStatic(
        key=f"drm:card{index + 1}",
        vendor="amd",
        backend="rocm",
        name="AMD Instinct MI300X",
        source="amdgpu-sysfs",
        vendor_index=index,
    )


def intel(index: int) -> DeviceStatic:
    return DeviceStatic(
        key=f"drm:card{index}",
        vendor="intel",
        backend="xpu",
        name="Intel Arc A770",
        source="xe-sysfs",
        vendor_index=index,
    )


APPLE = DeviceStatic(
    key="metal:4294968372",
    vendor="apple",
    backend="metal",
    name="Apple M2 Ultra",
    source="metal",
    unified_memory=True,
)

U2 = "GPU-8f5b2a61-3c4d-4e5f-9a0b-1c2d3e4f5a6b"
U5 = "GPU-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"


def test_nvidia_by_uuid_in_enumeration_order() -> None:
    env = device_env([nvidia(5, U5), nvidia(2, U2)])
    assert env == {
        "CUDA_VISIBLE_DEVICES": f"{U2},{U5}",
        "SHOAL_DEVICES": f"{U2},{U5}",
        "SHOAL_DEVICE_MODELS": "h100,h100",
        "SHOAL_GPUS": "2",
    }


def test_nvidia_without_uuid_falls_back_to_index() -> None:
    env = device_env([nvidia(3, None)])
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["SHOAL_DEVICES"] == "pci:0000:03:00.0"


def test_amd_hip_indices_are_relative_to_rocr() -> None:
    env = device_env([amd(3), amd(2)])
    assert env == {
        "ROCR_VISIBLE_DEVICES": "2,3",
        "HIP_VISIBLE_DEVICES": "0,1",
        "SHOAL_DEVICES": "drm:card3,drm:card4",
        "SHOAL_DEVICE_MODELS": "mi300x,mi300x",
        "SHOAL_GPUS": "2",
    }


def test_intel_affinity_mask() -> None:
    env = device_env([intel(1)])
    assert env == {
        "ZE_AFFINITY_MASK": "1",
        "SHOAL_DEVICES": "drm:card1",
        "SHOAL_DEVICE_MODELS": "arc-a770",
        "SHOAL_GPUS": "1",
    }


def test_metal_and_no_devices_pin_nothing() -> None:
    assert device_env([APPLE]) == {
        "SHOAL_DEVICES": "metal:4294968372",
        "SHOAL_DEVICE_MODELS": "m2-ultra",
        "SHOAL_GPUS": "1",
    }
    assert device_env([]) == {}


def test_device_models_are_the_policy_s_names_for_them() -> None:
    """A simulated device, a name the catalog lacks, and a CPU device, as the policy names them."""
    sim = DeviceStatic(
        key="sim:a:0", vendor="nvidia", backend="cuda", name="NVIDIA L4 (simulated)", source="sim"
    )
    odd = replace(sim, key="sim:a:1", name="Mystery Accelerator 9000", vendor_index=1)
    assert device_env([sim, odd])["SHOAL_DEVICE_MODELS"] == "l4,Mystery Accelerator 9000"
    cpu = DeviceStatic(key="cpu", vendor="cpu", backend="cpu", name="AMD EPYC 9654", source="cpu")
    assert device_env([cpu])["SHOAL_DEVICE_MODELS"] == "cpu"


def test_mixed_vendors_are_refused() -> None:
    with pytest.raises(ValueError, match="several vendors: amd, nvidia"):
        device_env([nvidia(0, U2), amd(0)])


def test_the_same_device_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="same device twice"):
        device_env([amd(1), amd(1)])


def test_job_env_without_gang() -> None:
    env = job_env([amd(0)], job_id=JOB, attempt=2, checkpoint_dir="/srv/ckpt")
    assert env == {
        "CUDA_VISIBLE_DEVICES": "-1",  # NVIDIA GPUs hidden from a job given an AMD one
        "ROCR_VISIBLE_DEVICES": "0",
        "HIP_VISIBLE_DEVICES": "0",
        "SHOAL_DEVICES": "drm:card1",
        "SHOAL_DEVICE_MODELS": "mi300x",
        "SHOAL_GPUS": "1",
        "SHOAL_JOB_ID": JOB,
        "SHOAL_ATTEMPT": "2",
        "SHOAL_CHECKPOINT_DIR": "/srv/ckpt",
    }
    for name in GANG_VARS:
        assert name not in env


def test_job_env_for_one_rank_of_a_gang() -> None:
    gang = GangRank(rank=3, world_size=4, local_rank=0, master_addr="10.0.0.7", master_port=29500)
    env = job_env([nvidia(0, U2)], job_id=JOB, attempt=1, gang=gang)
    assert env["RANK"] == "3"
    assert env["WORLD_SIZE"] == "4"
    assert env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "10.0.0.7"
    assert env["MASTER_PORT"] == "29500"
    assert env["CUDA_VISIBLE_DEVICES"] == U2
    assert "SHOAL_CHECKPOINT_DIR" not in env


def test_a_gang_member_is_one_process_on_its_node() -> None:
    gang = GangRank.one_per_node(1, 2, "10.0.0.7", 29500)
    env = job_env([nvidia(0, U2)], job_id=JOB, attempt=3, gang=gang)
    assert {k: env[k] for k in env if k in GANG_VARS} == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": "1",
        "NNODES": "2",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29500",
    }


GANG_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"local_world_size": 1, "local_rank": 1}, "local_rank 1 is outside"),
        ({"node_rank": 2, "nnodes": 2}, "node_rank 2 is outside 0..1"),
        ({"rank": 4, "world_size": 4}, "rank 4 is outside 0..3"),
        ({"rank": -1}, "rank -1 is outside"),
        ({"world_size": 0, "rank": 0}, "world_size must be at least 1"),
        ({"master_port": 70000}, "not a TCP port"),
        ({"master_addr": ""}, "master_addr must not be empty"),
        ({"local_rank": -1}, "local_rank must not be negative"),
    ],
)
def test_bad_gang_ranks(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "rank": 0,
        "world_size": 2,
        "local_rank": 0,
        "master_addr": "10.0.0.7",
        "master_port": 29500,
    }
    with pytest.raises(ValueError, match=message):
        GangRank(**{**base, **kwargs})  # type: ignore[arg-type]


def test_attempts_start_at_one() -> None:
    with pytest.raises(ValueError, match="attempt numbers start at 1"):
        job_env([], job_id=JOB, attempt=0)


def test_vendors_without_devices_are_hidden() -> None:
    """CUDA: an invalid index hides all; ROCr: set but empty; HIP: an invalid index. Level Zero
    has no such value (see agent.execution.pinning), so Intel GPUs cannot be hidden by variable."""
    nvidia_job = job_env([nvidia(0, U2)], job_id=JOB, attempt=1)
    assert nvidia_job["CUDA_VISIBLE_DEVICES"] == U2
    assert (nvidia_job["ROCR_VISIBLE_DEVICES"], nvidia_job["HIP_VISIBLE_DEVICES"]) == ("", "-1")
    assert "ZE_AFFINITY_MASK" not in nvidia_job
    intel_job = job_env([intel(1)], job_id=JOB, attempt=1)
    assert intel_job["ZE_AFFINITY_MASK"] == "1"
    assert intel_job["CUDA_VISIBLE_DEVICES"] == "-1"
    assert (intel_job["ROCR_VISIBLE_DEVICES"], intel_job["HIP_VISIBLE_DEVICES"]) == ("", "-1")
    cpu_job = job_env([], job_id=JOB, attempt=1)
    assert cpu_job["CUDA_VISIBLE_DEVICES"] == "-1"
    assert (cpu_job["ROCR_VISIBLE_DEVICES"], cpu_job["HIP_VISIBLE_DEVICES"]) == ("", "-1")
    apple_job = job_env([APPLE], job_id=JOB, attempt=1)
    assert apple_job["CUDA_VISIBLE_DEVICES"] == "-1"


def test_an_amd_job_hides_nvidia_and_hip_still_sees_its_grant() -> None:
    env = job_env([amd(2), amd(5)], job_id=JOB, attempt=1)
    assert env["CUDA_VISIBLE_DEVICES"] == "-1"
    # HIP reads HIP_VISIBLE_DEVICES when it is not empty, so the hidden CUDA list is not used.
    assert env["HIP_VISIBLE_DEVICES"] == "0,1" and env["ROCR_VISIBLE_DEVICES"] == "2,5"


def test_nvidia_indices_come_with_the_pci_order() -> None:
    assert device_env([nvidia(3, None)])["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER" not in device_env([nvidia(3, U2)])


def test_reserved_names() -> None:
    assert reserved_env("CUDA_VISIBLE_DEVICES") == "env CUDA_VISIBLE_DEVICES is set by Shoal"
    assert reserved_env("Shoal_Job_Id") == "env Shoal_Job_Id is set by Shoal"
    assert reserved_env("NCCL_DEBUG") is None
