"""AMD GPUs through Linux sysfs: the amdgpu driver's files, its hwmon, and the KFD topology.

Every ``sys/class/drm/cardN`` whose ``device/uevent`` says ``DRIVER=amdgpu`` is a device, whatever
its PCI class (Instinct boards are 0x0380, not 0x0300). Per card:

- name: ``product_name`` (boards with a FRU), else libdrm's ``amdgpu.ids`` under the root, else a
  small built-in table, else ``AMD GPU [1002:XXXX]``.
- key: ``amd:<unique_id>`` (the 16 hex digits amdgpu prints; ROCm's UUID is ``GPU-`` + the same
  digits, which ``ROCR_VISIBLE_DEVICES`` accepts), else ``drm:cardN``.
- gfx target, compute units and links from the KFD node of the same PCI address (else the same
  render minor, else the same unique id). ``vendor_index`` is the node's rank among KFD GPU nodes,
  which is ROCm's enumeration order; without KFD, the card's rank among amdgpu cards.
- temperature: the hwmon sensor labelled ``junction`` (hotspot) if there is one, else ``edge``;
  ``temp_slowdown_c`` is that same sensor's ``_crit``, so a temperature is always judged against
  its own threshold. Power: ``power1_average``, else ``power1_input`` (microwatts).
- power limit: ``power1_cap``, the "selected power cap" in microwatts of the kernel's amdgpu hwmon
  doc (``Documentation/gpu/amdgpu/thermal.rst``, which includes the ``hwmon`` DOC block of
  ``drivers/gpu/drm/amd/pm/amdgpu_pm.c``), labelled ``PPT``; its ``_cap_max``, ``_cap_min`` and
  ``_cap_default`` are a range and a default, not the limit in force, and are not read. A cap that
  reads 0 or empty (the driver prints an empty line when it cannot get the limit) is ``None``.
  ``power2_cap`` is not in that doc; ``amdgpu_pm.c`` shows it only on Van Gogh (GC 10.3.1), where
  ``power1`` is labelled ``slowPPT`` and ``power2`` ``fastPPT``, the short-window limit, always
  next to ``power1_cap``: so the sustained ``power1_cap`` is the limit and ``power2_cap`` is not
  read. The driver hides ``power1_cap`` on APUs other than GC 10.3.1 and 9.4.3, so a Phoenix APU
  has no limit (``None``).
- links: KFD ``io_links`` to another GPU node (xGMI is type 11, PCIe type 2) and ``p2p_links``
  (peer paths through the CPUs, reported as ``pcie``). Bandwidth is KFD's ``max_bandwidth``
  (megabytes per second) times 8. The PCIe link to the host is kept as a note, not a Link.

APU rule (shared memory), first match wins, the reason is kept in :attr:`AmdgpuCard.apu_reason`:

1. the card's KFD GPU node also has CPU cores (kernels that expose an APU as one combined node);
2. ``gpu_metrics`` uses format revision 2 or 3, layouts amdgpu uses only for APUs (dGPUs and
   Instinct boards use revision 1);
3. VRAM under 1 GiB with GTT present (a BIOS carve-out).

Recent kernels give a Phoenix APU its own GPU node without CPU cores and a carve-out of several GiB,
so rules 1 and 3 both miss it and rule 2 is what finds it. An APU's ``mem_total_bytes`` is VRAM
carve-out + GTT (the system memory the GPU may map) and its used memory is the sum of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from probers.base import ProberUnavailable
from probers.gpu_metrics import NOT_PARSED, GpuMetrics
from probers.gpu_metrics import parse as parse_metrics
from probers.kfd import KfdNode, KfdTopology, read_topology
from probers.pcie import link_bytes_per_s, parse_link_speed
from probers.records import DeviceSample, DeviceStatic, Link
from probers.sysfs import drm_cards, hwmon_dirs, pci_bus_id, read_int, read_text, read_uevent

SOURCE = "amdgpu-sysfs"
AMD_VENDOR_ID = 0x1002
APU_VRAM_BELOW_BYTES = 1 << 30
"""Rule 3: less VRAM than this, with GTT present, is taken as an APU's carve-out."""
AMDGPU_IDS = (
    Path("usr/share/libdrm/amdgpu.ids"),
    Path("opt/amdgpu/share/libdrm/amdgpu.ids"),
)

_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class _Model:
    name: str
    gfx_target: str
    by_revision: tuple[tuple[int, str], ...] = ()


