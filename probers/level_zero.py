"""Intel GPUs through Level Zero Sysman (``libze_loader``) with ctypes, where the loader exists.

Untested against real hardware: Shoal's test hosts have neither an Intel GPU nor the loader. The
structures (``probers.level_zero_abi``) follow the Level Zero headers (``include/zes_api.h`` and
``ze_api.h`` of oneapi-src/level-zero, spec 1.x) field for field; the tests check their sizes
against the C layout worked out by hand, the pure conversions with numbers, and the call sequence
against an in-process stand-in for the library. Before relying on it, run ``shoal probe`` on a
real Arc or Data Center GPU Max host and compare with ``xpu-smi``.

Calls: ``zesInit(0)``, ``zesDriverGet``, ``zesDeviceGet``, ``zesDeviceGetProperties`` (name, UUID,
device id, driver version), ``zesDevicePciGetProperties`` (bus id), memory modules
(``zesMemoryGetState``: size and free), power domains (``zesPowerGetEnergyCounter``: microjoules
with a microsecond timestamp; power is the slope between two samples, so the first sample after
``discover()`` already has one), temperature sensors (``zesTemperatureGetState``, degrees C) and
engine groups (``zesEngineGetActivity``: active microseconds over a microsecond timestamp).

UUIDs are written as ``xpu-smi`` writes them (the 16 bytes from last to first, grouped 8-4-4-4-12)
so that both sources give one Intel device the same key.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from probers.base import ProberUnavailable
from probers.intel_sysfs import intel_model, intel_name
from probers.level_zero_abi import (
    PROTOTYPES,
    ZE_DEVICE_PROPERTY_FLAG_INTEGRATED,
    ZE_DEVICE_TYPE_GPU,
    ZE_MAX_DEVICE_UUID_SIZE,
    ZE_RESULT_ERROR_DEVICE_LOST,
    ZE_RESULT_ERROR_UNINITIALIZED,
    ZE_RESULT_SUCCESS,
    ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES,
    ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL,
    ZES_ENGINE_GROUP_ALL,
    ZES_ENGINE_GROUP_COMPUTE_ALL,
    ZES_ENGINE_GROUP_RENDER_ALL,
    ZES_MEM_LOC_DEVICE,
    ZES_MEM_LOC_SYSTEM,
    ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES,
    ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES,
    ZES_STRUCTURE_TYPE_MEM_PROPERTIES,
    ZES_STRUCTURE_TYPE_MEM_STATE,
    ZES_STRUCTURE_TYPE_PCI_PROPERTIES,
    ZES_STRUCTURE_TYPE_POWER_PROPERTIES,
    ZES_STRUCTURE_TYPE_TEMP_PROPERTIES,
    ZES_TEMP_SENSORS_GLOBAL,
    ZES_TEMP_SENSORS_GPU,
    ZesDeviceProperties,
    ZesEngineProperties,
    ZesEngineStats,
    ZesMemProperties,
    ZesMemState,
    ZesPciAddress,
    ZesPciProperties,
    ZesPowerEnergyCounter,
    ZesPowerProperties,
    ZesPowerSustainedLimit,
    ZesTempProperties,
)
from probers.records import DeviceSample, DeviceStatic

_T = TypeVar("_T")
_NO_PAIR: tuple[int | None, int | None] = (None, None)
_IGPU_NOTE = "integrated GPU: the system memory Level Zero reports for it"

_OPTIONAL = {"zesDeviceGetCardPowerDomain", "zesPowerGetLimits"}

# --- pure conversions --------------------------------------------------------------------------


def uuid_to_str(raw: bytes | Sequence[int]) -> str:
    """A Level Zero device UUID as ``xpu-smi`` prints it: bytes last to first, 8-4-4-4-12."""
    data = bytes(raw)
    if len(data) != ZE_MAX_DEVICE_UUID_SIZE:
        raise ValueError(f"a Level Zero UUID has 16 bytes, not {len(data)}")
    text = data[::-1].hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def pci_bus_id_from_address(address: ZesPciAddress) -> str:
    """``zes_pci_address_t`` as a PCI bus id, ``dddd:bb:dd.f``."""
    return f"{address.domain:04x}:{address.bus:02x}:{address.device:02x}.{address.function:x}"


def power_mw_from_counters(prev: tuple[int, int] | None, now: tuple[int, int]) -> int | None:
    """Mean power between two ``(energy_uj, timestamp_us)`` readings, in milliwatts."""
    if prev is None:
        return None
    d_energy, d_time = now[0] - prev[0], now[1] - prev[1]
    if d_time <= 0 or d_energy < 0 or now[0] == 0:
        return None
    return round(d_energy * 1000 / d_time)


def util_pct_from_activity(prev: tuple[int, int] | None, now: tuple[int, int]) -> float | None:
    """Busy share between two ``(active_us, timestamp_us)`` readings, 0..100."""
    if prev is None:
        return None
    d_active, d_time = now[0] - prev[0], now[1] - prev[1]
    if d_time <= 0 or d_active < 0:
        return None
    return min(100.0, max(0.0, 100.0 * d_active / d_time))


def _decode(raw: bytes) -> str | None:
    text = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace").strip()
    return None if not text or text.lower() in ("unknown", "unkown") else text


# --- the library -------------------------------------------------------------------------------


class ZeError(Exception):
    """A Level Zero call returned something other than ``ZE_RESULT_SUCCESS``."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned 0x{code:08x}")
        self.call = call
        self.code = code


