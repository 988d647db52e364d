"""A simulated prober: real accelerator models from the catalog, responding to the load put on them.

Devices carry the real vendor and backend of the model they simulate, so the scheduler and the
vendor pinning variables behave as on a real host; only ``source`` (``"sim"``), the key
(``sim:<host>:<index>``) and the name (``NVIDIA H100 SXM (simulated)``) tell them apart.

The agent calls :meth:`SimProber.set_load` when it starts a job on a simulated device and
:meth:`SimProber.clear_load` when the job ends. Samples then follow a small physical model:

- utilization is the load plus a little seeded noise, clamped to 0..100;
- memory used is an idle baseline plus the load's memory;
- power is idle power plus ``(TDP - idle) * util``;
- temperature is ambient plus a rise proportional to power, reached through a first-order lag
  (time constant :data:`THERMAL_TAU_S`) measured on the injected clock.

Apple devices report neither power nor temperature, as on a real Mac without root.
Everything is deterministic for a given profile, seed and sequence of clock readings.

Reference hosts (:data:`REFERENCE_HOSTS`) are whole simulated machines: their devices, the OS and
CPU architecture of the host (:meth:`SimProber.host_info`), the source a real host of that kind
is probed through (``source`` is ``sim:<source>``), and MIG instances where the real one has them.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from probers.apple import APPLE_NO_THERMAL_NOTE
from probers.catalog import AcceleratorModel, load_catalog, lookup
from probers.records import DeviceSample, DeviceStatic, HostInfo, Link, LinkKind, MigDevice

PRESETS: dict[str, tuple[tuple[str, int], ...]] = {
    "demo": (("h100", 2), ("mi300x", 1), ("arc-a770", 1)),
    "dgx-h100": (("h100", 8),),
    "mi300x-8": (("mi300x", 8),),
    "m2-ultra": (("m2-ultra", 1),),
    "workstation": (("rtx-4090", 1), ("arc-b580", 1)),
}
"""Named hosts. ``demo`` mixes three vendors; same-model groups with a GPU fabric are linked."""

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ReferenceHost:
    """A whole simulated machine: devices, OS, CPU, and the source its GPUs are probed through."""

    groups: tuple[tuple[str, int], ...]
    os: str
    """As ``platform.system().lower()``: ``linux``, ``darwin``, ``windows``."""
    arch: str
    cpu_count: int
    mem_total_bytes: int
    source: str
    """The prober a real host of this kind uses: ``nvml``, ``amdgpu-sysfs``, ``metal``..."""
    mig_instances: int = 0
    """MIG instances (1g.10gb) carved out of the first GPU, as NVML reports them."""


REFERENCE_HOSTS: dict[str, ReferenceHost] = {
    "linux-a100": ReferenceHost(
        (("a100-80gb", 2),), "linux", "x86_64", 64, 512 * GIB, "nvml", mig_instances=7
    ),
    "linux-arm64-rx7900": ReferenceHost(
        (("rx-7900-xtx", 4),), "linux", "arm64", 80, 256 * GIB, "amdgpu-sysfs"
    ),
    "macos-m2-ultra": ReferenceHost((("m2-ultra", 1),), "darwin", "arm64", 24, 192 * GIB, "metal"),
    "windows-arc-a770": ReferenceHost(
        (("arc-a770", 1),), "windows", "x86_64", 16, 64 * GIB, "level-zero"
    ),
}
"""The reference fleet: Linux x86-64 with 2x A100 (NVML, the first GPU in MIG mode), Linux arm64
with 4x RX 7900 XTX (amdgpu sysfs + KFD), macOS arm64 with an M2 Ultra (Metal), Windows x86-64
with an Arc A770 (Level Zero)."""
MIG_SLICE_BYTES = 9728 * 1024**2
"""Memory of one A100 80GB 1g.10gb MIG instance, as NVML reports it."""

MAX_DEVICES = 64

AMBIENT_C = 30.0
"""Air temperature at the device's inlet."""
THERMAL_TAU_S = 20.0
"""Time constant of the temperature's first-order response to power."""
IDLE_POWER_FRACTION = 0.1
"""Idle power as a fraction of TDP."""
WORKING_SET_FRACTION = 0.75
"""Metal's recommended working set as a fraction of unified memory on large Macs."""