# Names as libdrm's amdgpu.ids spells them; the gfx target is the one ROCm uses for the chip.
_MODELS: dict[int, _Model] = {
    0x67DF: _Model(
        "AMD Radeon RX 470/480/570/580/590 (Polaris 10)",
        "gfx803",
        (
            (0xE1, "AMD Radeon RX 590 Series"),
            (0xE7, "AMD Radeon RX 580 Series"),
            (0xEF, "AMD Radeon RX 570 Series"),
        ),
    ),
    0x73BF: _Model(
        "AMD Radeon RX 6800/6800 XT/6900 XT (Navi 21)",
        "gfx1030",
        (
            (0xC0, "AMD Radeon RX 6900 XT"),
            (0xC1, "AMD Radeon RX 6800 XT"),
            (0xC3, "AMD Radeon RX 6800"),
        ),
    ),
    0x15BF: _Model(
        "AMD Radeon 780M/760M/740M Graphics (Phoenix)",
        "gfx1103",
        ((0xDD, "AMD Radeon 780M Graphics"),),
    ),
    0x738C: _Model("AMD Instinct MI100", "gfx908"),
    0x740C: _Model("AMD Instinct MI250X / MI250", "gfx90a"),
    0x740F: _Model("AMD Instinct MI210", "gfx90a"),
}


@dataclass(frozen=True, slots=True)
class AmdgpuCard:
    """What discovery learned about one amdgpu card: its record and where to sample it."""

    static: DeviceStatic
    card: str
    """``card0``: the DRM card folder's name."""
    device_dir: Path
    hwmon_dir: Path | None
    temp_index: int | None
    """N of the hwmon ``tempN_input`` reported as ``temp_c``."""
    temp_label: str | None
    apu_reason: str | None
    """Why the card is taken for an APU (see the module's rule); ``None`` for a discrete GPU."""
    gtt_in_total: bool
    """The card's memory total includes GTT, so used memory includes GTT too (APUs)."""
    pcie: str | None
    """PCIe link to the host, e.g. ``PCIe 16.0 GT/s x16, max 16.0 GT/s x16``."""
    kfd_node: int | None
    expected: frozenset[str]
    """The readings that answered at discovery; one missing later is named in the sample."""


def parse_amdgpu_ids(text: str | None) -> dict[tuple[int, int], str]:
    """libdrm's ``amdgpu.ids``: ``DEVICE,\\tREVISION,\\tNAME`` lines (hex) after a version line."""
    names: dict[tuple[int, int], str] = {}
    for line in (text or "").splitlines():
        parts = [part.strip() for part in line.split(",", 2)]
        if line.startswith("#") or len(parts) != 3 or not parts[2]:
            continue
        try:
            names[(int(parts[0], 16), int(parts[1], 16))] = parts[2]
        except ValueError:
            continue
    return names


def _pci_ids(device_dir: Path) -> tuple[int | None, int | None]:
    """(vendor, device) from ``uevent`` ``PCI_ID``, else the ``vendor``/``device`` files."""
    pci_id = read_uevent(device_dir / "uevent").get("PCI_ID", "")
    vendor_text, _, device_text = pci_id.partition(":")
    try:
        return int(vendor_text, 16), int(device_text, 16)
    except ValueError:
        return read_int(device_dir / "vendor", 16), read_int(device_dir / "device", 16)


def _model_name(device_id: int | None, revision: int | None) -> str | None:
    model = _MODELS.get(device_id) if device_id is not None else None
    if model is None:
        return None
    return dict(model.by_revision).get(revision, model.name) if revision is not None else model.name


def _gpu_metrics_format(device_dir: Path) -> int | None:
    """The ``format_revision`` byte of the binary ``gpu_metrics`` header, if readable."""
    try:
        with (device_dir / "gpu_metrics").open("rb") as handle:
            header = handle.read(4)
    except OSError:
        return None
    if len(header) < 4 or int.from_bytes(header[:2], "little") <= 4:
        return None
    return header[2]


def _apu_reason(
    node: KfdNode | None, device_dir: Path, vram: int | None, gtt: int | None
) -> str | None:
    if node is not None and node.cpu_cores_count > 0:
        return f"KFD node {node.node_id} has {node.cpu_cores_count} CPU cores"
    metrics = _gpu_metrics_format(device_dir)
    if metrics in (2, 3):
        return f"gpu_metrics format {metrics} (APU layout)"
    if vram is not None and gtt and vram < APU_VRAM_BELOW_BYTES:
        return "VRAM carve-out under 1 GiB with GTT"
    return None


