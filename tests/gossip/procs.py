"""Drive ``python -m gossip`` member processes and read the JSON lines they print."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEADLINE_S = 60.0


@dataclass
class Member:
    """One member process and what it last reported."""

    directory: Path
    process: subprocess.Popen[str]
    lines: queue.Queue[dict[str, object]] = field(default_factory=queue.Queue)
    node_id: str = ""
    addr: str = ""
    view: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    declared_dead: set[str] = field(default_factory=set)
    """Every member this process ever reported a ``MemberDead`` for."""

    def pump(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:  # closed once the member has exited
            for raw in self.process.stdout:
                self.lines.put(json.loads(raw))

    def drain(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line["event"] == "listening":
                self.node_id, self.addr = str(line["node"]), str(line["addr"])
            elif line["event"] == "view":
                members = line["members"]
                assert isinstance(members, dict)
                self.view = {str(k): str(v) for k, v in members.items()}
                stats = line.get("stats", {})
                assert isinstance(stats, dict)
                self.stats = {str(k): int(v) for k, v in stats.items()}
            elif line["event"] == "MemberDead":
                self.declared_dead.add(str(line["node"]))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def sees_all_alive(self, count: int) -> bool:
        return len(self.view) == count and set(self.view.values()) == {"alive"}


def start(
    directory: Path,
    listen: str,
    join: Sequence[str] = (),
    *,
    wrap: Callable[[list[str]], list[str]] = lambda argv: argv,
    extra: Sequence[str] = (),
) -> Member:
    """Start a member; ``wrap`` may put the command inside a network namespace; ``extra``:
    more arguments (``--max-streams 12``)."""
    argv = [sys.executable, "-m", "gossip", "--identity", str(directory), "--listen", listen]
    for seed in join:
        argv += ["--join", seed]
    argv += list(extra)
    argv += ["--report-s", "0.25"]
    process = subprocess.Popen(
        wrap(argv), stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    member = Member(directory, process)
    threading.Thread(target=member.pump, daemon=True).start()
    return member


def wait_until(
    members: Sequence[Member],
    what: str,
    check: Callable[[Member], bool],
    deadline_s: float = DEADLINE_S,
) -> float:
    """Poll every member's latest report until ``check`` holds for all; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        for m in members:
            m.drain()
        if all(check(m) for m in members):
            return time.monotonic() - started
        time.sleep(0.05)
    states = {m.node_id[:6]: sorted(m.view.values()) for m in members}
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}: {states}")
