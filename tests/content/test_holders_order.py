"""A stage asks first the members whose place records list the content: in a mesh larger than the
members asked, the holders need not be among the first ids."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from agent.content.stage import MAX_HOLDERS_ASKED, Stager
from tests.content.memstore import MemStore


class Mesh:
    def __init__(self, live: list[str]) -> None:
        self.live = live

    def live_agents(self) -> list[str]:
        return self.live

    def addr_of(self, node: str) -> str | None:
        return f"127.0.0.1:{1000 + int(node[1:])}" if node in self.live else None


def test_the_listed_holders_are_asked_first(tmp_path: Path) -> None:
    live = [f"n{i:03d}" for i in range(100)]
    stager = Stager("n000", None, Mesh(live), MemStore(), tmp_path, Counter())  # type: ignore[arg-type]
    plain = [h.name for h in stager.holders()]
    assert plain[:2] == ["n001", "n002"] and len(plain) == MAX_HOLDERS_ASKED
    assert "n099" not in plain
    stager.listed = lambda digest: ["n099", "gone", "n098", "n099"] if digest == "d" else []
    names = [h.name for h in stager.holders("d")]
    assert names[:3] == ["n099", "n098", "n001"] and len(names) == MAX_HOLDERS_ASKED
    assert [h.name for h in stager.holders("other")] == plain