def _pcie_note(device_dir: Path) -> str | None:
    def link(prefix: str) -> str | None:
        speed = read_text(device_dir / f"{prefix}_link_speed")
        width = read_text(device_dir / f"{prefix}_link_width")
        if speed is None or speed.lower().startswith("unknown"):
            return None
        speed = speed.removesuffix("PCIe").strip()
        return f"{speed} x{width}" if width else speed

    current, maximum = link("current"), link("max")
    parts = [part for part in (current, f"max {maximum}" if maximum else None) if part]
    return "PCIe " + ", ".join(parts) if parts else None


def _render_minor(card_dir: Path) -> int | None:
    """The card's render node minor (``device/drm/renderD128`` -> 128), when listed."""
    drm = card_dir / "device" / "drm"
    try:
        names = [p.name for p in drm.iterdir()] if drm.is_dir() else []
    except OSError:
        return None
    minors = [int(n[7:]) for n in names if n.startswith("renderD") and n[7:].isdigit()]
    return minors[0] if minors else None


def _hwmon(device_dir: Path) -> Path | None:
    dirs = hwmon_dirs(device_dir)
    named = [d for d in dirs if read_text(d / "name") == "amdgpu"]
    found = named or dirs
    return found[0] if found else None


def _temp_sensor(hwmon: Path | None) -> tuple[int | None, str | None]:
    """(N, label) of the sensor to report: ``junction`` if present, else ``edge``."""
    if hwmon is None:
        return None, None
    labels: dict[str, int] = {}
    try:
        inputs = sorted(p.name for p in hwmon.iterdir() if p.name.startswith("temp"))
    except OSError:
        return None, None
    for name in inputs:
        index = name[4:].removesuffix("_input")
        if name.endswith("_input") and index.isdigit():
            label = read_text(hwmon / f"temp{index}_label") or ("edge" if index == "1" else "")
            labels.setdefault(label, int(index))
    for wanted in ("junction", "edge"):
        if wanted in labels:
            return labels[wanted], wanted
    return None, None


def _milli(value: int | None) -> float | None:
    return None if value is None else value / 1000


def _micro_to_milli(value: int | None) -> int | None:
    return None if value is None else value // 1000


@dataclass(frozen=True, slots=True)
class _Reading:
    mem_used_bytes: int | None
    util_pct: float | None
    temp_c: float | None
    power_mw: int | None
    power_limit_mw: int | None
    answered: frozenset[str]
    mem_bw_pct: float | None = None
    sm_clock_mhz: float | None = None
    throttled: bool | None = None
    pcie_link_bytes_per_s: float | None = None
    metrics_note: str | None = None
    """Why the ``gpu_metrics`` blob gave nothing, when it did not (an unparsed revision)."""


def _read_dynamic(
    device_dir: Path, hwmon: Path | None, temp_index: int | None, gtt_in_total: bool
) -> _Reading:
    answered: set[str] = set()

    def take(name: str, value: int | None) -> int | None:
        if value is not None:
            answered.add(name)
        return value

    vram = take("mem_info_vram_used", read_int(device_dir / "mem_info_vram_used"))
    mem_used = vram
    if gtt_in_total:
        gtt = take("mem_info_gtt_used", read_int(device_dir / "mem_info_gtt_used"))
        mem_used = None if vram is None or gtt is None else vram + gtt
    busy = take("gpu_busy_percent", read_int(device_dir / "gpu_busy_percent"))
    temp = power = cap = None
    if hwmon is not None:
        if temp_index is not None:
            temp = take(f"temp{temp_index}_input", read_int(hwmon / f"temp{temp_index}_input"))
        power = take("power1_average", read_int(hwmon / "power1_average"))
        if power is None:
            power = take("power1_input", read_int(hwmon / "power1_input"))
        cap = take("power1_cap", read_int(hwmon / "power1_cap"))
    mem_busy = take("mem_busy_percent", read_int(device_dir / "mem_busy_percent"))
    metrics, note = _metrics(device_dir)
    link = metrics.pcie_link_bytes_per_s
    if link is None:
        speed = read_text(device_dir / "current_link_speed")
        width = read_int(device_dir / "current_link_width")
        link = link_bytes_per_s(None if speed is None else parse_link_speed(speed), width)
    return _Reading(
        mem_used_bytes=mem_used,
        util_pct=None if busy is None else float(busy),
        temp_c=_milli(temp),
        power_mw=_micro_to_milli(power),
        power_limit_mw=_micro_to_milli(cap) or None,
        answered=frozenset(answered),
        mem_bw_pct=float(mem_busy) if mem_busy is not None else metrics.umc_activity_pct,
        sm_clock_mhz=metrics.gfx_clock_mhz,
        throttled=metrics.throttled,
        pcie_link_bytes_per_s=link,
        metrics_note=note,
    )


