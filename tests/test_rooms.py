"""The rooms of ``agent/`` and their one-way import order (docs/architecture/layout.md): every
``import agent.X`` in a room's modules names the room itself or a room listed after it here."""

from __future__ import annotations

import re
from pathlib import Path

AGENT = Path(__file__).resolve().parents[1] / "agent"

MAY_IMPORT: dict[str, set[str]] = {
    "cli": {
        "operator",
        "content",
        "bootstrap",
        "sandbox",
        "policy",
        "job",
        "wire",
        "common",
        "daemon.config",
    },
    "daemon": {
        "owning",
        "running",
        "checkpoints",
        "content",
        "execution",
        "history",
        "mesh",
        "storage",
        "people",
        "job",
        "wire",
        "common",
    },
    "owning": {"checkpoints", "content", "mesh", "storage", "policy", "job", "wire", "common"},
    "running": {
        "checkpoints",
        "content",
        "execution",
        "mesh",
        "storage",
        "policy",
        "job",
        "wire",
        "common",
    },
    "bootstrap": {"operator", "common"},
    "sandbox": {"operator", "execution", "policy", "job", "common"},
    "history": {"storage", "job", "wire", "common"},
    "checkpoints": {"content", "mesh", "execution", "job", "wire", "common"},
    "content": {"mesh", "execution", "storage", "job", "wire", "common"},
    "operator": {"content", "people", "policy", "job", "wire", "common"},
    "mesh": {"storage", "job", "wire", "common"},
    "execution": {"job", "common"},
    "storage": {"job", "common"},
    "policy": {"job"},
    "people": {"wire", "common"},
    "job": {"wire", "common"},
    "wire": set(),
    "common": set(),
}
_IMPORT = re.compile(r"^\s*(?:from|import) agent\.([a-z_]+)(?:\.([a-z_]+))?", re.M)


def test_every_module_of_agent_lives_in_a_room() -> None:
    loose = sorted(p.name for p in AGENT.glob("*.py") if p.name not in ("__init__.py",))
    # agent/synthjob.py: `python -m agent.synthjob`, as job specs stored before the rooms name it.
    assert loose == ["synthjob.py"]
    rooms = sorted(p.name for p in AGENT.iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(MAY_IMPORT)


def test_no_import_goes_against_the_order() -> None:
    against = []
    for path in sorted(AGENT.rglob("*.py")):
        parts = path.relative_to(AGENT).parts
        if len(parts) < 2:
            continue
        room = parts[0]
        allowed = MAY_IMPORT[room] | {room}
        for match in _IMPORT.finditer(path.read_text()):
            other, module = match.group(1), match.group(2)
            if other not in allowed and f"{other}.{module}" not in allowed:
                against.append(f"{path.relative_to(AGENT.parent)}: {room} -> {other}.{module}")
    assert against == []


def test_owning_and_running_never_meet_and_the_policy_stays_pure() -> None:
    assert "running" not in MAY_IMPORT["owning"] and "owning" not in MAY_IMPORT["running"]
    assert [room for room, may in MAY_IMPORT.items() if {"owning", "running"} <= may] == ["daemon"]
    assert "operator" not in MAY_IMPORT["daemon"]  # the CLI's client side
    policy = "\n".join(p.read_text() for p in (AGENT / "policy").rglob("*.py"))
    for io in ("import asyncio", "import socket", "import aiohttp", "time.time()", "open("):
        assert io not in policy, io
