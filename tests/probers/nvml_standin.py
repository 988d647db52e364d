"""A stand-in for the NVML library, driven by values captured on a real host.

It replaces the functions of the real ``pynvml`` module (nvidia-ml-py), so the prober under test
sees the real constants, the real ctypes structures and the real ``NVMLError`` subclasses:
``pynvml.NVMLError(code)`` builds the matching subclass (``NVMLError_NotSupported``, ...) through
the module's own ``NVMLError.__new__``. Any NVML function the stand-in does not provide fails the
test loudly instead of reaching for ``libnvidia-ml``.

:func:`load_capture` reads ``tests/fixtures/nvml/a10x2-driver535-nvml-v1.json`` (2x NVIDIA A10,
driver 535.129.03, memory info v1 only). What the capture does not hold (temperature, slowdown
threshold, enforced power limit, PCI bus id, NVLink, topology, MIG) answers ``Not Supported``, as
it would on a host where NVML cannot tell, so the prober must report ``None`` for it. Tests build
variants by changing the returned :class:`StandinNvml` before calling :func:`install`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from tests.support import FIXTURES

CAPTURE = FIXTURES / "nvml" / "a10x2-driver535-nvml-v1.json"


@dataclass(frozen=True)
class Handle:
    """An opaque device handle: a GPU's index and, for a MIG device, its slot."""

    gpu: int
    mig_slot: int | None = None


@dataclass
class MigSlot:
    uuid: str
    name: str
    mem_total_bytes: int


@dataclass
class StandinGpu:
    uuid: str
    name: str
    memory_v1: tuple[int, int, int]
    """``(total, free, used)`` as nvmlDeviceGetMemoryInfo (v1) reports them."""
    power_usage_mw: int
    util_gpu_pct: int
    util_memory_pct: int
    memory_v2: tuple[int, int, int, int] | None = None
    """``(total, reserved, free, used)``; only answered when the driver has v2."""
    arch: int | None = None
    compute_capability: tuple[int, int] | None = None
    bus_id: str | None = None
    """NVML's form, e.g. ``00000000:17:00.0``."""
    temp_c: int | None = None
    temp_slowdown_c: int | None = None
    enforced_power_limit_mw: int | None = None
    mig_slots: list[MigSlot | None] | None = None
    """``None``: no MIG support. A list: MIG enabled, ``None`` entries are empty slots."""
    nvlink_count: int = 0
    nvlink_peers: dict[int, str] = field(default_factory=dict)
    """Active link index -> the remote GPU's bus id (NVML's form)."""
    nvswitch_links: set[int] = field(default_factory=set)
    nvlink_speed_mbytes: int | None = None
    lost: bool = False
    sm_clock_mhz: int | None = None
    throttle_reasons: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_kb_per_s: tuple[int, int] | None = None
    """``(rx, tx)`` as nvmlDeviceGetPcieThroughput gives them, in KB/s."""


@dataclass
class StandinNvml:
    driver_version: str
    gpus: list[StandinGpu]
    memory_v2: bool = False
    """Whether this driver has nvmlDeviceGetMemoryInfo_v2 (the capture's has not)."""
    topology: dict[tuple[int, int], int] = field(default_factory=dict)
    """``(lower index, higher index)`` -> ``NVML_TOPOLOGY_*`` level."""
    init_error: int | None = None
    calls: Counter[str] = field(default_factory=Counter)


