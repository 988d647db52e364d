"""NVIDIA cards as sysfs shows them, for hosts where NVML is missing or broken.

Only the PCI identity is known here (no memory, no readings), so every sample is unhealthy with a
reason the operator can act on. The name comes from a small table of PCI device ids; an unknown id
is shown as ``NVIDIA GPU [10de:XXXX]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from probers.base import ProberUnavailable
from probers.records import DeviceSample, DeviceStatic
from probers.sysfs import drm_cards, pci_bus_id, read_int, read_uevent

NVIDIA_VENDOR_ID = 0x10DE
UNAVAILABLE = "NVML unavailable: only PCI identity is known"

# PCI device id -> the name NVML gives the board (ids after the pci.ids database; a few only).
DEVICE_NAMES: dict[int, str] = {
    0x1EB8: "Tesla T4",
    0x20B0: "NVIDIA A100-SXM4-40GB",
    0x20B2: "NVIDIA A100-SXM4-80GB",
    0x20B5: "NVIDIA A100 80GB PCIe",
    0x20B7: "NVIDIA A30",
    0x2204: "NVIDIA GeForce RTX 3090",
    0x2236: "NVIDIA A10",
    0x2330: "NVIDIA H100 80GB HBM3",
    0x2331: "NVIDIA H100 PCIe",
    0x2335: "NVIDIA H200",
    0x2684: "NVIDIA GeForce RTX 4090",
    0x2704: "NVIDIA GeForce RTX 4080",
    0x27B8: "NVIDIA L4",
    0x2901: "NVIDIA B200",
}


def device_name(device_id: int | None) -> str:
    """The board's name from its PCI device id, else ``NVIDIA GPU [10de:XXXX]``."""
    if device_id is None:
        return "NVIDIA GPU"
    return DEVICE_NAMES.get(device_id, f"NVIDIA GPU [10de:{device_id:04x}]")


def _ids(device_dir: Path) -> tuple[int | None, int | None, str | None]:
    """Vendor id, device id and bound driver of one PCI device folder."""
    uevent = read_uevent(device_dir / "uevent")
    vendor = read_int(device_dir / "vendor", 16)
    device = read_int(device_dir / "device", 16)
    pci_id = uevent.get("PCI_ID", "")
    if ":" in pci_id:
        uevent_vendor, uevent_device = pci_id.split(":", 1)
        try:
            vendor = vendor if vendor is not None else int(uevent_vendor, 16)
            device = device if device is not None else int(uevent_device, 16)
        except ValueError:
            pass
    return vendor, device, uevent.get("DRIVER")


class NvidiaPciProber:
    """Lists NVIDIA cards from ``sys/class/drm/cardN/device`` under ``root``."""

    source = "nvidia-pci"

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self._keys: list[str] = []

    def discover(self) -> Sequence[DeviceStatic]:
        cards: dict[str, tuple[str | None, int | None]] = {}
        for card in drm_cards(self.root):
            device_dir = card / "device"
            vendor, device, driver = _ids(device_dir)
            if vendor != NVIDIA_VENDOR_ID and driver != "nvidia":
                continue
            bus_id = pci_bus_id(device_dir)
            key = f"pci:{bus_id}" if bus_id is not None else f"drm:{card.name}"
            cards.setdefault(key, (bus_id, device))
        if not cards:
            raise ProberUnavailable(f"no NVIDIA card under {self.root / 'sys/class/drm'}")
        # NVML numbers GPUs in PCI bus order; follow it so that vendor_index means the same.
        ordered = sorted(cards.items(), key=lambda item: (item[1][0] is None, item[0]))
        found = [
            DeviceStatic(
                key=key,
                vendor="nvidia",
                backend="cuda",
                name=device_name(device),
                source=self.source,
                vendor_index=index,
                pci_bus_id=bus_id,
            )
            for index, (key, (bus_id, device)) in enumerate(ordered)
        ]
        self._keys = [static.key for static in found]
        return found

    def sample(self) -> Sequence[DeviceSample]:
        return [DeviceSample(key=key, healthy=False, error=UNAVAILABLE) for key in self._keys]

    def close(self) -> None:
        self._keys = []
