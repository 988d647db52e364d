"""The AMD KFD topology (``sys/class/kfd/kfd/topology``) as frozen records.

KFD is the kernel side of ROCm. It lists one node per CPU socket and one per GPU (per partition on
partitioned Instinct parts), each with a ``properties`` file of ``name value`` lines, and the links
between nodes: ``io_links`` are direct links (PCIe to the CPU, xGMI to a peer GPU), ``p2p_links``
are the peer-to-peer paths the kernel derived through other nodes (GPU -> CPU -> CPU -> GPU).

Numbers are read the way ROCm's thunk reads them: every value is an unsigned decimal, and
``gfx_target_version`` is ``major * 10000 + minor * 100 + stepping``, named ``gfx`` + major in
decimal + minor and stepping in hex (``90010`` -> ``gfx90a``, ``110003`` -> ``gfx1103``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from probers.sysfs import read_int, read_text

TOPOLOGY = Path("sys/class/kfd/kfd/topology")

IOLINK_TYPE_HYPERTRANSPORT = 1
IOLINK_TYPE_PCIE = 2
IOLINK_TYPE_QPI = 5
IOLINK_TYPE_XGMI = 11
"""``HSA_IOLINK_TYPE_*`` values from ROCm's ``hsakmttypes.h`` that matter to placement."""


def parse_properties(text: str | None) -> dict[str, int]:
    """``name value`` lines as a dict; lines whose value is not an unsigned integer are skipped."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    return values


def gfx_target_name(version: int | None) -> str | None:
    """ROCm's name for a ``gfx_target_version`` (``90010`` -> ``gfx90a``); ``None`` for 0."""
    if not version:
        return None
    major, minor, stepping = version // 10000 % 100, version // 100 % 100, version % 100
    if minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


@dataclass(frozen=True, slots=True)
class KfdLink:
    """One link out of a KFD node, as ``io_links/M/properties`` or ``p2p_links/M/properties``."""

    node_from: int
    node_to: int
    link_type: int
    """``HSA_IOLINK_TYPE_*``: 2 is PCIe, 11 is xGMI, 1 (HyperTransport) or 5 (QPI) join CPUs."""
    weight: int | None
    """The kernel's relative cost of the link (xGMI 15 per hop, PCIe 20, CPU to CPU 32, ...)."""
    min_bandwidth_mbytes_s: int | None
    """Minimum bandwidth in megabytes per second; ``None`` when the kernel reports 0."""
    max_bandwidth_mbytes_s: int | None
    """Maximum bandwidth in megabytes per second; ``None`` when the kernel reports 0."""
    indirect: bool = False
    """True for a ``p2p_links`` entry: a peer path through other nodes, not a direct link."""

    @property
    def kind(self) -> Literal["xgmi", "pcie"] | None:
        """The link as Shoal names it, or ``None`` for a CPU-to-CPU or unknown link type."""
        if self.link_type == IOLINK_TYPE_XGMI:
            return "xgmi"
        if self.link_type == IOLINK_TYPE_PCIE:
            return "pcie"
        return None


@dataclass(frozen=True, slots=True)
class KfdNode:
    """One KFD topology node: a CPU socket or a GPU (partition)."""

    node_id: int
    gpu_id: int | None
    """KFD's own GPU handle (``nodes/N/gpu_id``); 0 or ``None`` for a CPU node."""
    cpu_cores_count: int
    simd_count: int
    simd_per_cu: int
    gfx_target_version: int | None
    vendor_id: int | None
    device_id: int | None
    location_id: int | None
    """PCI ``bus << 8 | device << 3 | function`` of a GPU node."""
    domain: int | None
    unique_id: int | None
    """The GPU's 64-bit unique id (the same number amdgpu prints in hex); ``None`` when 0."""
    drm_render_minor: int | None
    hive_id: int | None
    """The xGMI hive this GPU belongs to; ``None`` when 0 (no hive)."""
    io_links: tuple[KfdLink, ...] = ()
    p2p_links: tuple[KfdLink, ...] = ()

    @property
    def is_cpu(self) -> bool:
        """A node with no SIMDs is a CPU node (an old combined APU node has both)."""
        return self.simd_count == 0

    @property
    def is_gpu(self) -> bool:
        return self.simd_count > 0

    @property
    def compute_units(self) -> int | None:
        if self.simd_count <= 0 or self.simd_per_cu <= 0:
            return None
        return self.simd_count // self.simd_per_cu

    @property
    def gfx_target(self) -> str | None:
        """ROCm's gfx target name (``gfx90a``), or ``None`` for a CPU node or an old kernel."""
        return gfx_target_name(self.gfx_target_version) if self.is_gpu else None

    @property
    def pci_bus_id(self) -> str | None:
        """``0000:63:00.0`` from ``domain`` and ``location_id``; ``None`` for a CPU node."""
        if not self.is_gpu or self.location_id is None:
            return None
        bus, devfn = self.location_id >> 8 & 0xFF, self.location_id & 0xFF
        return f"{self.domain or 0:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"

    @property
    def unique_id_hex(self) -> str | None:
        """The unique id as amdgpu's ``unique_id`` file and ROCm's ``GPU-`` UUIDs spell it."""
        return None if self.unique_id is None else f"{self.unique_id:016x}"


