"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` bindings, imported as ``pynvml``).

The bindings are imported inside :meth:`NvmlProber.discover`, so this module imports on hosts
without them. Every NVML call is guarded: an error that concerns one reading (``Not Supported``,
``Function Not Found``, ``Insufficient Permissions``, ``Unknown Error``, ...) leaves that field
``None``; an error that means the device stopped answering (``GPU is lost``, ``GPU requires
restart``, ...) turns that device's sample unhealthy. Nothing here raises for a device-level
failure.

NVLink bandwidth is per direction, summed over the lanes to that peer, from NVML's common link
speed field (megabytes per second). Pairs of GPUs with no NVLink get a ``pcie`` link whose detail
is the common PCIe ancestor in ``nvidia-smi topo -m`` words.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from probers.base import ProberUnavailable
from probers.pcie import gen_bytes_per_s
from probers.records import DeviceSample, DeviceStatic, Link, MigDevice

T = TypeVar("T")

# nvml.h ``NVML_DEVICE_ARCH_*``: stable ABI values, kept here so that older bindings that lack
# the newer constants still name the architecture.
ARCH_NAMES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}

# nvml.h ``NVML_TOPOLOGY_*`` -> the words of ``nvidia-smi topo -m``. ``INTERNAL`` (two GPUs on one
# board) has no nvidia-smi word, so NVML's own name is kept.
TOPOLOGY_WORDS: dict[int, str] = {
    0: "INTERNAL",
    10: "PIX",
    20: "PXB",
    30: "PHB",
    40: "NODE",
    50: "SYS",
}

# nvml.h error codes that mean the device (or the whole library) stopped answering.
_UNINITIALIZED = 1
_DRIVER_NOT_LOADED = 9
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
FATAL_ERRORS = frozenset(
    {_UNINITIALIZED, _DRIVER_NOT_LOADED, _GPU_IS_LOST, _RESET_REQUIRED, _LIB_RM_VERSION_MISMATCH}
)
# Errors from the memory info v2 call that mean this driver has no v2: fall back to v1 for good.
_FUNCTION_NOT_FOUND = 13
_ARGUMENT_VERSION_MISMATCH = 25
_NO_MEMORY_V2 = frozenset({_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH})
_NOT_SUPPORTED = 3
PCIE_TX = 0
PCIE_RX = 1
"""``NVML_PCIE_UTIL_TX_BYTES`` and ``..._RX_BYTES``."""
NOT_THROTTLING = 0x1 | 0x2 | 0x100
"""Clock reasons that are not a slowdown: the GPU is idle, applications clocks are set, the
display clock is set (``nvmlClocksThrottleReasonGpuIdle`` ...)."""
_REFUSALS = ("Not Supported", "Function Not Found")
_NVLINK_DEVICE_TYPE_SWITCH = 2
_MIG_ENABLED = 1
_FEATURE_ENABLED = 1


def shadowing_pynvml_warning() -> str | None:
    """A one-line warning when the deprecated ``pynvml`` distribution is installed.

    Its old releases ship their own ``pynvml`` module, which shadows the one from
    ``nvidia-ml-py`` (NVIDIA's bindings, which Shoal depends on) and lags behind the driver.
    """
    try:
        dist = importlib.metadata.distribution("pynvml")
    except importlib.metadata.PackageNotFoundError:
        return None
    version = dist.version
    files = dist.files
    if files is not None and not any(str(path) == "pynvml.py" for path in files):
        return (
            f"the deprecated 'pynvml' distribution {version} is installed; "
            "uninstall it and keep 'nvidia-ml-py'"
        )
    return (
        f"the deprecated 'pynvml' distribution {version} is installed and its pynvml module "
        "shadows nvidia-ml-py's; run 'pip uninstall pynvml' and reinstall 'nvidia-ml-py'"
    )