# Temperature rise above ambient at full TDP, and the throttle point, per vendor.
_FULL_LOAD_RISE_C = {"nvidia": 45.0, "amd": 50.0, "intel": 50.0}
_SLOWDOWN_C = {"nvidia": 90.0, "amd": 100.0, "intel": 95.0}
_DEFAULT_RISE_C = 45.0

_IDLE_MEM_BYTES = 512 * 1024**2


@dataclass(frozen=True, slots=True)
class SimLoad:
    """What the jobs on one simulated device ask of it."""

    util_pct: float
    mem_used_bytes: int


@dataclass(slots=True)
class _Thermal:
    temp_c: float
    at_s: float


def _profile_error(profile: str) -> ValueError:
    presets = ", ".join([*PRESETS, *REFERENCE_HOSTS])
    models = ", ".join(load_catalog())
    return ValueError(
        f"unknown sim profile {profile!r}: use a preset ({presets}), a catalog model with an"
        " optional count (h100:8) or a comma-separated mix (a100-80gb:4,mi300x:2);"
        f" models: {models}"
    )


def parse_profile(profile: str) -> list[tuple[AcceleratorModel, int]]:
    """A profile as ``(model, count)`` groups in order; ``ValueError`` (one line) when invalid."""
    text = profile.strip().lower()
    if text in PRESETS:
        return [(load_catalog()[key], count) for key, count in PRESETS[text]]
    if text in REFERENCE_HOSTS:
        return [(load_catalog()[key], count) for key, count in REFERENCE_HOSTS[text].groups]
    groups: list[tuple[AcceleratorModel, int]] = []
    for part in text.split(","):
        name, sep, count_text = part.strip().partition(":")
        try:
            model = lookup(name.strip())
            count = int(count_text) if sep else 1
        except (KeyError, ValueError):
            raise _profile_error(profile) from None
        if count < 1:
            raise _profile_error(profile)
        groups.append((model, count))
    if not groups or sum(count for _, count in groups) > MAX_DEVICES:
        raise _profile_error(profile)
    return groups


def _default_host_id(profile: str, seed: int) -> str:
    text = f"{socket.gethostname()}|{profile}|{seed}"
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _pci_bus_id(index: int) -> str:
    """A plausible PCI address for simulated device ``index``, unique on the host."""
    return f"{index // 16:04x}:{0x18 + 14 * (index % 16):02x}:00.0"


def _link_kind(model: AcceleratorModel) -> LinkKind | None:
    fabric = model.interconnect or ""
    if fabric.startswith("nvlink"):
        return "nvlink"
    if fabric == "xgmi":
        return "xgmi"
    return None