def default_library_names() -> list[str]:
    """Where the loader may be: what ``find_library`` finds, then the usual file names."""
    found = ctypes.util.find_library("ze_loader")
    if sys.platform == "win32":
        names = ["ze_loader.dll"]
    else:
        names = ["libze_loader.so.1", "libze_loader.so"]
    return ([found] if found and found not in names else []) + names


class _Sysman:
    """The bound entry points of a loaded ``libze_loader`` (or of a stand-in with those names)."""

    def __init__(self, lib: Any) -> None:
        self._fns: dict[str, Any] = {}
        for name, argtypes in PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                if name in _OPTIONAL:
                    continue
                raise ProberUnavailable(f"the Level Zero loader lacks {name}") from None
            fn.argtypes = argtypes
            fn.restype = ctypes.c_uint32
            self._fns[name] = fn

    def has(self, name: str) -> bool:
        return name in self._fns

    def call(self, name: str, *args: Any) -> None:
        code = int(self._fns[name](*args))
        if code != ZE_RESULT_SUCCESS:
            raise ZeError(name, code)

    def handles(self, name: str, *parent: Any) -> list[ctypes.c_void_p]:
        """The count-then-fill enumeration every ``*Get`` / ``zesDeviceEnum*`` call uses."""
        count = ctypes.c_uint32(0)
        self.call(name, *parent, ctypes.byref(count), None)
        if count.value == 0:
            return []
        array = (ctypes.c_void_p * count.value)()
        self.call(name, *parent, ctypes.byref(count), array)
        return [ctypes.c_void_p(array[i]) for i in range(count.value)]


# --- the prober --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Device:
    key: str
    handle: ctypes.c_void_p
    integrated: bool


