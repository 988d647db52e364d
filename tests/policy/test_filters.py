"""Every hard filter: what a device or a node must be for a job to run there at all."""

from __future__ import annotations

import dataclasses

import pytest

from agent.policy.filters import (
    affinity_filter,
    arch_filter,
    backend_filter,
    compute_capability_filter,
    cost_filter,
    device_reason,
    drain_filter,
    health_filter,
    host_filter,
    memory_filter,
    model_filter,
    node_reason,
    os_filter,
    static_fit,
)
from tests.policy.helpers import GIB, job, node

A100 = node("a100-01", "a100-80gb", 2).devices[0]
RX = node("rx-01", "rx-7900-xtx", 1, link=None).devices[0]


@pytest.mark.parametrize(
    ("check", "fits", "refused", "reason"),
    [
        (
            backend_filter,
            job("j", backends=("cuda",)),
            job("j", backends=("rocm",)),
            "backend rocm",
        ),
        (model_filter, job("j", models=("a100-80gb",)), job("j", models=("h100",)), "model h100"),
        (
            memory_filter,
            job("j", min_mem_per_gpu_bytes=80 * GIB),
            job("j", min_mem_per_gpu_bytes=81 * GIB),
            "81 GiB per GPU",
        ),
        (
            compute_capability_filter,
            job("j", min_compute_capability="8.0"),
            job("j", min_compute_capability="9.0"),
            "compute capability >= 9.0",
        ),
        (arch_filter, job("j", archs=("ampere",)), job("j", archs=("hopper",)), "arch hopper"),
    ],
)
def test_device_filters(check, fits, refused, reason) -> None:  # type: ignore[no-untyped-def]
    assert check(fits, A100) is None
    assert check(refused, A100) == reason


def test_share_memory_must_fit_the_device() -> None:
    assert memory_filter(job("j", share_mem_bytes=20 * GIB), RX) is None
    assert memory_filter(job("j", share_mem_bytes=30 * GIB), RX) == "30 GiB per GPU"


def test_compute_capability_is_nvidia_only_and_unhealthy_devices_never_serve() -> None:
    assert compute_capability_filter(job("j", min_compute_capability="7.0"), RX) is not None
    sick = dataclasses.replace(A100, healthy=False)
    assert health_filter(job("j"), sick) == "a healthy GPU"
    assert device_reason(job("j"), sick) == "a healthy GPU"


def test_a_gpu_job_never_takes_the_cpu_device() -> None:
    cpu = dataclasses.replace(A100, backend="cpu", model="cpu")
    assert backend_filter(job("j"), cpu) == "a GPU"
    assert backend_filter(job("j", backends=("cpu",)), cpu) is None


def test_node_filters() -> None:
    n = node(
        "n1",
        "v100",
        labels={"zone": "eu-1", "team": "vision"},
        os="linux",
        cost_per_hour=3.0,
        cpu_milli_total=8000,
        host_mem_total_bytes=64 * GIB,
    )
    assert drain_filter(job("j"), dataclasses.replace(n, drain="cordoned")) is not None
    assert os_filter(job("j", os="windows"), n) == "OS windows"
    assert os_filter(job("j", os="Linux"), n) is None
    assert affinity_filter(job("j", affinity={"zone": "eu-1"}), n) is None
    assert affinity_filter(job("j", affinity={"zone": "us-1"}), n) == "label zone=us-1"
    assert affinity_filter(job("j", anti_affinity={"team": "vision"}), n) == "no label team=vision"
    assert cost_filter(job("j", max_cost_per_hour=2.0), n) == "cost <= 2/h"
    assert cost_filter(job("j", max_cost_per_hour=5.0), n) is None
    assert host_filter(job("j", cpu_milli=16000), n) == "16 CPUs"
    assert host_filter(job("j", host_mem_bytes=128 * GIB), n) == "128 GiB of host memory"
    assert node_reason(job("j"), n) is None


def test_required_interconnect_needs_enough_gpus_on_one_link_domain() -> None:
    linked = node("nv", "a100-80gb", 4)
    pcie = node("pc", "a100-80gb", 4, link="pcie")
    want = job("j", gpus_per_node=4, interconnect="nvlink")
    assert static_fit(want, linked) is None
    assert static_fit(want, pcie) == "4 GPUs linked by nvlink"
    assert static_fit(job("j", gpus_per_node=4), pcie) is None
    assert static_fit(job("j", gpus_per_node=5), linked) == "5 matching GPUs on one node"
