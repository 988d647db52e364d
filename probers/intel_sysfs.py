"""Intel GPUs through the ``xe`` and ``i915`` kernel drivers' sysfs and hwmon files.

Every ``cardN`` whose ``device/uevent`` names the ``xe`` or ``i915`` driver is one device; the
device's ``source`` says which driver (``xe-sysfs`` or ``i915-sysfs``). What the files give:

- name and architecture from the PCI device id (:func:`intel_model`); unknown ids are named
  ``Intel GPU [8086:XXXX]``. Integrated GPUs (known ids, or any Intel GPU at ``0000:00:02.0``) are
  flagged ``unified_memory``; their memory is system memory whose share the driver does not tell, so
  ``mem_total_bytes`` stays ``None`` and ``mem_note`` says so.
- VRAM size: xe publishes ``device/tileN/physical_vram_size_bytes`` (root-readable only); i915
  publishes nothing, so discrete cards on i915 have ``mem_total_bytes=None``.
- hwmon: the ``card`` energy counter when there is one, else ``pkg``, else the unlabelled
  ``energy1_input`` (i915), in microjoules. Power is the counter's slope between two readings.
  ``discover()`` records the first reading, so the first ``sample()`` after it already has a power;
  a counter that reads 0, does not move, or goes backwards (wrap, reset) gives ``None`` for that
  sample. The temperature is the ``pkg`` sensor (or the unlabelled one on i915). The power limit
  is :func:`read_power_limit`, below.
- utilisation: the GT's idle (RC6) residency counter in milliseconds, xe
  ``device/tileN/gtM/gtidle/idle_residency_ms`` (the first GT of each tile, so the media GT of
  Meteor Lake and later is left out) and i915 ``gt/gt0/rc6_residency_ms`` (or the older
  ``power/rc6_residency_ms``). ``util_pct = 100 * (1 - idle / wall)`` over the interval. This is
  the share of time the GT was awake, which is an upper bound on engine busyness, not a per-engine
  figure.

Integrated GPUs without hwmon (Tiger Lake on xe) give ``None`` for power and temperature.

Power limits. The kernel documents these files, in microwatts, in
``Documentation/ABI/testing/sysfs-driver-intel-xe-hwmon`` and ``...-i915-hwmon`` (the version
given is the ``KernelVersion`` written there):

- ``power1_max``: card sustained limit, PL1; reads 0 when disabled (xe 6.5; i915 6.2, where it is
  the only channel and has no label).
- ``power2_max``: package sustained limit, PL1; 0 when disabled (xe 6.8).
- ``power1_cap`` / ``power2_cap``: card / package burst limit, PL2, over a shorter window than PL1
  and above it; 0 when disabled (xe 6.15; i915 documents no ``_cap``).
- ``power1_crit``: card reactive critical limit, I1 (xe 6.15, i915 6.2); server parts publish it
  as ``curr1_crit``, in milliamperes, instead.
- ``powerN_rated_max``: the card's or package's default TDP, not necessarily the limit in force.

xe labels its channels (``powerN_label``: ``card``, ``pkg``). The captures in
``tests/fixtures/sysfs`` show what real cards publish: an Arc A380 on xe ``power2_max`` (pkg)
only, the same card on i915 ``power1_max``; an Arc B580 on xe ``power1_cap`` and ``power1_crit``
(card) and no ``powerN_max`` at all; a B580 on kernel 6.16 only ``power1_crit``.

So ``power_limit_mw`` is, channel by channel in the order ``card``, ``pkg``, unlabelled (the
energy counter's order, so that a power and its limit are of the same domain), the first positive
``powerN_max`` (PL1), else ``powerN_cap`` (PL2): the sustained limit where the driver publishes
and enables it, else the burst limit, which is then the lowest limit the firmware enforces. A file
that is missing, unreadable or 0 is passed over; with none left the limit is ``None``.
``powerN_crit`` is never taken as the limit: it sits far above the others (380 W in both B580
captures, against a 180 W burst limit) and is kept apart as ``power_crit_mw``. ``rated_max`` is
not read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from probers.base import ProberUnavailable
from probers.records import DeviceSample, DeviceStatic
from probers.sysfs import drm_cards, hwmon_dirs, pci_bus_id, read_int, read_text, read_uevent

INTEL_DRIVERS = ("xe", "i915")
INTEL_VENDOR_ID = 0x8086
IGPU_BUS_ID = "0000:00:02.0"
"""Intel places its integrated GPU at this PCI address on every client platform."""


# --- PCI device ids ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntelModel:
    """What an Intel PCI device id tells: marketing name (when known), architecture, iGPU or not."""

    name: str | None
    arch: str
    """``codename/graphics-architecture``, e.g. ``dg2/xe-hpg`` or ``tgl/xe-lp``."""
    integrated: bool


def _ids(*ranges: tuple[int, int] | int) -> frozenset[int]:
    out: set[int] = set()
    for item in ranges:
        if isinstance(item, tuple):
            out.update(range(item[0], item[1] + 1))
        else:
            out.add(item)
    return frozenset(out)


# Family id sets after the kernel's include/drm/intel/pciids.h and xe_pciids.h.
_FAMILIES: tuple[tuple[frozenset[int], str, bool], ...] = (
    (_ids((0x9A40, 0x9A49), 0x9A59, 0x9A60, 0x9A68, 0x9A70, 0x9A78, 0x9AC0, 0x9AC9, 0x9AD9, 0x9AF8),
     "tgl/xe-lp", True),
    (_ids(0x4C80, 0x4C8A, 0x4C8B, 0x4C8C, 0x4C90, 0x4C9A), "rkl/xe-lp", True),
    (_ids(0x4680, 0x4682, 0x4688, 0x468A, 0x468B, 0x4690, 0x4692, 0x4693), "adl-s/xe-lp", True),
    (_ids((0x46A0, 0x46A3), 0x46A6, 0x46A8, 0x46AA, 0x462A, 0x4626, 0x4628, (0x46B0, 0x46B3),
          (0x46C0, 0x46C3)), "adl-p/xe-lp", True),
    (_ids((0x46D0, 0x46D4)), "adl-n/xe-lp", True),
    (_ids((0xA780, 0xA783), (0xA788, 0xA78B)), "rpl-s/xe-lp", True),
    (_ids(0xA720, 0xA7A0, 0xA7A8, 0xA7AA, 0xA7AB, 0xA721, 0xA7A1, 0xA7A9, 0xA7AC, 0xA7AD),
     "rpl-p/xe-lp", True),
    (_ids(0x7D40, 0x7D45, 0x7D55, 0x7D60, 0x7DD5), "mtl/xe-lpg", True),
    (_ids(0x7D41, 0x7D51, 0x7D67, 0x7DD1, 0xB640), "arl/xe-lpg", True),
    (_ids(0x6420, 0x64A0, 0x64B0), "lnl/xe2-lpg", True),
    (_ids((0x4905, 0x4909)), "dg1/xe-lp", False),
    (_ids((0x5690, 0x5697), (0x56A0, 0x56A6), (0x56B0, 0x56B3), (0x56BA, 0x56BF)),
     "dg2/xe-hpg", False),
    (_ids(0x56C0, 0x56C1, 0x56C2), "ats-m/xe-hpg", False),
    (_ids((0x0BD0, 0x0BDB), 0x0B69, 0x0B6E), "pvc/xe-hpc", False),
    (_ids(0xE202, 0xE20B, 0xE20C, 0xE20D, 0xE210, 0xE211, 0xE212, 0xE215, 0xE216),
     "bmg/xe2-hpg", False),
)  # fmt: skip

_NAMES: dict[int, str] = {
    0x56A0: "Intel Arc A770 Graphics",
    0x56A1: "Intel Arc A750 Graphics",
    0x56A2: "Intel Arc A580 Graphics",
    0x56A5: "Intel Arc A380 Graphics",
    0x56A6: "Intel Arc A310 Graphics",
    0x5690: "Intel Arc A770M Graphics",
    0x5691: "Intel Arc A730M Graphics",
    0x5692: "Intel Arc A550M Graphics",
    0x5693: "Intel Arc A370M Graphics",
    0x5694: "Intel Arc A350M Graphics",
    0x56C0: "Intel Data Center GPU Flex 170",
    0x56C1: "Intel Data Center GPU Flex 140",
    0x0BD5: "Intel Data Center GPU Max 1550",
    0x0BDA: "Intel Data Center GPU Max 1100",
    0xE20B: "Intel Arc B580 Graphics",
    0xE20C: "Intel Arc B570 Graphics",
    0x4905: "Intel Iris Xe MAX Graphics",
    0x9A40: "Intel Iris Xe Graphics",
    0x9A49: "Intel Iris Xe Graphics",
    0x46A6: "Intel Iris Xe Graphics",
    0x4C8A: "Intel UHD Graphics 750",
    0x7D55: "Intel Arc Graphics",
    0x64A0: "Intel Arc 130V/140V GPU",
}


def intel_model(device_id: int) -> IntelModel | None:
    """The model an Intel PCI device id belongs to, or ``None`` for an id not in the table."""
    for ids, arch, integrated in _FAMILIES:
        if device_id in ids:
            return IntelModel(name=_NAMES.get(device_id), arch=arch, integrated=integrated)
    return None


def intel_name(device_id: int) -> str:
    """The marketing name of an Intel PCI device id, else ``Intel GPU [8086:XXXX]``."""
    return _NAMES.get(device_id) or f"Intel GPU [8086:{device_id:04X}]"


# --- readers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntelFrequency:
    """GT clock of the first GT, in MHz: requested, actual (0 while the GT sleeps), and the cap."""

    cur_mhz: int | None
    act_mhz: int | None
    max_mhz: int | None


@dataclass(frozen=True, slots=True)
class IntelHwmon:
    """One reading of an Intel GPU's hwmon folder, converted to Shoal units."""

    energy_uj: int | None
    """The cumulative energy counter in microjoules (``card``, else ``pkg``, else unlabelled)."""
    energy_label: str | None
    power_limit_mw: int | None
    """The sustained limit, else the burst limit (:func:`read_power_limit`)."""
    power_limit_file: str | None
    """The file ``power_limit_mw`` came from (``power2_max``, ``power1_cap``, ...)."""
    power_crit_mw: int | None
    """The critical limit (``powerN_crit``), never taken as ``power_limit_mw``."""
    temp_c: float | None
    """The package (GPU) temperature."""
    vram_temp_c: float | None
    temp_crit_c: float | None


