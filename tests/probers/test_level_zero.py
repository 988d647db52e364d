"""Level Zero Sysman prober: absence, struct layouts, pure conversions, and the call sequence
against an in-process stand-in library (ctypes callbacks with the real prototypes)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest

from probers.base import ProberUnavailable
from probers.level_zero import (
    LevelZeroProber,
    pci_bus_id_from_address,
    power_mw_from_counters,
    util_pct_from_activity,
    uuid_to_str,
)
from probers.level_zero_abi import (
    PROTOTYPES,
    ZE_RESULT_ERROR_DEVICE_LOST,
    ZE_RESULT_SUCCESS,
    ZeDeviceProperties,
    ZesDeviceProperties,
    ZesEngineProperties,
    ZesMemProperties,
    ZesMemState,
    ZesPciAddress,
    ZesPciProperties,
    ZesPowerProperties,
    ZesTempProperties,
)

# The Data Center GPU Max 1100 of the xpu-smi capture: xpu-smi prints its UUID as below.
MAX1100_UUID_BYTES = bytes([0x86, 0x80, 0xDA, 0x0B, 0x2F, 0, 0, 0, 0x29, 0, 0, 0, 0, 0, 0, 0])
MAX1100_UUID = "00000000-0000-0029-0000-002f0bda8086"


def test_no_library_is_unavailable() -> None:
    prober = LevelZeroProber(library_names=["/nonexistent/libze_loader.so.1"])
    with pytest.raises(ProberUnavailable, match="no Level Zero loader"):
        prober.discover()
    assert prober.sample() == []


def test_no_candidates_is_unavailable() -> None:
    with pytest.raises(ProberUnavailable):
        LevelZeroProber(library_names=[]).discover()


# --- pure conversions ---------------------------------------------------------------------------


def test_uuid_bytes_to_string_matches_xpu_smi() -> None:
    assert uuid_to_str(MAX1100_UUID_BYTES) == MAX1100_UUID
    assert uuid_to_str(list(range(16))) == "0f0e0d0c-0b0a-0908-0706-050403020100"
    with pytest.raises(ValueError):
        uuid_to_str(b"\x00" * 15)


def test_pci_address_to_bus_id() -> None:
    assert pci_bus_id_from_address(ZesPciAddress(0, 0x29, 0, 0)) == "0000:29:00.0"
    assert pci_bus_id_from_address(ZesPciAddress(1, 0x3A, 0x1F, 7)) == "0001:3a:1f.7"


def test_energy_counter_pair_to_milliwatts() -> None:
    # 118.87 J over 1 s: 118870 mW.
    assert power_mw_from_counters((1_000_000_000, 5_000_000), (1_118_870_000, 6_000_000)) == 118870
    # 3 J over 250 ms: 12 W.
    assert power_mw_from_counters((10, 0), (3_000_010, 250_000)) == 12000
    assert power_mw_from_counters(None, (5, 5)) is None
    assert power_mw_from_counters((10, 100), (20, 100)) is None  # no time passed
    assert power_mw_from_counters((10, 100), (5, 200)) is None  # went backwards
    assert power_mw_from_counters((10, 100), (0, 200)) is None  # counter reads 0


def test_activity_counter_pair_to_percent() -> None:
    assert util_pct_from_activity((0, 0), (250_000, 1_000_000)) == pytest.approx(25.0)
    assert util_pct_from_activity((1_000, 2_000), (1_000, 502_000)) == 0.0
    assert util_pct_from_activity((0, 0), (1_100, 1_000)) == 100.0  # clamped
    assert util_pct_from_activity(None, (1, 1)) is None
    assert util_pct_from_activity((5, 10), (6, 10)) is None


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="sizes worked out for 64-bit")
def test_struct_layouts_match_the_c_headers() -> None:
    # Worked out by hand from ze_api.h / zes_api.h with natural alignment on LP64/LLP64.
    assert ctypes.sizeof(ZeDeviceProperties) == 368
    assert ZeDeviceProperties.uuid.offset == 96
    assert ZeDeviceProperties.name.offset == 112
    assert ZeDeviceProperties.name.size == 256
    assert ZesDeviceProperties.numSubdevices.offset == 384
    assert ctypes.sizeof(ZesDeviceProperties) == 776
    assert ZesDeviceProperties.driverVersion.offset == 708
    assert ZesDeviceProperties.driverVersion.size == 64
    assert ctypes.sizeof(ZesPciProperties) == 56
    assert ctypes.sizeof(ZesMemProperties) == 48
    assert ZesMemProperties.physicalSize.offset == 32
    assert ctypes.sizeof(ZesMemState) == 40
    assert ZesMemState.size.offset == 32
    assert ctypes.sizeof(ZesPowerProperties) == 40
    assert ZesPowerProperties.defaultLimit.offset == 28
    assert ctypes.sizeof(ZesTempProperties) == 48
    assert ZesTempProperties.maxTemperature.offset == 32
    assert ctypes.sizeof(ZesEngineProperties) == 32


# --- a stand-in library ---------------------------------------------------------------------------

NPU = 0x2100
DRIVER, DEVICE, MEM, POWER, TEMP_GPU, TEMP_MEM, ENGINE_ALL, ENGINE_COMPUTE = (
    0x1000,
    0x2000,
    0x3000,
    0x4000,
    0x5001,
    0x5002,
    0x6001,
    0x6002,
)


class FakeZe:
    """Entry points with the real prototypes, answering like one Data Center GPU Max 1100."""

    def __init__(self) -> None:
        self.init_result = ZE_RESULT_SUCCESS
        self.devices = [DEVICE]
        self.lost = False
        self.energy = [(1_000_000_000, 10_000_000), (1_118_870_000, 11_000_000)]
        self.activity = [(0, 0), (250_000, 1_000_000)]
        self.calls: list[str] = []
        self._keep: list[Any] = []
        for name, argtypes in PROTOTYPES.items():
            impl = getattr(self, "_" + name)
            fn = ctypes.CFUNCTYPE(ctypes.c_uint32, *argtypes)(self._traced(name, impl))
            self._keep.append(fn)
            setattr(self, name, fn)

    def _traced(self, name: str, impl: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            self.calls.append(name)
            if self.lost and name not in ("zesInit", "zesDriverGet", "zesDeviceGet"):
                return ZE_RESULT_ERROR_DEVICE_LOST
            return impl(*args)

        return call

    @staticmethod
    def _fill(values: list[int], count: Any, handles: Any) -> int:
        if not handles:
            count[0] = len(values)
            return ZE_RESULT_SUCCESS
        for i, value in enumerate(values[: count[0]]):
            handles[i] = value
        return ZE_RESULT_SUCCESS

    def _zesInit(self, flags: int) -> int:
        return self.init_result

    def _zesDriverGet(self, count: Any, handles: Any) -> int:
        return self._fill([DRIVER], count, handles)

    def _zesDeviceGet(self, driver: int, count: Any, handles: Any) -> int:
        assert driver == DRIVER
        return self._fill(self.devices, count, handles)

    def _zesDeviceGetProperties(self, device: int, props: Any) -> int:
        p = props.contents
        assert (p.stype, p.core.stype) == (0x1, 0x3)
        if device == NPU:
            p.core.type = 5  # ZE_DEVICE_TYPE_VPU
            p.core.deviceId = 0x7D1D
            return ZE_RESULT_SUCCESS
        p.core.type = 1  # ZE_DEVICE_TYPE_GPU
        p.core.vendorId = 0x8086
        p.core.deviceId = 0x0BDA
        p.core.flags = 0
        p.core.numSlices = 1
        p.core.numSubslicesPerSlice = 56
        p.core.uuid[:] = list(MAX1100_UUID_BYTES)
        p.core.name = b"Intel(R) Data Center GPU Max 1100"
        p.modelName = b"Intel(R) Data Center GPU Max 1100"
        p.driverVersion = b"1.3.27191"
        return ZE_RESULT_SUCCESS

    def _zesDevicePciGetProperties(self, device: int, props: Any) -> int:
        props.contents.address.bus = 0x29
        return ZE_RESULT_SUCCESS

    def _zesDeviceEnumMemoryModules(self, device: int, count: Any, handles: Any) -> int:
        return self._fill([MEM], count, handles)

    def _zesMemoryGetProperties(self, mem: int, props: Any) -> int:
        props.contents.location = 1  # ZES_MEM_LOC_DEVICE
        props.contents.physicalSize = 51522830336
        return ZE_RESULT_SUCCESS

    def _zesMemoryGetState(self, mem: int, state: Any) -> int:
        state.contents.size = 51522830336
        state.contents.free = 51493543936
        return ZE_RESULT_SUCCESS

    def _zesDeviceEnumPowerDomains(self, device: int, count: Any, handles: Any) -> int:
        return self._fill([POWER], count, handles)

    def _zesDeviceGetCardPowerDomain(self, device: int, handle: Any) -> int:
        handle[0] = POWER
        return ZE_RESULT_SUCCESS

    def _zesPowerGetProperties(self, power: int, props: Any) -> int:
        props.contents.defaultLimit = 300000
        return ZE_RESULT_SUCCESS

    def _zesPowerGetEnergyCounter(self, power: int, counter: Any) -> int:
        assert power == POWER
        energy, timestamp = self.energy.pop(0)
        counter.contents.energy = energy
        counter.contents.timestamp = timestamp
        return ZE_RESULT_SUCCESS

    def _zesPowerGetLimits(self, power: int, sustained: Any, burst: Any, peak: Any) -> int:
        assert not burst and not peak
        sustained.contents.enabled = 1
        sustained.contents.power = 250000
        return ZE_RESULT_SUCCESS

    def _zesDeviceEnumTemperatureSensors(self, device: int, count: Any, handles: Any) -> int:
        return self._fill([TEMP_GPU, TEMP_MEM], count, handles)

    def _zesTemperatureGetProperties(self, sensor: int, props: Any) -> int:
        props.contents.type = 1 if sensor == TEMP_GPU else 2  # GPU, MEMORY
        return ZE_RESULT_SUCCESS

    def _zesTemperatureGetState(self, sensor: int, value: Any) -> int:
        value[0] = 45.5 if sensor == TEMP_GPU else 61.0
        return ZE_RESULT_SUCCESS

    def _zesDeviceEnumEngineGroups(self, device: int, count: Any, handles: Any) -> int:
        return self._fill([ENGINE_ALL, ENGINE_COMPUTE], count, handles)

    def _zesEngineGetProperties(self, engine: int, props: Any) -> int:
        props.contents.type = 0 if engine == ENGINE_ALL else 1  # ALL, COMPUTE_ALL
        return ZE_RESULT_SUCCESS

    def _zesEngineGetActivity(self, engine: int, stats: Any) -> int:
        if engine == ENGINE_COMPUTE:
            stats.contents.activeTime, stats.contents.timestamp = 0, 0
            return ZE_RESULT_SUCCESS
        active, timestamp = self.activity.pop(0)
        stats.contents.activeTime = active
        stats.contents.timestamp = timestamp
        return ZE_RESULT_SUCCESS


def prober_for(fake: FakeZe) -> LevelZeroProber:
    return LevelZeroProber(library_names=["libze_loader.so.1"], loader=lambda name: fake)


def test_discover_and_sample_through_the_prototypes() -> None:
    fake = FakeZe()
    prober = prober_for(fake)
    (dev,) = prober.discover()
    assert dev.key == MAX1100_UUID
    assert dev.uuid == MAX1100_UUID
    assert dev.name == "Intel(R) Data Center GPU Max 1100"
    assert dev.pci_bus_id == "0000:29:00.0"
    assert dev.arch == "pvc/xe-hpc"
    assert dev.source == "level-zero"
    assert (dev.vendor, dev.backend, dev.vendor_index) == ("intel", "xpu", 0)
    assert dev.unified_memory is False
    assert dev.mem_total_bytes == 51522830336
    assert dev.compute_units == 56
    assert dev.driver_version == "1.3.27191"
    assert fake.calls[0] == "zesInit"
    (sample,) = prober.sample()
    assert sample.healthy is True
    assert sample.power_mw == 118870  # 118.87 J over 1 s since discover()
    assert sample.power_limit_mw == 250000  # the enabled sustained limit
    assert sample.temp_c == 45.5  # the GPU sensor, not the hotter memory one
    assert sample.util_pct == pytest.approx(25.0)
    assert sample.mem_used_bytes == 51522830336 - 51493543936


def test_init_failure_is_unavailable() -> None:
    fake = FakeZe()
    fake.init_result = 0x78000001  # ZE_RESULT_ERROR_UNINITIALIZED
    with pytest.raises(ProberUnavailable, match="did not start"):
        prober_for(fake).discover()


def test_device_lost_gives_unhealthy_sample() -> None:
    fake = FakeZe()
    prober = prober_for(fake)
    prober.discover()
    fake.lost = True
    (sample,) = prober.sample()
    assert sample.healthy is False
    assert sample.error is not None and "0x70000001" in sample.error


def test_missing_entry_point_is_unavailable() -> None:
    class Partial:
        pass

    with pytest.raises(ProberUnavailable, match="lacks zesInit"):
        LevelZeroProber(library_names=["x"], loader=lambda name: Partial()).discover()


def test_npu_is_skipped_and_gpus_numbered_without_it() -> None:
    fake = FakeZe()
    fake.devices = [NPU, DEVICE]
    (dev,) = prober_for(fake).discover()
    assert (dev.key, dev.vendor_index) == (MAX1100_UUID, 0)


def test_only_an_npu_is_unavailable() -> None:
    fake = FakeZe()
    fake.devices = [NPU]
    with pytest.raises(ProberUnavailable, match="no GPU"):
        prober_for(fake).discover()