@dataclass(frozen=True, slots=True)
class KfdTopology:
    """Every node KFD lists, by node id."""

    nodes: tuple[KfdNode, ...]

    @property
    def gpus(self) -> tuple[KfdNode, ...]:
        """GPU nodes in node order, which is the order ROCm enumerates GPU agents in."""
        return tuple(node for node in self.nodes if node.is_gpu)

    def node(self, node_id: int) -> KfdNode | None:
        return next((node for node in self.nodes if node.node_id == node_id), None)

    def gpu_for(
        self,
        *,
        pci_bus_id: str | None = None,
        render_minor: int | None = None,
        unique_id_hex: str | None = None,
    ) -> KfdNode | None:
        """The GPU node of a DRM card: by PCI address, else render minor, else unique id."""
        gpus = self.gpus
        if pci_bus_id:
            for node in gpus:
                if node.pci_bus_id == pci_bus_id.lower():
                    return node
        if render_minor is not None:
            for node in gpus:
                if node.drm_render_minor == render_minor:
                    return node
        if unique_id_hex:
            for node in gpus:
                if node.unique_id_hex == unique_id_hex.lower():
                    return node
        return None

    def hops(self, node_from: int, node_to: int) -> int | None:
        """The fewest direct (``io_links``) links from one node to another; ``None`` if unlinked."""
        adjacency: dict[int, set[int]] = {}
        for node in self.nodes:
            for link in node.io_links:
                adjacency.setdefault(link.node_from, set()).add(link.node_to)
                adjacency.setdefault(link.node_to, set()).add(link.node_from)
        seen, queue = {node_from: 0}, deque([node_from])
        while queue:
            here = queue.popleft()
            if here == node_to:
                return seen[here]
            for there in sorted(adjacency.get(here, ())):
                if there not in seen:
                    seen[there] = seen[here] + 1
                    queue.append(there)
        return None


def _numbered_dirs(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.name.isdigit() and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name))


def _nonzero(values: Mapping[str, int], name: str) -> int | None:
    value = values.get(name)
    return value if value else None


def _read_links(base: Path, node_id: int, *, indirect: bool) -> tuple[KfdLink, ...]:
    links: list[KfdLink] = []
    for link_dir in _numbered_dirs(base):
        values = parse_properties(read_text(link_dir / "properties"))
        if "type" not in values or "node_to" not in values:
            continue
        links.append(
            KfdLink(
                node_from=values.get("node_from", node_id),
                node_to=values["node_to"],
                link_type=values["type"],
                weight=values.get("weight"),
                min_bandwidth_mbytes_s=_nonzero(values, "min_bandwidth"),
                max_bandwidth_mbytes_s=_nonzero(values, "max_bandwidth"),
                indirect=indirect,
            )
        )
    return tuple(links)


def read_node(node_dir: Path) -> KfdNode | None:
    """One ``nodes/N`` folder; ``None`` when its ``properties`` file is missing or empty."""
    values = parse_properties(read_text(node_dir / "properties"))
    if not values:
        return None
    node_id = int(node_dir.name)
    return KfdNode(
        node_id=node_id,
        gpu_id=read_int(node_dir / "gpu_id"),
        cpu_cores_count=values.get("cpu_cores_count", 0),
        simd_count=values.get("simd_count", 0),
        simd_per_cu=values.get("simd_per_cu", 0),
        gfx_target_version=_nonzero(values, "gfx_target_version"),
        vendor_id=_nonzero(values, "vendor_id"),
        device_id=_nonzero(values, "device_id"),
        location_id=values.get("location_id"),
        domain=values.get("domain"),
        unique_id=_nonzero(values, "unique_id"),
        drm_render_minor=_nonzero(values, "drm_render_minor"),
        hive_id=_nonzero(values, "hive_id"),
        io_links=_read_links(node_dir / "io_links", node_id, indirect=False),
        p2p_links=_read_links(node_dir / "p2p_links", node_id, indirect=True),
    )


def read_topology(root: Path = Path("/")) -> KfdTopology | None:
    """The KFD topology under ``root``; ``None`` when KFD is not there (no ROCm kernel driver)."""
    nodes = [read_node(node_dir) for node_dir in _numbered_dirs(root / TOPOLOGY / "nodes")]
    found = tuple(node for node in nodes if node is not None)
    return KfdTopology(found) if found else None