def _numbered(parent: Path, prefix: str) -> list[Path]:
    """``<prefix>N`` folders under ``parent``, sorted by N."""
    n = len(prefix)
    found = [p for p in parent.glob(f"{prefix}[0-9]*") if p.name[n:].isdigit() and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name[n:]))


def _primary_gts(device_dir: Path) -> list[Path]:
    """xe: the lowest-numbered ``gtN`` under each ``tileN`` (the media GT is a second gt)."""
    gts = (_numbered(tile, "gt") for tile in _numbered(device_dir, "tile"))
    return [found[0] for found in gts if found]


def read_frequency(card_dir: Path, driver: str) -> IntelFrequency:
    """The first GT's requested, actual and maximum frequency for an xe or i915 card."""
    if driver == "xe":
        gts = _primary_gts(card_dir / "device")
        if not gts:
            return IntelFrequency(None, None, None)
        freq = gts[0] / "freq0"
        return IntelFrequency(
            cur_mhz=read_int(freq / "cur_freq"),
            act_mhz=read_int(freq / "act_freq"),
            max_mhz=read_int(freq / "max_freq"),
        )
    gt = card_dir / "gt" / "gt0"

    def pick(name: str) -> int | None:
        value = read_int(card_dir / f"gt_{name}_freq_mhz")
        return value if value is not None else read_int(gt / f"rps_{name}_freq_mhz")

    return IntelFrequency(cur_mhz=pick("cur"), act_mhz=pick("act"), max_mhz=pick("max"))


