"""NvidiaPciProber against the captured RTX 4080 sysfs tree and variants of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probers.base import ProberUnavailable
from probers.nvidia_pci import UNAVAILABLE, NvidiaPciProber, device_name
from tests.support import SYSFS

RTX4080 = SYSFS / "nvidia-rtx4080"
CARD = Path("sys/class/drm/card1/device")


def copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(RTX4080, root)
    return root


def test_rtx4080_identity() -> None:
    prober = NvidiaPciProber(RTX4080)
    (card,) = prober.discover()
    # uevent: PCI_ID=10DE:2704, PCI_SLOT_NAME=0000:09:00.0, DRIVER=nvidia
    assert card.name == "NVIDIA GeForce RTX 4080"
    assert card.key == "pci:0000:09:00.0"
    assert card.pci_bus_id == "0000:09:00.0"
    assert (card.vendor, card.backend, card.source) == ("nvidia", "cuda", "nvidia-pci")
    assert card.vendor_index == 0
    assert card.uuid is None and card.mem_total_bytes is None and card.arch is None


def test_samples_say_only_pci_identity_is_known() -> None:
    prober = NvidiaPciProber(RTX4080)
    prober.discover()
    (sample,) = prober.sample()
    assert sample.key == "pci:0000:09:00.0"
    assert not sample.healthy
    assert sample.error == UNAVAILABLE == "NVML unavailable: only PCI identity is known"
    readings = (sample.mem_used_bytes, sample.util_pct, sample.temp_c, sample.power_mw)
    assert readings == (None, None, None, None)
    assert sample.power_limit_mw is None


def test_unknown_device_id_is_shown_raw(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    uevent = root / CARD / "uevent"
    uevent.write_text(uevent.read_text().replace("PCI_ID=10DE:2704", "PCI_ID=10DE:2EEE"))
    (card,) = NvidiaPciProber(root).discover()
    assert card.name == "NVIDIA GPU [10de:2eee]"


def test_found_by_driver_without_vendor_file(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    (root / CARD / "vendor").unlink()
    uevent = root / CARD / "uevent"
    uevent.write_text(uevent.read_text().replace("PCI_ID=10DE:2704\n", ""))
    (card,) = NvidiaPciProber(root).discover()
    assert card.key == "pci:0000:09:00.0"
    assert card.name == "NVIDIA GPU"


def test_found_by_vendor_without_driver(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    uevent = root / CARD / "uevent"
    uevent.write_text(uevent.read_text().replace("DRIVER=nvidia\n", ""))
    (card,) = NvidiaPciProber(root).discover()
    assert card.name == "NVIDIA GeForce RTX 4080"


def test_other_vendor_is_not_listed(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    (root / CARD / "vendor").write_text("0x1002\n")
    uevent = root / CARD / "uevent"
    text = uevent.read_text().replace("DRIVER=nvidia", "DRIVER=amdgpu")
    uevent.write_text(text.replace("PCI_ID=10DE:2704", "PCI_ID=1002:73BF"))
    with pytest.raises(ProberUnavailable):
        NvidiaPciProber(root).discover()


def test_two_cards_follow_pci_order(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    # A second, made-up card0 at a later bus address: vendor_index follows bus order, as NVML's.
    second = root / "sys/class/drm/card0/device"
    shutil.copytree(root / CARD, second)
    uevent = second / "uevent"
    uevent.write_text(uevent.read_text().replace("0000:09:00.0", "0000:41:00.0"))
    cards = NvidiaPciProber(root).discover()
    assert [(c.key, c.vendor_index) for c in cards] == [
        ("pci:0000:09:00.0", 0),
        ("pci:0000:41:00.0", 1),
    ]


def test_no_drm_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ProberUnavailable, match="no NVIDIA card"):
        NvidiaPciProber(tmp_path).discover()


def test_device_name_table() -> None:
    assert device_name(0x2704) == "NVIDIA GeForce RTX 4080"
    assert device_name(0x2236) == "NVIDIA A10"
    assert device_name(0x0001) == "NVIDIA GPU [10de:0001]"
    assert device_name(None) == "NVIDIA GPU"