def load_capture() -> StandinNvml:
    """The captured 2x A10 host, with nothing added but two published facts (see below)."""
    capture = json.loads(CAPTURE.read_text())
    gpus = []
    for device in capture["devices"]:
        memory = device["memory_v1"]
        gpus.append(
            StandinGpu(
                uuid=device["uuid"],
                name=device["name"],
                memory_v1=(memory["total"], memory["free"], memory["used"]),
                power_usage_mw=device["power_usage_mw"],
                util_gpu_pct=device["utilization"]["gpu"],
                util_memory_pct=device["utilization"]["memory"],
                # Not in the capture: NVIDIA's published A10 specifications give the Ampere
                # architecture (GA102) and CUDA compute capability 8.6.
                arch=pynvml.NVML_DEVICE_ARCH_AMPERE,
                compute_capability=(8, 6),
            )
        )
    return StandinNvml(driver_version=capture["driver_version"], gpus=gpus)


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def install(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> StandinNvml:
    """Point the real ``pynvml`` module's functions at ``nvml`` for the length of one test."""

    def gpu_of(handle: Handle) -> StandinGpu:
        gpu = nvml.gpus[handle.gpu]
        if gpu.lost:
            raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def mig_of(handle: Handle) -> MigSlot | None:
        gpu = gpu_of(handle)
        if handle.mig_slot is None or gpu.mig_slots is None:
            return None
        return gpu.mig_slots[handle.mig_slot]

    def known(value: Any) -> Any:
        if value is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def init() -> None:
        if nvml.init_error is not None:
            raise _fail(nvml.init_error)

    def handle_by_index(index: int) -> Handle:
        if not 0 <= index < len(nvml.gpus):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    def name(handle: Handle) -> str:
        slot = mig_of(handle)
        return slot.name if slot is not None else gpu_of(handle).name

    def uuid(handle: Handle) -> str:
        slot = mig_of(handle)
        return slot.uuid if slot is not None else gpu_of(handle).uuid

    def pci_info(handle: Handle) -> Any:
        return _pci(known(gpu_of(handle).bus_id))

    def memory_info(handle: Handle, version: int | None = None) -> Any:
        gpu = gpu_of(handle)
        slot = mig_of(handle)
        if version:
            nvml.calls["nvmlDeviceGetMemoryInfo_v2"] += 1
            if not nvml.memory_v2:
                raise _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            assert version == pynvml.nvmlMemory_v2
            memory = pynvml.c_nvmlMemory_v2_t()
            memory.version = version
            if slot is not None:
                memory.total, memory.reserved = slot.mem_total_bytes, 0
                memory.free, memory.used = slot.mem_total_bytes, 0
            else:
                total, reserved, free, used = known(gpu.memory_v2)
                memory.total, memory.reserved, memory.free, memory.used = (
                    total,
                    reserved,
                    free,
                    used,
                )
            return memory
        nvml.calls["nvmlDeviceGetMemoryInfo_v1"] += 1
        v1 = pynvml.c_nvmlMemory_t()
        if slot is not None:
            v1.total, v1.free, v1.used = slot.mem_total_bytes, slot.mem_total_bytes, 0
        else:
            v1.total, v1.free, v1.used = gpu.memory_v1
        return v1

    def utilization(handle: Handle) -> Any:
        gpu = gpu_of(handle)
        if gpu.mig_slots is not None:  # NVML has no whole-GPU utilization in MIG mode
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util_gpu_pct, gpu.util_memory_pct
        return util

    def temperature(handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(known(gpu_of(handle).temp_c))

    def temperature_threshold(handle: Handle, threshold: int) -> int:
        assert threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return int(known(gpu_of(handle).temp_slowdown_c))

    def mig_mode(handle: Handle) -> list[int]:
        known(gpu_of(handle).mig_slots)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def max_mig_count(handle: Handle) -> int:
        return len(known(gpu_of(handle).mig_slots))

    def mig_handle(handle: Handle, slot: int) -> Handle:
        slots = known(gpu_of(handle).mig_slots)
        if not 0 <= slot < len(slots) or slots[slot] is None:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, slot)

    def nvlink_gpu(handle: Handle, link: int) -> StandinGpu:
        gpu = gpu_of(handle)
        if gpu.nvlink_count == 0:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlink_count:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvlink_state(handle: Handle, link: int) -> int:
        gpu = nvlink_gpu(handle, link)
        active = link in gpu.nvlink_peers or link in gpu.nvswitch_links
        return int(pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED)

    def nvlink_remote_type(handle: Handle, link: int) -> int:
        gpu = nvlink_gpu(handle, link)
        if link in gpu.nvswitch_links:
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvlink_remote_pci(handle: Handle, link: int) -> Any:
        gpu = nvlink_gpu(handle, link)
        if link in gpu.nvswitch_links:
            return _pci("00000000:C1:00.0")  # an NVSwitch is no GPU of this host
        return _pci(known(gpu.nvlink_peers.get(link)))

    def field_values(handle: Handle, field_ids: list[int]) -> Any:
        gpu = gpu_of(handle)
        assert field_ids == [pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON]
        values = (pynvml.c_nvmlFieldValue_t * 1)()
        values[0].fieldId = field_ids[0]
        if gpu.nvlink_speed_mbytes is None:
            values[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        else:
            values[0].nvmlReturn = pynvml.NVML_SUCCESS
            values[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[0].value.uiVal = gpu.nvlink_speed_mbytes
        return values

    def common_ancestor(a: Handle, b: Handle) -> int:
        gpu_of(a), gpu_of(b)
        pair = (min(a.gpu, b.gpu), max(a.gpu, b.gpu))
        return int(known(nvml.topology.get(pair)))

    def pcie_throughput(handle: Handle, counter: int) -> int:
        rx, tx = known(gpu_of(handle).pcie_kb_per_s)
        return int(rx if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES else tx)

    functions: dict[str, Callable[..., Any]] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: nvml.driver_version,
        "nvmlDeviceGetCount": lambda: len(nvml.gpus),
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetPciInfo": pci_info,
        "nvmlDeviceGetArchitecture": lambda h: known(gpu_of(h).arch),
        "nvmlDeviceGetCudaComputeCapability": lambda h: known(gpu_of(h).compute_capability),
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetTemperatureThreshold": temperature_threshold,
        "nvmlDeviceGetPowerUsage": lambda h: gpu_of(h).power_usage_mw,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: known(gpu_of(h).enforced_power_limit_mw),
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": max_mig_count,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkRemoteDeviceType": nvlink_remote_type,
        "nvmlDeviceGetNvLinkRemotePciInfo": nvlink_remote_pci,
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetTopologyCommonAncestor": common_ancestor,
        "nvmlDeviceGetClockInfo": lambda h, clock: known(gpu_of(h).sm_clock_mhz),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: known(gpu_of(h).throttle_reasons),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: known(gpu_of(h).pcie_gen),
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: known(gpu_of(h).pcie_width),
        "nvmlDeviceGetPcieThroughput": pcie_throughput,
    }
    for fn_name, fn in functions.items():
        monkeypatch.setattr(pynvml, fn_name, _counted(nvml, fn_name, fn))

    def unexpected(c_name: str) -> Any:
        raise AssertionError(f"the NVML stand-in does not provide {c_name}")

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", unexpected)
    return nvml


def _counted(nvml: StandinNvml, fn_name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        nvml.calls[fn_name] += 1
        return fn(*args, **kwargs)

    return call


def _pci(bus_id: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id.encode()[-12:]
    return info