def read_idle_residency_ms(card_dir: Path, driver: str) -> tuple[int, int] | None:
    """``(idle milliseconds summed over GTs, number of GTs)``, or ``None`` where not exposed."""
    if driver == "xe":
        values = [
            read_int(gt / "gtidle" / "idle_residency_ms")
            for gt in _primary_gts(card_dir / "device")
        ]
        known = [v for v in values if v is not None]
        return (sum(known), len(known)) if known else None
    for path in (
        card_dir / "gt" / "gt0" / "rc6_residency_ms",
        card_dir / "power" / "rc6_residency_ms",
    ):
        value = read_int(path)
        if value is not None:
            return (value, 1)
    return None


def _labelled(hwmon: Path, kind: str, suffix: str) -> dict[str, Path]:
    """``{label: path}`` for ``<kind>N_<suffix>`` files; an unlabelled channel is keyed ``""``.

    N is digits only: asking for ``power`` ``max`` must not also find ``power1_rated_max``.
    """
    found: dict[str, Path] = {}
    for path in sorted(hwmon.glob(f"{kind}[0-9]*_{suffix}")):
        channel = path.name[: -len(suffix) - 1]
        if not channel[len(kind) :].isdigit():
            continue
        label = (read_text(hwmon / f"{channel}_label") or "").lower()
        found.setdefault(label, path)
    return found