class SimProber:
    """Simulated devices for one host, after ``profile`` (see :func:`parse_profile`).

    ``host_id`` makes keys unique across simulated hosts; by default it is derived from the host
    name, the profile and the seed, so two agents with different seeds on one machine differ.
    """

    source = "sim"

    def __init__(
        self,
        profile: str,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        host_id: str | None = None,
    ) -> None:
        self.profile = profile
        self.seed = seed
        self._clock = clock
        self.host_id = host_id or _default_host_id(profile, seed)
        self._rng = random.Random(seed)
        self.reference = REFERENCE_HOSTS.get(profile.strip().lower())
        groups = parse_profile(profile)
        self._models: dict[str, AcceleratorModel] = {}
        self._devices = tuple(self._build(groups))
        self._loads: dict[str, SimLoad] = {}
        self._thermal: dict[str, _Thermal] = {}

    # -- inventory ---------------------------------------------------------------------------

    def _build(self, groups: list[tuple[AcceleratorModel, int]]) -> list[DeviceStatic]:
        entries: list[tuple[AcceleratorModel, int, str]] = []
        per_vendor: dict[str, itertools.count[int]] = {}
        for model, count in groups:
            for _ in range(count):
                vendor_index = next(per_vendor.setdefault(model.vendor, itertools.count()))
                entries.append((model, vendor_index, f"sim:{self.host_id}:{len(entries)}"))
        # Same-model groups with a GPU fabric are fully connected, as on HGX/OAM baseboards.
        peers: dict[str, list[str]] = {}
        for model, _, key in entries:
            if _link_kind(model) is not None:
                peers.setdefault(model.key, []).append(key)
        devices: list[DeviceStatic] = []
        for index, (model, vendor_index, key) in enumerate(entries):
            self._models[key] = model
            links = tuple(
                self._link(model, peer) for peer in peers.get(model.key, []) if peer != key
            )
            devices.append(self._static(index, model, vendor_index, key, links))
        return devices

    @staticmethod
    def _link(model: AcceleratorModel, peer: str) -> Link:
        kind = _link_kind(model)
        assert kind is not None
        if kind == "nvlink":
            # Through NVSwitch every pair gets the device's whole NVLink bandwidth.
            gbps = model.interconnect_gbps
            detail = f"NV{model.interconnect_links}" if model.interconnect_links else None
        else:
            # xGMI links are point to point: one link's share per peer.
            gbps = model.peer_link_gbps or model.interconnect_gbps
            detail = "hops=1"
        mbps = None if gbps is None else round(gbps * 8000)
        return Link(peer=peer, kind=kind, bandwidth_mbps=mbps, detail=detail)

    def _static(
        self,
        index: int,
        model: AcceleratorModel,
        vendor_index: int,
        key: str,
        links: tuple[Link, ...],
    ) -> DeviceStatic:
        mem_total = model.mem_bytes
        mem_note = None
        if model.backend == "metal" and mem_total is not None:
            mem_total = int(mem_total * WORKING_SET_FRACTION)
            mem_note = "simulated Metal recommended working set: 3/4 of unified memory"
        digest = hashlib.sha256(f"{self.host_id}:{index}".encode()).digest()
        device_uuid = str(uuid.UUID(bytes=digest[:16], version=4))
        ref = self.reference
        mig: tuple[MigDevice, ...] = ()
        if ref is not None and index == 0 and model.vendor == "nvidia":
            mig = tuple(
                MigDevice(
                    uuid=f"MIG-{uuid.UUID(bytes=digest[16:32], version=4).hex[:-2]}{n:02x}",
                    name=f"{model.name} MIG 1g.10gb",
                    mem_total_bytes=MIG_SLICE_BYTES,
                )
                for n in range(ref.mig_instances)
            )
        return DeviceStatic(
            key=key,
            vendor=model.vendor,
            backend=model.backend,
            name=f"{model.name} (simulated)",
            source=self.source if ref is None else f"{self.source}:{ref.source}",
            vendor_index=vendor_index,
            uuid=f"GPU-{device_uuid}" if model.vendor == "nvidia" else None,
            pci_bus_id=None if model.form_factor == "soc" else _pci_bus_id(index),
            arch=model.arch,
            compute_capability=model.compute_capability,
            unified_memory=model.unified_memory,
            mem_total_bytes=mem_total,
            mem_note=mem_note,
            compute_units=model.compute_units,
            temp_slowdown_c=_SLOWDOWN_C.get(model.vendor),
            links=links,
            mig_devices=mig,
            driver_version=None,
        )

    def discover(self) -> Sequence[DeviceStatic]:
        return self._devices

    def host_info(self) -> HostInfo | None:
        """The simulated machine of a reference host; ``None``: the machine it runs on."""
        ref = self.reference
        if ref is None:
            return None
        return HostInfo(
            hostname=socket.gethostname(),
            os=ref.os,
            arch=ref.arch,
            cpu_count=ref.cpu_count,
            mem_total_bytes=ref.mem_total_bytes,
        )

    def close(self) -> None:
        self._loads.clear()

    # -- load --------------------------------------------------------------------------------

    def set_load(self, key: str, util_pct: float, mem_used_bytes: int) -> None:
        """Put a job's load on device ``key`` (replacing any load set before)."""
        self._check_key(key)
        if not 0.0 <= util_pct <= 100.0:
            raise ValueError(f"util_pct must be within 0..100, not {util_pct}")
        if mem_used_bytes < 0:
            raise ValueError(f"mem_used_bytes must not be negative, not {mem_used_bytes}")
        self._advance(key, self._clock())
        self._loads[key] = SimLoad(util_pct=util_pct, mem_used_bytes=mem_used_bytes)

    def clear_load(self, key: str) -> None:
        """Take the load off device ``key`` (the job ended)."""
        self._check_key(key)
        self._advance(key, self._clock())
        self._loads.pop(key, None)

    def load(self, key: str) -> SimLoad | None:
        return self._loads.get(key)

    def _check_key(self, key: str) -> None:
        if key not in self._models:
            raise KeyError(f"no simulated device {key!r} on this host")

    # -- physics -----------------------------------------------------------------------------

    def _power_w(self, model: AcceleratorModel, util_pct: float) -> float | None:
        if model.tdp_w is None or model.backend == "metal":
            return None
        idle = model.tdp_w * IDLE_POWER_FRACTION
        return idle + (model.tdp_w - idle) * util_pct / 100.0

    def _target_temp_c(self, model: AcceleratorModel, power_w: float) -> float:
        assert model.tdp_w is not None
        rise = _FULL_LOAD_RISE_C.get(model.vendor, _DEFAULT_RISE_C)
        return AMBIENT_C + rise * power_w / model.tdp_w

    def _advance(self, key: str, now_s: float) -> None:
        """Bring the device's temperature up to ``now_s`` under the load that held until now."""
        model = self._models[key]
        load = self._loads.get(key)
        power = self._power_w(model, load.util_pct if load else 0.0)
        if power is None:
            return
        target = self._target_temp_c(model, power)
        state = self._thermal.get(key)
        if state is None:
            # First look at the device: it has been sitting idle long enough to settle.
            idle_power = self._power_w(model, 0.0)
            assert idle_power is not None
            state = _Thermal(temp_c=self._target_temp_c(model, idle_power), at_s=now_s)
            self._thermal[key] = state
        dt = max(0.0, now_s - state.at_s)
        state.temp_c += (target - state.temp_c) * (1.0 - math.exp(-dt / THERMAL_TAU_S))
        state.at_s = now_s

    def sample(self) -> Sequence[DeviceSample]:
        now = self._clock()
        samples: list[DeviceSample] = []
        for device in self._devices:
            key = device.key
            model = self._models[key]
            self._advance(key, now)
            load = self._loads.get(key)
            if load is not None:
                util = load.util_pct + self._rng.uniform(-2.0, 2.0)
            else:
                util = self._rng.uniform(0.0, 1.0)
            util = round(min(100.0, max(0.0, util)), 1)
            mem_used = None
            if device.mem_total_bytes is not None:
                wanted = _IDLE_MEM_BYTES + (load.mem_used_bytes if load else 0)
                mem_used = min(device.mem_total_bytes, wanted)
            power = self._power_w(model, util)
            thermal = self._thermal.get(key)
            samples.append(
                DeviceSample(
                    key=key,
                    mem_used_bytes=mem_used,
                    util_pct=util,
                    temp_c=None if thermal is None else round(thermal.temp_c, 1),
                    power_mw=None if power is None else round(power * 1000),
                    power_limit_mw=None if model.tdp_w is None else round(model.tdp_w * 1000),
                    error=APPLE_NO_THERMAL_NOTE if model.backend == "metal" else None,
                )
            )
        return samples
