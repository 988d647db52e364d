"""Standalone gossip members (``python -m gossip``) as processes, and what each one reports.

Each member prints one JSON line per membership event with the time it happened (``at``: the
member's ``time.monotonic()``, which on Linux is the same clock in every process), so the
benchmark rebuilds every member's view from its events instead of asking for views: a member
that is asked nothing spends nothing on reporting. ``SIGUSR1`` makes a member print its counters.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from agent.sandbox.localmesh import SOURCE_ROOT, compile_sources

STATE_OF_EVENT = {
    "MemberJoined": "alive",
    "MemberUpdated": "alive",
    "MemberSuspect": "suspect",
    "MemberDead": "dead",
    "MemberLeft": "left",
}

Line = tuple[float, int, dict[str, object]]
"""(when the line was read, the member's index, the decoded line)."""


@dataclass
class MemberProc:
    """One member process and the view its events describe."""

    index: int
    directory: Path
    listen: str
    process: subprocess.Popen[bytes] | None = None
    node_id: str = ""
    ready_at: float | None = None
    """When its ``listening`` line was read (this life)."""
    view: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    stats_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cpu_s(self) -> float:
        """User + system CPU seconds this life has used."""
        assert self.process is not None
        times = psutil.Process(self.process.pid).cpu_times()
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        assert self.process is not None
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def tcp_connections(self) -> int:
        """Established TCP connections this member holds (both directions)."""
        assert self.process is not None
        conns = psutil.Process(self.process.pid).net_connections(kind="tcp")
        return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED)

    def sees_all_alive(self, others: set[str]) -> bool:
        return all(self.view.get(node) == "alive" for node in others)


class MemberSet:
    """Starts, signals and stops member processes; collects their lines in one queue."""

    def __init__(self, source: Path | None = None) -> None:
        """``source``: run the members from that checkout (its ``gossip`` package), for
        comparing two versions side by side; default: this one."""
        self.members: list[MemberProc] = []
        self.lines: queue.Queue[Line] = queue.Queue()
        self._source = source

    def add(self, directory: Path, listen: str) -> MemberProc:
        member = MemberProc(len(self.members), directory, listen)
        self.members.append(member)
        return member

    def start(self, member: MemberProc, join: list[str]) -> None:
        argv = [sys.executable, "-m", "gossip", "--identity", str(member.directory)]
        argv += ["--listen", member.listen, "--report-s", "86400"]
        for seed in join:
            argv += ["--join", seed]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self._source is not None:
            env["PYTHONPATH"] = str(self._source)
        compile_sources(self._source or SOURCE_ROOT)
        member.view = {}
        member.ready_at = None
        member.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self._source,
        )
        threading.Thread(target=self._pump, args=(member, member.process), daemon=True).start()

    def _pump(self, member: MemberProc, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with process.stdout:  # closed once the member has exited
            for raw in process.stdout:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(line, dict):
                    self.lines.put((time.monotonic(), member.index, line))

    def signal(self, member: MemberProc, sig: int) -> None:
        if member.running:
            assert member.process is not None
            os.kill(member.process.pid, sig)

    def ask_stats(self) -> None:
        for member in self.members:
            self.signal(member, signal.SIGUSR1)

    def kill(self, member: MemberProc) -> None:
        if member.process is not None and member.running:
            member.process.kill()
            member.process.wait(timeout=10)

    def stop_all(self) -> None:
        for member in self.members:
            self.signal(member, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for member in self.members:
            if member.process is None:
                continue
            try:
                member.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait(timeout=10)