def _pick(found: dict[str, Path], *labels: str) -> Path | None:
    return next((found[label] for label in labels if label in found), None)


def _micro_to_milli(value: int | None) -> int | None:
    return value // 1000 if value is not None and value > 0 else None


def _milli_to_c(value: int | None) -> float | None:
    return value / 1000 if value is not None else None


CHANNEL_ORDER = ("card", "pkg", "")
"""hwmon channel labels in the order they are taken: xe's card, xe's package, i915's unlabelled."""
POWER_LIMIT_ORDER = ("max", "cap")
"""Within a channel: sustained limit PL1 (``powerN_max``), else burst limit PL2 (``powerN_cap``)."""


def read_power_limit(hwmon: Path) -> tuple[int, str] | None:
    """``(microwatts, file name)`` of the limit in force, or ``None``; see the module docstring."""
    found = {suffix: _labelled(hwmon, "power", suffix) for suffix in POWER_LIMIT_ORDER}
    for label in CHANNEL_ORDER:
        for suffix in POWER_LIMIT_ORDER:
            path = found[suffix].get(label)
            value = read_int(path) if path is not None else None
            if path is not None and value is not None and value > 0:
                return value, path.name
    return None


def read_hwmon(device_dir: Path) -> IntelHwmon | None:
    """The first hwmon folder of an Intel GPU, or ``None`` when the driver exposes none."""
    dirs = hwmon_dirs(device_dir)
    if not dirs:
        return None
    hwmon = dirs[0]
    energy = _labelled(hwmon, "energy", "input")
    energy_label = next((label for label in CHANNEL_ORDER if label in energy), None)
    energy_path = energy[energy_label] if energy_label is not None else None
    limit = read_power_limit(hwmon)
    power_crit = _pick(_labelled(hwmon, "power", "crit"), *CHANNEL_ORDER)
    temps = _labelled(hwmon, "temp", "input")
    temp_path = _pick(temps, "pkg", "")
    crit_path = (
        temp_path.with_name(temp_path.name.replace("_input", "_crit")) if temp_path else None
    )
    return IntelHwmon(
        energy_uj=read_int(energy_path) if energy_path else None,
        energy_label=energy_label or None,
        power_limit_mw=_micro_to_milli(limit[0]) if limit else None,
        power_limit_file=limit[1] if limit else None,
        power_crit_mw=_micro_to_milli(read_int(power_crit)) if power_crit else None,
        temp_c=_milli_to_c(read_int(temp_path)) if temp_path else None,
        vram_temp_c=_milli_to_c(read_int(temps["vram"])) if "vram" in temps else None,
        temp_crit_c=_milli_to_c(read_int(crit_path)) if crit_path else None,
    )


