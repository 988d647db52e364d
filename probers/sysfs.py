"""Small, forgiving readers for sysfs-style trees rooted anywhere (``/`` or a captured fixture)."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The file's text, stripped of whitespace and NUL padding; ``None`` if unreadable or empty."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    text = raw.replace(b"\x00", b"").decode("utf-8", errors="replace").strip()
    return text or None


def read_int(path: Path, base: int = 10) -> int | None:
    """An integer file (``0x``-prefixed hex is accepted whatever ``base`` says); else ``None``."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text, base)
    except ValueError:
        return None


def read_uevent(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a ``uevent`` file as a dict (empty if missing)."""
    text = read_text(path)
    if text is None:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def hwmon_dirs(device_dir: Path) -> list[Path]:
    """The ``hwmon/hwmonN`` folders under a device, sorted by N."""
    base = device_dir / "hwmon"
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.name.startswith("hwmon") and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else 0)


def drm_cards(root: Path) -> list[Path]:
    """``sys/class/drm/cardN`` folders under ``root`` (connectors like ``card0-DP-1`` excluded)."""
    base = root / "sys" / "class" / "drm"
    if not base.is_dir():
        return []
    cards = [p for p in base.iterdir() if p.name.startswith("card") and p.name[4:].isdigit()]
    return sorted(cards, key=lambda p: int(p.name[4:]))


def pci_bus_id(device_dir: Path) -> str | None:
    """The PCI address (``0000:03:00.0``) from the device's ``uevent`` ``PCI_SLOT_NAME``."""
    slot = read_uevent(device_dir / "uevent").get("PCI_SLOT_NAME")
    if slot:
        return slot.lower()
    try:
        resolved = device_dir.resolve().name
    except OSError:
        return None
    return resolved.lower() if resolved.count(":") == 2 else None