def _metrics(device_dir: Path) -> tuple[GpuMetrics, str | None]:
    """The ``gpu_metrics`` blob's fields, and why none where it gave none."""
    try:
        with (device_dir / "gpu_metrics").open("rb") as f:
            blob = f.read(4096)
    except OSError:
        return NOT_PARSED, None  # no blob: this card's driver has none
    try:
        revision, metrics = parse_metrics(blob)
    except ValueError as exc:
        return NOT_PARSED, str(exc)
    if metrics is NOT_PARSED:
        return metrics, f"gpu_metrics {revision}: a layout not read yet"
    return metrics, None


class AmdgpuProber:
    """AMD GPUs under ``root`` through amdgpu sysfs, hwmon and KFD (source ``amdgpu-sysfs``)."""

    source = SOURCE

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self.cards: tuple[AmdgpuCard, ...] = ()
        self.topology: KfdTopology | None = None
        self._discovered = False

    def discover(self) -> Sequence[DeviceStatic]:
        """Every amdgpu card; :class:`ProberUnavailable` when there is none."""
        amd_cards = [
            card_dir
            for card_dir in drm_cards(self.root)
            if read_uevent(card_dir / "device" / "uevent").get("DRIVER") == "amdgpu"
        ]
        if not amd_cards:
            raise ProberUnavailable(f"no amdgpu card under {self.root / 'sys/class/drm'}")
        self.topology = read_topology(self.root)
        ids = parse_amdgpu_ids(
            next((read_text(self.root / p) for p in AMDGPU_IDS if (self.root / p).is_file()), None)
        )
        driver_version = read_text(self.root / "sys/module/amdgpu/version")
        cards = [
            self._read_card(card_dir, position, ids, driver_version)
            for position, card_dir in enumerate(amd_cards)
        ]
        node_keys = {c.kfd_node: c.static.key for c in cards if c.kfd_node is not None}
        self.cards = tuple(
            replace(c, static=replace(c.static, links=self._links(c.kfd_node, node_keys)))
            for c in cards
        )
        self._discovered = True
        return [card.static for card in self.cards]

    def sample(self) -> Sequence[DeviceSample]:
        """A fresh reading of every discovered card; a failing card is unhealthy, never raised."""
        if not self._discovered:
            try:
                self.discover()
            except ProberUnavailable:
                return []
        return [self._sample_card(card) for card in self.cards]

    def close(self) -> None:
        """Nothing to release: every reading opens and closes its own file."""

    def _read_card(
        self,
        card_dir: Path,
        position: int,
        ids: dict[tuple[int, int], str],
        driver_version: str | None,
    ) -> AmdgpuCard:
        device_dir = card_dir / "device"
        bus_id = pci_bus_id(device_dir)
        unique = (read_text(device_dir / "unique_id") or "").lower() or None
        node = None
        if self.topology is not None:
            node = self.topology.gpu_for(
                pci_bus_id=bus_id, render_minor=_render_minor(card_dir), unique_id_hex=unique
            )
        if unique is None and node is not None:
            unique = node.unique_id_hex
        vendor_id, device_id = _pci_ids(device_dir)
        revision = read_int(device_dir / "revision", 16)
        name = read_text(device_dir / "product_name")
        if name is None and device_id is not None and revision is not None:
            name = ids.get((device_id, revision))
        name = name or _model_name(device_id, revision)
        if name is None:
            name = f"AMD GPU [{vendor_id or AMD_VENDOR_ID:04X}:{device_id or 0:04X}]"
        gfx = node.gfx_target if node is not None else None
        if gfx is None and device_id in _MODELS:
            gfx = _MODELS[device_id].gfx_target

        vram = read_int(device_dir / "mem_info_vram_total")
        gtt = read_int(device_dir / "mem_info_gtt_total")
        apu_reason = _apu_reason(node, device_dir, vram, gtt)
        gtt_in_total = apu_reason is not None and gtt is not None
        mem_total, mem_note = vram, None
        if apu_reason is not None:
            mem_total = None if vram is None else vram + (gtt or 0)
            mem_note = f"APU: {vram / _GIB:.1f} GiB VRAM carve-out" if vram is not None else None
            if mem_note and gtt_in_total and gtt is not None:
                mem_note += f" + {gtt / _GIB:.1f} GiB GTT (shared system memory)"

        hwmon = _hwmon(device_dir)
        temp_index, temp_label = _temp_sensor(hwmon)
        slowdown = None
        if hwmon is not None and temp_index is not None:
            slowdown = _milli(read_int(hwmon / f"temp{temp_index}_crit"))
        gpus = self.topology.gpus if self.topology is not None else ()
        static = DeviceStatic(
            key=f"amd:{unique}" if unique else f"drm:{card_dir.name}",
            vendor="amd",
            backend="rocm",
            name=name,
            source=SOURCE,
            vendor_index=gpus.index(node) if node is not None else position,
            uuid=f"GPU-{unique}" if unique else None,
            pci_bus_id=bus_id,
            arch=gfx,
            compute_capability=gfx,
            unified_memory=apu_reason is not None,
            mem_total_bytes=mem_total,
            mem_note=mem_note,
            compute_units=node.compute_units if node is not None else None,
            temp_slowdown_c=slowdown,
            driver_version=driver_version,
        )
        first = _read_dynamic(device_dir, hwmon, temp_index, gtt_in_total)
        return AmdgpuCard(
            static=static,
            card=card_dir.name,
            device_dir=device_dir,
            hwmon_dir=hwmon,
            temp_index=temp_index,
            temp_label=temp_label,
            apu_reason=apu_reason,
            gtt_in_total=gtt_in_total,
            pcie=_pcie_note(device_dir),
            kfd_node=node.node_id if node is not None else None,
            expected=first.answered,
        )

    def _links(self, node_id: int | None, node_keys: dict[int, str]) -> tuple[Link, ...]:
        topology = self.topology
        node = topology.node(node_id) if topology is not None and node_id is not None else None
        if topology is None or node is None:
            return ()
        links: list[Link] = []
        seen: set[int] = set()
        for kfd_link in (*node.io_links, *node.p2p_links):
            peer = topology.node(kfd_link.node_to)
            kind = kfd_link.kind
            if peer is None or not peer.is_gpu or kind is None or peer.node_id in seen:
                continue
            seen.add(peer.node_id)
            hops = 1 if not kfd_link.indirect else topology.hops(node.node_id, peer.node_id)
            detail = f"hops={hops if hops is not None else '?'} weight={kfd_link.weight}"
            bandwidth = kfd_link.max_bandwidth_mbytes_s
            links.append(
                Link(
                    peer=node_keys.get(peer.node_id) or _node_key(peer),
                    kind=kind,
                    bandwidth_mbps=bandwidth * 8 if bandwidth else None,
                    detail=f"p2p {detail}" if kfd_link.indirect else detail,
                )
            )
        return tuple(links)

    def _sample_card(self, card: AmdgpuCard) -> DeviceSample:
        key = card.static.key
        try:
            if not card.device_dir.is_dir():
                return DeviceSample(key=key, healthy=False, error="device folder is gone")
            reading = _read_dynamic(
                card.device_dir, card.hwmon_dir, card.temp_index, card.gtt_in_total
            )
        except Exception as exc:  # a device-level failure must never stop the host's probe
            return DeviceSample(key=key, healthy=False, error=f"{type(exc).__name__}: {exc}")
        missing = sorted(card.expected - reading.answered)
        return DeviceSample(
            key=key,
            mem_used_bytes=reading.mem_used_bytes,
            util_pct=reading.util_pct,
            temp_c=reading.temp_c,
            power_mw=reading.power_mw,
            power_limit_mw=reading.power_limit_mw,
            error=f"not readable now: {', '.join(missing)}" if missing else reading.metrics_note,
            mem_bw_pct=reading.mem_bw_pct,
            sm_clock_mhz=reading.sm_clock_mhz,
            throttled=reading.throttled,
            pcie_link_bytes_per_s=reading.pcie_link_bytes_per_s,
        )


def _node_key(node: KfdNode) -> str:
    """The key of a KFD GPU node no DRM card matched (it is then not reported itself)."""
    return f"amd:{node.unique_id_hex}" if node.unique_id_hex else f"kfd:{node.node_id}"