def read_vram_bytes(device_dir: Path) -> int | None:
    """xe: the sum of ``tileN/physical_vram_size_bytes``; ``None`` where no tile publishes it."""
    sizes = [read_int(tile / "physical_vram_size_bytes") for tile in _numbered(device_dir, "tile")]
    known = [s for s in sizes if s]
    return sum(known) if known else None


# --- counters ----------------------------------------------------------------------------------


def power_mw_from_energy(
    prev_uj: int | None, prev_s: float, now_uj: int | None, now_s: float
) -> tuple[int | None, str | None]:
    """Mean power between two energy readings, with the reason when it cannot be told."""
    if now_uj is None or prev_uj is None:
        return None, None
    if now_uj == 0:
        return None, "energy counter reads 0"
    dt = now_s - prev_s
    if dt <= 0:
        return None, None
    if now_uj < prev_uj:
        return None, "energy counter went backwards (wrap or reset)"
    if now_uj == prev_uj:
        return None, "energy counter did not advance"
    return round((now_uj - prev_uj) / dt / 1000), None


def busy_pct_from_idle(
    prev_idle_ms: int | None, prev_s: float, now_idle_ms: int | None, now_s: float, gts: int = 1
) -> float | None:
    """``100 * (1 - idle / wall)`` over the interval, clamped to 0..100; ``None`` if unknowable."""
    if prev_idle_ms is None or now_idle_ms is None or now_idle_ms < prev_idle_ms or gts < 1:
        return None
    wall_ms = (now_s - prev_s) * 1000 * gts
    if wall_ms <= 0:
        return None
    busy = 100.0 * (1.0 - (now_idle_ms - prev_idle_ms) / wall_ms)
    return min(100.0, max(0.0, busy))


# --- the prober --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Card:
    key: str
    driver: str
    card_dir: Path


@dataclass(frozen=True, slots=True)
class _Reading:
    at_s: float
    energy_uj: int | None
    idle_ms: int | None
    gts: int