def normalise_bus_id(raw: str | bytes | None) -> str | None:
    """NVML's ``00000000:3B:00.0`` as sysfs writes it: ``0000:3b:00.0``; ``None`` if unparsable."""
    if raw is None:
        return None
    text = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3 or "." not in parts[2]:
        return None
    domain, bus, devfn = parts
    device, function = devfn.split(".", 1)
    try:
        return (
            f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
        )
    except ValueError:
        return None


class _Reads:
    """Calls NVML for one device: a failed reading becomes ``None`` and a note of why.

    A fatal error (the device or the library stopped answering) is raised on to the caller, which
    turns it into an unhealthy sample.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.missing: dict[str, str] = {}

    def get(self, label: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        try:
            return fn(*args, **kwargs)
        except self._nvml.NVMLError as err:
            if _code(err) in FATAL_ERRORS:
                raise
            self.missing[label] = str(err)
            return None

    def note(self) -> str | None:
        if not self.missing:
            return None
        return "; ".join(f"{label}: {why}" for label, why in self.missing.items())


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class _Gpu:
    """One enumerated GPU: its NVML index, handle (``None`` if NVML would not give one) and key."""

    index: int
    handle: Any
    key: str
    bus_id: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _NvLinks:
    """Active NVLink lanes of one GPU: to each peer bus id directly, and to NVSwitches."""

    peers: dict[str, int]
    switch_lanes: int
    lane_speed_mbps: int | None


class NvmlProber:
    """Every NVIDIA GPU NVML can see, keyed by UUID."""

    source = "nvml"

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self._nvml: Any = None
        self._gpus: list[_Gpu] = []
        self._no_memory_v2: set[int] = set()
        self._refused: dict[int, dict[str, str]] = {}
        """By GPU index: readings it refused as not supported, and NVML's words."""
        self._pcie: dict[int, tuple[float | None, float | None]] = {}
        self._pcie_turn = 0

    # -- discover ---------------------------------------------------------------------------

    def discover(self) -> Sequence[DeviceStatic]:
        warning = shadowing_pynvml_warning()
        if warning is not None and warning not in self.warnings:
            self.warnings.append(warning)
        try:
            import pynvml
        except ImportError as err:
            raise ProberUnavailable("nvidia-ml-py (pynvml) is not installed") from err
        self.close()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise ProberUnavailable(f"NVML unavailable: {err}") from err
        self._nvml = pynvml
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            self.close()
            raise ProberUnavailable(f"NVML cannot count GPUs: {err}") from err
        if count == 0:
            self.close()
            raise ProberUnavailable("NVML sees no NVIDIA GPU")

        driver_version = _text(self._quiet(pynvml.nvmlSystemGetDriverVersion))
        self._no_memory_v2 = set()
        self._gpus = [self._enumerate(index) for index in range(count)]
        statics = [self._static(gpu, driver_version) for gpu in self._gpus]
        links = self._links()
        return [
            _with_links(static, links.get(gpu.key, ()))
            for gpu, static in zip(self._gpus, statics, strict=True)
        ]

    def _enumerate(self, index: int) -> _Gpu:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as err:
            return _Gpu(index, None, f"nvml:{index}", None, error=str(err))
        reads = _Reads(nvml)
        try:
            uuid = _text(reads.get("uuid", nvml.nvmlDeviceGetUUID, handle))
            pci = reads.get("pci_bus_id", nvml.nvmlDeviceGetPciInfo, handle)
        except nvml.NVMLError as err:
            return _Gpu(index, handle, f"nvml:{index}", None, error=str(err))
        bus_id = None
        if pci is not None:
            bus_id = normalise_bus_id(pci.busId) or normalise_bus_id(pci.busIdLegacy)
        return _Gpu(index, handle, uuid or f"nvml:{index}", bus_id)

    def _static(self, gpu: _Gpu, driver_version: str | None) -> DeviceStatic:
        nvml = self._nvml
        plain = DeviceStatic(
            key=gpu.key,
            vendor="nvidia",
            backend="cuda",
            name="NVIDIA GPU",
            source=self.source,
            vendor_index=gpu.index,
            uuid=gpu.key if gpu.key.startswith("GPU-") else None,
            pci_bus_id=gpu.bus_id,
            driver_version=driver_version,
        )
        if gpu.handle is None or gpu.error is not None:
            return plain
        reads = _Reads(nvml)
        handle = gpu.handle
        try:
            name = _text(reads.get("name", nvml.nvmlDeviceGetName, handle))
            arch = reads.get("arch", nvml.nvmlDeviceGetArchitecture, handle)
            cc = reads.get("compute_capability", nvml.nvmlDeviceGetCudaComputeCapability, handle)
            memory = self._memory(gpu, reads)
            slowdown = reads.get(
                "temp_slowdown_c",
                nvml.nvmlDeviceGetTemperatureThreshold,
                handle,
                nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            )
            mig_devices = self._mig_devices(handle, reads)
        except nvml.NVMLError:
            return plain
        return DeviceStatic(
            key=plain.key,
            vendor="nvidia",
            backend="cuda",
            name=name or plain.name,
            source=self.source,
            vendor_index=gpu.index,
            uuid=plain.uuid,
            pci_bus_id=gpu.bus_id,
            arch=ARCH_NAMES.get(int(arch)) if arch is not None else None,
            compute_capability=f"{int(cc[0])}.{int(cc[1])}" if cc is not None else None,
            mem_total_bytes=int(memory.total) if memory is not None else None,
            temp_slowdown_c=float(slowdown) if slowdown is not None else None,
            mig_devices=mig_devices,
            driver_version=driver_version,
        )

    def _memory(self, gpu: _Gpu, reads: _Reads) -> Any:
        """Memory info v2 (``used`` without the driver's reservation), else v1.

        A driver without v2 (``Function Not Found``) is remembered per device, so v2 is tried once.
        """
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and gpu.index not in self._no_memory_v2:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(gpu.handle, version=version)
            except nvml.NVMLError as err:
                if _code(err) in FATAL_ERRORS:
                    raise
                if _code(err) in _NO_MEMORY_V2:
                    self._no_memory_v2.add(gpu.index)
        return reads.get("mem", nvml.nvmlDeviceGetMemoryInfo, gpu.handle)

    def _mig_devices(self, handle: Any, reads: _Reads) -> tuple[MigDevice, ...]:
        nvml = self._nvml
        mode = reads.get("mig", nvml.nvmlDeviceGetMigMode, handle)
        if mode is None or int(mode[0]) != _MIG_ENABLED:
            return ()
        count = reads.get("mig", nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        found: list[MigDevice] = []
        for slot in range(int(count or 0)):
            try:
                child = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError as err:
                if _code(err) in FATAL_ERRORS:
                    raise
                continue  # an empty slot answers Not Found
            uuid = _text(reads.get("mig", nvml.nvmlDeviceGetUUID, child))
            if uuid is None:
                continue
            name = _text(reads.get("mig", nvml.nvmlDeviceGetName, child))
            memory = reads.get("mig", nvml.nvmlDeviceGetMemoryInfo, child)
            total = int(memory.total) if memory is not None else None
            found.append(MigDevice(uuid=uuid, name=name, mem_total_bytes=total))
        return tuple(found)

    # -- links ------------------------------------------------------------------------------

    def _links(self) -> dict[str, tuple[Link, ...]]:
        """NVLink to each peer (direct or through NVSwitch), else the common PCIe ancestor."""
        gpus = [gpu for gpu in self._gpus if gpu.handle is not None and gpu.error is None]
        by_bus = {gpu.bus_id: gpu for gpu in gpus if gpu.bus_id is not None}
        nvlinks = {gpu.key: self._nvlinks(gpu) for gpu in gpus}
        links: dict[str, list[Link]] = {gpu.key: [] for gpu in gpus}
        for gpu in gpus:
            mine = nvlinks[gpu.key]
            for bus_id, lanes in mine.peers.items():
                peer = by_bus.get(bus_id)
                if peer is None or peer.key == gpu.key:
                    continue
                links[gpu.key].append(_nvlink(peer.key, lanes, mine.lane_speed_mbps))
        for position, gpu in enumerate(gpus):
            for peer in gpus[position + 1 :]:
                if _linked(links[gpu.key], peer.key) or _linked(links[peer.key], gpu.key):
                    continue
                a, b = nvlinks[gpu.key], nvlinks[peer.key]
                if a.switch_lanes and b.switch_lanes:
                    lanes = min(a.switch_lanes, b.switch_lanes)
                    links[gpu.key].append(_nvlink(peer.key, lanes, a.lane_speed_mbps))
                    links[peer.key].append(_nvlink(gpu.key, lanes, b.lane_speed_mbps))
                    continue
                word = self._common_ancestor(gpu, peer)
                if word is not None:
                    links[gpu.key].append(Link(peer=peer.key, kind="pcie", detail=word))
                    links[peer.key].append(Link(peer=gpu.key, kind="pcie", detail=word))
        return {key: tuple(found) for key, found in links.items()}

    def _nvlinks(self, gpu: _Gpu) -> _NvLinks:
        nvml = self._nvml
        peers: dict[str, int] = {}
        switch_lanes = 0
        try:
            for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
                try:
                    state = nvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
                except nvml.NVMLError as err:
                    if _code(err) in FATAL_ERRORS:
                        raise
                    if _code(err) == _NOT_SUPPORTED and link == 0:
                        break  # no NVLink on this GPU
                    continue  # a link index this GPU does not have
                if int(state) != _FEATURE_ENABLED:
                    continue
                reads = _Reads(nvml)
                remote_type = reads.get(
                    "nvlink", nvml.nvmlDeviceGetNvLinkRemoteDeviceType, gpu.handle, link
                )
                if remote_type is not None and int(remote_type) == _NVLINK_DEVICE_TYPE_SWITCH:
                    switch_lanes += 1
                    continue
                remote = reads.get(
                    "nvlink", nvml.nvmlDeviceGetNvLinkRemotePciInfo, gpu.handle, link
                )
                bus_id = normalise_bus_id(remote.busId) if remote is not None else None
                if bus_id is not None:
                    peers[bus_id] = peers.get(bus_id, 0) + 1
        except nvml.NVMLError:
            return _NvLinks({}, 0, None)
        speed = self._lane_speed_mbps(gpu) if peers or switch_lanes else None
        return _NvLinks(peers, switch_lanes, speed)

    def _lane_speed_mbps(self, gpu: _Gpu) -> int | None:
        """One lane's speed per direction in megabits/s, from NVML's MBps (megabytes) field."""
        nvml = self._nvml
        field = getattr(nvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", None)
        if field is None:
            return None
        values = self._quiet(nvml.nvmlDeviceGetFieldValues, gpu.handle, [field])
        if not values or int(values[0].nvmlReturn) != 0:
            return None
        megabytes = int(values[0].value.uiVal)
        return megabytes * 8 if megabytes > 0 else None

    def _common_ancestor(self, a: _Gpu, b: _Gpu) -> str | None:
        nvml = self._nvml
        level = self._quiet(nvml.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle)
        return TOPOLOGY_WORDS.get(int(level)) if level is not None else None

    def _quiet(self, fn: Callable[..., T], *args: Any) -> T | None:
        """One call whose failure, fatal or not, only leaves the answer unknown."""
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    # -- sample -----------------------------------------------------------------------------

    def sample(self) -> Sequence[DeviceSample]:
        out = [self._sample(gpu) for gpu in self._gpus]
        self._pcie_turn += 1
        return out

    def _sample(self, gpu: _Gpu) -> DeviceSample:
        nvml = self._nvml
        if nvml is None:
            return DeviceSample(key=gpu.key, healthy=False, error="NVML is shut down")
        if gpu.handle is None:
            return DeviceSample(key=gpu.key, healthy=False, error=gpu.error)
        reads = _Reads(nvml)
        handle = gpu.handle
        try:
            memory = self._memory(gpu, reads)
            util = reads.get("util_pct", nvml.nvmlDeviceGetUtilizationRates, handle)
            temp = reads.get(
                "temp_c", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            )
            power = reads.get("power_mw", nvml.nvmlDeviceGetPowerUsage, handle)
            limit = reads.get("power_limit_mw", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            more = self._more(gpu, reads)
        except nvml.NVMLError as err:
            return DeviceSample(key=gpu.key, healthy=False, error=str(err))
        return DeviceSample(
            key=gpu.key,
            mem_used_bytes=int(memory.used) if memory is not None else None,
            util_pct=float(util.gpu) if util is not None else None,
            temp_c=float(temp) if temp is not None else None,
            power_mw=int(power) if power is not None else None,
            power_limit_mw=int(limit) if limit is not None else None,
            error=reads.note(),
            mem_bw_pct=float(util.memory) if util is not None else None,
            **more,
        )

    def _more(self, gpu: _Gpu, reads: _Reads) -> dict[str, Any]:
        """The SM clock, throttle reasons, PCIe link and traffic. A reading the device refused
        as not supported is not asked again (its note stays). PCIe traffic is read for one GPU
        a sample, in turn (NVML's counter takes about 20 ms to read), and each GPU's last
        reading is given until its turn comes again."""
        nvml, handle = self._nvml, gpu.handle
        known = self._refused.setdefault(gpu.index, {})

        def get(label: str, fn: Callable[..., T], *args: Any) -> T | None:
            if label in known:
                reads.missing[label] = known[label]
                return None
            value = reads.get(label, fn, *args)
            if value is None and any(r in reads.missing.get(label, "") for r in _REFUSALS):
                known[label] = reads.missing[label]
            return value

        clock = get("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        reasons = get("throttle", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        gen = get("pcie_link", nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        width = get("pcie_link", nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
        if self._gpus and self._gpus[self._pcie_turn % len(self._gpus)] is gpu:
            rx = get("pcie_rx", nvml.nvmlDeviceGetPcieThroughput, handle, PCIE_RX)
            tx = get("pcie_tx", nvml.nvmlDeviceGetPcieThroughput, handle, PCIE_TX)
            self._pcie[gpu.index] = (
                None if rx is None else float(rx) * 1024,  # NVML counts KB/s
                None if tx is None else float(tx) * 1024,
            )
        else:
            for label in ("pcie_rx", "pcie_tx"):
                if label in known:
                    reads.missing[label] = known[label]
        rx_bps, tx_bps = self._pcie.get(gpu.index, (None, None))
        return {
            "sm_clock_mhz": None if clock is None else float(clock),
            "throttled": None if reasons is None else bool(int(reasons) & ~NOT_THROTTLING),
            "pcie_link_bytes_per_s": gen_bytes_per_s(gen, width),
            "pcie_rx_bytes_per_s": rx_bps,
            "pcie_tx_bytes_per_s": tx_bps,
        }

    def close(self) -> None:
        """Shut NVML down once; later calls do nothing."""
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text.strip() or None


def _nvlink(peer: str, lanes: int, lane_speed_mbps: int | None) -> Link:
    bandwidth = lanes * lane_speed_mbps if lane_speed_mbps is not None else None
    return Link(peer=peer, kind="nvlink", bandwidth_mbps=bandwidth, detail=str(lanes))


def _linked(links: list[Link], peer: str) -> bool:
    return any(link.peer == peer for link in links)


def _with_links(static: DeviceStatic, links: tuple[Link, ...]) -> DeviceStatic:
    return replace(static, links=links) if links else static