class LevelZeroProber:
    """Intel GPUs through Level Zero Sysman. See the module docstring: untested on hardware."""

    source = "level-zero"

    def __init__(
        self,
        library_names: Sequence[str] | None = None,
        loader: Callable[[str], Any] = ctypes.CDLL,
    ) -> None:
        self._names = library_names
        self._loader = loader
        self._zes: _Sysman | None = None
        self._devices: list[_Device] = []
        self._energy: dict[tuple[str, int], tuple[int, int]] = {}
        self._activity: dict[tuple[str, int], tuple[int, int]] = {}

    def _load(self) -> _Sysman:
        names = list(self._names) if self._names is not None else default_library_names()
        errors: list[str] = []
        for name in names:
            try:
                lib = self._loader(name)
            except OSError as error:
                errors.append(f"{name}: {error}")
                continue
            return _Sysman(lib)
        raise ProberUnavailable(
            "no Level Zero loader (libze_loader) found" + (f" ({errors[0]})" if errors else "")
        )

    def discover(self) -> Sequence[DeviceStatic]:
        zes = self._load()
        try:
            zes.call("zesInit", 0)
            handles = [
                d for drv in zes.handles("zesDriverGet") for d in zes.handles("zesDeviceGet", drv)
            ]
        except ZeError as error:
            raise ProberUnavailable(f"Level Zero Sysman did not start: {error}") from error
        if not handles:
            raise ProberUnavailable("Level Zero Sysman found no devices")
        self._zes = zes
        self._devices = []
        self._energy = {}
        self._activity = {}
        statics: list[DeviceStatic] = []
        try:
            for handle in handles:
                props = ZesDeviceProperties(stype=ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES)
                props.core.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES
                zes.call("zesDeviceGetProperties", handle, ctypes.byref(props))
                if props.core.type == ZE_DEVICE_TYPE_GPU:  # not the NPU, which L0 also lists
                    statics.append(self._static(zes, handle, props, len(statics)))
        except ZeError as error:
            self._zes = None
            raise ProberUnavailable(
                f"Level Zero Sysman could not describe a device: {error}"
            ) from error
        if not statics:
            self._zes = None
            raise ProberUnavailable("Level Zero Sysman found no GPU")
        self.sample()  # the first counter readings, so the next sample has a power and a load
        return statics

    def _static(
        self, zes: _Sysman, handle: ctypes.c_void_p, props: ZesDeviceProperties, index: int
    ) -> DeviceStatic:
        core = props.core
        uuid = uuid_to_str(bytes(core.uuid))
        bus_id: str | None = None
        pci = ZesPciProperties(stype=ZES_STRUCTURE_TYPE_PCI_PROPERTIES)
        try:
            zes.call("zesDevicePciGetProperties", handle, ctypes.byref(pci))
            bus_id = pci_bus_id_from_address(pci.address)
        except ZeError:
            pass
        integrated = bool(core.flags & ZE_DEVICE_PROPERTY_FLAG_INTEGRATED)
        model = intel_model(core.deviceId)
        self._devices.append(_Device(uuid, handle, integrated))
        total, _ = _guard(lambda: self._memory(zes, handle, integrated), _NO_PAIR)
        xe_cores = core.numSlices * core.numSubslicesPerSlice
        return DeviceStatic(
            key=uuid,
            vendor="intel",
            backend="xpu",
            name=_decode(core.name) or _decode(props.modelName) or intel_name(core.deviceId),
            source=self.source,
            vendor_index=index,
            uuid=uuid,
            pci_bus_id=bus_id,
            arch=model.arch if model else None,
            unified_memory=integrated,
            mem_total_bytes=total,
            mem_note=_IGPU_NOTE if integrated else None,
            compute_units=xe_cores or None,
            driver_version=_decode(props.driverVersion),
        )

    def _memory(
        self, zes: _Sysman, handle: ctypes.c_void_p, integrated: bool
    ) -> tuple[int | None, int | None]:
        """``(size, used)`` in bytes over the device's memory modules (system ones for an iGPU)."""
        want = ZES_MEM_LOC_SYSTEM if integrated else ZES_MEM_LOC_DEVICE
        size = used = 0
        seen = False
        for mem in zes.handles("zesDeviceEnumMemoryModules", handle):
            props = ZesMemProperties(stype=ZES_STRUCTURE_TYPE_MEM_PROPERTIES)
            state = ZesMemState(stype=ZES_STRUCTURE_TYPE_MEM_STATE)
            try:
                zes.call("zesMemoryGetProperties", mem, ctypes.byref(props))
                if props.location != want:
                    continue
                zes.call("zesMemoryGetState", mem, ctypes.byref(state))
            except ZeError:
                continue
            seen = True
            size += state.size
            used += max(0, state.size - state.free)
        return (size, used) if seen else (None, None)

    def _power(self, zes: _Sysman, device: _Device) -> tuple[int | None, int | None]:
        """``(power_mw, power_limit_mw)`` from the card domain, else the whole-device domains."""
        domains: list[ctypes.c_void_p] = []
        if zes.has("zesDeviceGetCardPowerDomain"):
            card = ctypes.c_void_p()
            try:
                zes.call("zesDeviceGetCardPowerDomain", device.handle, ctypes.byref(card))
                domains = [card]
            except ZeError:
                domains = []
        if not domains:
            for domain in zes.handles("zesDeviceEnumPowerDomains", device.handle):
                props = ZesPowerProperties(stype=ZES_STRUCTURE_TYPE_POWER_PROPERTIES)
                zes.call("zesPowerGetProperties", domain, ctypes.byref(props))
                if not props.onSubdevice:
                    domains = [domain]
                    break
                domains.append(domain)
        total: int | None = 0
        limit: int | None = None
        for i, domain in enumerate(domains):
            counter = ZesPowerEnergyCounter()
            zes.call("zesPowerGetEnergyCounter", domain, ctypes.byref(counter))
            now = (int(counter.energy), int(counter.timestamp))
            mw = power_mw_from_counters(self._energy.get((device.key, i)), now)
            self._energy[(device.key, i)] = now
            total = None if mw is None or total is None else total + mw
        if len(domains) == 1:
            limit = self._limit(zes, domains[0])
        return (total if domains else None), limit

    def _limit(self, zes: _Sysman, domain: ctypes.c_void_p) -> int | None:
        if zes.has("zesPowerGetLimits"):
            sustained = ZesPowerSustainedLimit()
            try:
                zes.call("zesPowerGetLimits", domain, ctypes.byref(sustained), None, None)
                if sustained.enabled and sustained.power > 0:
                    return int(sustained.power)
            except ZeError:
                pass
        props = ZesPowerProperties(stype=ZES_STRUCTURE_TYPE_POWER_PROPERTIES)
        try:
            zes.call("zesPowerGetProperties", domain, ctypes.byref(props))
        except ZeError:
            return None
        return int(props.defaultLimit) if props.defaultLimit > 0 else None

    def _temperature(self, zes: _Sysman, handle: ctypes.c_void_p) -> float | None:
        """The hottest GPU sensor, else the hottest global sensor."""
        by_type: dict[int, list[float]] = {}
        for sensor in zes.handles("zesDeviceEnumTemperatureSensors", handle):
            props = ZesTempProperties(stype=ZES_STRUCTURE_TYPE_TEMP_PROPERTIES)
            value = ctypes.c_double()
            try:
                zes.call("zesTemperatureGetProperties", sensor, ctypes.byref(props))
                zes.call("zesTemperatureGetState", sensor, ctypes.byref(value))
            except ZeError:
                continue
            by_type.setdefault(int(props.type), []).append(float(value.value))
        for kind in (ZES_TEMP_SENSORS_GPU, ZES_TEMP_SENSORS_GLOBAL):
            if by_type.get(kind):
                return max(by_type[kind])
        return None

    def _utilization(self, zes: _Sysman, device: _Device) -> float | None:
        """The whole-device ``ALL`` engine group, else the busiest compute/render group."""
        groups: list[tuple[int, bool, ctypes.c_void_p]] = []
        for engine in zes.handles("zesDeviceEnumEngineGroups", device.handle):
            props = ZesEngineProperties(stype=ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES)
            try:
                zes.call("zesEngineGetProperties", engine, ctypes.byref(props))
            except ZeError:
                continue
            groups.append((int(props.type), bool(props.onSubdevice), engine))
        readings: dict[int, list[float]] = {}
        for i, (kind, on_subdevice, engine) in enumerate(groups):
            if on_subdevice:
                continue
            stats = ZesEngineStats()
            try:
                zes.call("zesEngineGetActivity", engine, ctypes.byref(stats))
            except ZeError:
                continue
            now = (int(stats.activeTime), int(stats.timestamp))
            pct = util_pct_from_activity(self._activity.get((device.key, i)), now)
            self._activity[(device.key, i)] = now
            if pct is not None:
                readings.setdefault(kind, []).append(pct)
        if readings.get(ZES_ENGINE_GROUP_ALL):
            return max(readings[ZES_ENGINE_GROUP_ALL])
        busiest = _max(
            readings.get(kind, [])
            for kind in (
                ZES_ENGINE_GROUP_COMPUTE_ALL,
                ZES_ENGINE_GROUP_RENDER_ALL,
                ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL,
            )
        )
        return busiest

    def sample(self) -> Sequence[DeviceSample]:
        zes = self._zes
        if zes is None:
            return []
        return [self._sample(zes, device) for device in self._devices]

    def _sample(self, zes: _Sysman, device: _Device) -> DeviceSample:
        try:
            _, used = _guard(lambda: self._memory(zes, device.handle, device.integrated), _NO_PAIR)
            power_mw, limit_mw = _guard(lambda: self._power(zes, device), _NO_PAIR)
            temp_c = _guard(lambda: self._temperature(zes, device.handle), None)
            util = _guard(lambda: self._utilization(zes, device), None)
        except ZeError as error:
            return DeviceSample(key=device.key, healthy=False, error=str(error))
        return DeviceSample(
            key=device.key,
            mem_used_bytes=used,
            util_pct=util,
            temp_c=temp_c,
            power_mw=power_mw,
            power_limit_mw=limit_mw,
        )

    def close(self) -> None:
        self._zes = None
        self._devices = []
        self._energy = {}
        self._activity = {}


def _guard(read: Callable[[], _T], default: _T) -> _T:
    """A reading that is simply not there (unsupported, no permission) is ``default``; a lost
    device is not: that error is raised so the whole sample turns unhealthy."""
    try:
        return read()
    except ZeError as error:
        if error.code in (ZE_RESULT_ERROR_DEVICE_LOST, ZE_RESULT_ERROR_UNINITIALIZED):
            raise
        return default


def _max(groups: Iterable[list[float]]) -> float | None:
    values = [v for group in groups for v in group]
    return max(values) if values else None