class IntelSysfsProber:
    """Intel GPUs on the ``xe`` and ``i915`` drivers, read from ``root/sys/class/drm``."""

    source = "intel-sysfs"

    min_interval_s = 0.2
    """Power and busy % are rates over the time between two readings; shorter is noise."""

    def __init__(self, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic) -> None:
        self._root = root
        self._clock = clock
        self._cards: list[_Card] = []
        self._last: dict[str, _Reading] = {}

    def discover(self) -> Sequence[DeviceStatic]:
        statics: list[DeviceStatic] = []
        self._cards = []
        self._last = {}
        for card_dir in drm_cards(self._root):
            device_dir = card_dir / "device"
            uevent = read_uevent(device_dir / "uevent")
            driver = uevent.get("DRIVER", "")
            if driver not in INTEL_DRIVERS:
                continue
            statics.append(self._static(card_dir, driver, uevent, vendor_index=len(statics)))
        if not statics:
            raise ProberUnavailable("no drm card on the xe or i915 driver")
        for card in self._cards:
            self._last[card.key] = self._read(card, read_hwmon(card.card_dir / "device"))
        return statics

    def _static(
        self, card_dir: Path, driver: str, uevent: dict[str, str], vendor_index: int
    ) -> DeviceStatic:
        device_dir = card_dir / "device"
        bus_id = pci_bus_id(device_dir)
        device_id = _device_id(device_dir, uevent)
        model = intel_model(device_id) if device_id is not None else None
        integrated = model.integrated if model else bus_id == IGPU_BUS_ID
        key = f"pci:{bus_id}" if bus_id else f"drm:{card_dir.name}"
        self._cards.append(_Card(key, driver, card_dir))
        vram = None if integrated else read_vram_bytes(device_dir)
        if integrated:
            note = "integrated GPU: uses system memory; the driver does not tell its share"
        elif vram is None:
            note = f"{driver} does not expose the VRAM size here"
        else:
            note = None
        hwmon = read_hwmon(device_dir)
        return DeviceStatic(
            key=key,
            vendor="intel",
            backend="xpu",
            name=intel_name(device_id) if device_id is not None else "Intel GPU",
            source=f"{driver}-sysfs",
            vendor_index=vendor_index,
            pci_bus_id=bus_id,
            arch=model.arch if model else None,
            unified_memory=integrated,
            mem_total_bytes=vram,
            mem_note=note,
            temp_slowdown_c=hwmon.temp_crit_c if hwmon else None,
        )

    def _read(self, card: _Card, hwmon: IntelHwmon | None) -> _Reading:
        idle = read_idle_residency_ms(card.card_dir, card.driver)
        return _Reading(
            at_s=self._clock(),
            energy_uj=hwmon.energy_uj if hwmon else None,
            idle_ms=idle[0] if idle else None,
            gts=idle[1] if idle else 0,
        )

    def sample(self) -> Sequence[DeviceSample]:
        return [self._sample(card) for card in self._cards]

    def _sample(self, card: _Card) -> DeviceSample:
        device_dir = card.card_dir / "device"
        if read_uevent(device_dir / "uevent").get("DRIVER") != card.driver:
            return DeviceSample(key=card.key, healthy=False, error=f"{card.driver} device is gone")
        hwmon = read_hwmon(device_dir)
        now = self._read(card, hwmon)
        prev = self._last.get(card.key)
        power_mw: int | None = None
        why: str | None = None
        busy: float | None = None
        if prev is not None and now.at_s - prev.at_s >= self.min_interval_s:
            power_mw, why = power_mw_from_energy(prev.energy_uj, prev.at_s, now.energy_uj, now.at_s)
            if prev.gts == now.gts:
                busy = busy_pct_from_idle(prev.idle_ms, prev.at_s, now.idle_ms, now.at_s, now.gts)
        if prev is None or now.at_s - prev.at_s >= self.min_interval_s:
            # A shorter interval keeps the older baseline: millisecond counters over a few
            # milliseconds would read as 0% or 100% busy.
            self._last[card.key] = now
        if hwmon is None:
            why = "no hwmon: the driver exposes no power or temperature for this GPU"
        return DeviceSample(
            key=card.key,
            util_pct=busy,
            temp_c=hwmon.temp_c if hwmon else None,
            power_mw=power_mw,
            power_limit_mw=hwmon.power_limit_mw if hwmon else None,
            error=why,
        )

    def frequency(self, key: str) -> IntelFrequency | None:
        """The current GT frequencies of a discovered device, by key."""
        for card in self._cards:
            if card.key == key:
                return read_frequency(card.card_dir, card.driver)
        return None

    def close(self) -> None:
        self._cards = []
        self._last = {}


def _device_id(device_dir: Path, uevent: dict[str, str]) -> int | None:
    """The PCI device id from ``device/device`` or the uevent ``PCI_ID=8086:56A5``."""
    value = read_int(device_dir / "device", 16)
    if value is not None:
        return value
    pci_id = uevent.get("PCI_ID", "")
    _, _, dev = pci_id.partition(":")
    try:
        return int(dev, 16) if dev else None
    except ValueError:
        return None
