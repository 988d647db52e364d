"""Real agent processes on loopback under hostile or careless requests: huge log reads, a slow
log follower, a flood of idle TCP connections, wrong content types. No request stalls an agent
or grows it without bound, and every refusal is counted on ``/metrics``."""

from __future__ import annotations

import json
import re
import resource
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.job.jobspec import new_job_id
from agent.sandbox.localmesh import AgentProcess
from gossip.identity import load_identity
from gossip.tls import client_context
from tests.agent.agents import Mesh, spec
from tests.support import documented

pytestmark = pytest.mark.slow

MB = 1024 * 1024
PEAK_RSS_BAR_BYTES = int(documented("performance.md", r"peak ≤ (\d+) MB")) * MB
"""The live mesh's bar for an agent's peak RSS, as docs/performance.md states it."""

BIG_LOG = """
import sys
line = "x" * 199 + "\\n"
for i in range(150_000):  # 30 MB: the log rotates and keeps 4 files of up to 10 MB
    sys.stdout.write(f"{i:07d} " + line[8:])
sys.stdout.flush()
"""

STEADY_LOG = """
import sys, time
line = "y" * 999 + "\\n"
for _ in range(int(sys.argv[1])):  # ~5 MB/s
    sys.stdout.write(line * 250)
    sys.stdout.flush()
    time.sleep(0.05)
"""


# -- what an agent holds and counts ------------------------------------------------------------


def memory_bytes(a: AgentProcess, field: str = "VmRSS") -> int:
    """The agent process's resident memory now (``VmRSS``) or at its peak so far (``VmHWM``)."""
    assert a.process is not None
    status = Path(f"/proc/{a.process.pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB$", status, re.M)
    assert match is not None, status
    return int(match.group(1)) * 1024


def metrics(mesh: Mesh, a: AgentProcess) -> str:
    status, body = mesh.request(a, "GET", "/metrics")
    assert status == 200, body
    return body.decode()


def refused(mesh: Mesh, a: AgentProcess) -> dict[tuple[str, str], float]:
    """``shoal_api_refused_total`` by (route, status)."""
    pattern = r'^shoal_api_refused_total\{route="([^"]*)",status="(\d+)"\} (\S+)$'
    return {
        (route, status): float(value)
        for route, status, value in re.findall(pattern, metrics(mesh, a), re.M)
    }


def transport_stat(mesh: Mesh, a: AgentProcess, name: str) -> float:
    match = re.search(rf"^shoal_gossip_transport_{name}_total (\S+)$", metrics(mesh, a), re.M)
    assert match is not None, name
    return float(match.group(1))


def timed_health(mesh: Mesh, a: AgentProcess, timeout_s: float = 5.0) -> tuple[int, float]:
    """``/healthz`` through the operator's TLS client (a fresh connection each time)."""
    started = time.monotonic()
    try:
        status, _ = mesh.request(a, "GET", "/healthz", timeout_s=timeout_s)
    except OSError:
        status = 0
    return status, time.monotonic() - started


def needs_proc() -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the agent's memory from /proc (Linux only)")


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    needs_proc()
    m = Mesh(tmp_path, ["h100:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def run_job(mesh: Mesh, argv: list[str], state: str) -> tuple[str, AgentProcess]:
    """Submit ``argv``; once the job is in ``state``, its id and the agent that runs it."""
    a = mesh.agents[0]
    job_id = new_job_id()
    assert mesh.command(a, "submit", {"job_id": job_id, "spec": spec(argv)})[0] == 200
    mesh.wait(state, lambda: mesh.job(a, job_id)["state"] == state)
    runner = mesh.job(a, job_id)["runner"]
    return job_id, mesh.agents[mesh.node_index(runner)]


# -- logs ----------------------------------------------------------------------------------------


def test_huge_log_requests_are_refused_and_large_reads_stall_nothing(mesh: Mesh) -> None:
    job_id, runner = run_job(mesh, [sys.executable, "-c", BIG_LOG], "succeeded")
    other = next(a for a in mesh.agents if a is not runner)
    path = f"/v1/jobs/{job_id}/logs"
    route = ("/v1/jobs/{job_id}/logs", "400")
    before = refused(mesh, other).get(route, 0.0)
    for query, reason in [
        ("lines=1000000000", "lines must be between 0 and 10000"),
        ("lines=abc", "lines must be an integer"),
        ("lines=-1", "lines must be between 0 and 10000"),
    ]:
        started = time.monotonic()
        status, body = mesh.request(other, "GET", f"{path}?{query}")
        assert status == 400 and reason in json.loads(body)["error"], (status, body)
        assert "\n" not in json.loads(body)["error"]
        assert time.monotonic() - started < 1.0
    assert refused(mesh, other)[route] == before + 3

    # Ten thousand lines at once, from the runner and proxied through the other agent, eight
    # at a time, while /healthz keeps answering.
    answers: list[tuple[int, int]] = []

    def read(a: AgentProcess) -> None:
        status, body = mesh.request(a, "GET", f"{path}?lines=10000", timeout_s=30)
        answers.append((status, len(body.decode().splitlines())))

    readers = [threading.Thread(target=read, args=(a,)) for a in (runner, other) * 4]
    for t in readers:
        t.start()
    health = []
    while any(t.is_alive() for t in readers):
        health.append(timed_health(mesh, runner))
        time.sleep(0.05)
    for t in readers:
        t.join()
    slowest_ms = max(took for _, took in health) * 1000
    peak_mb = memory_bytes(runner, "VmHWM") / MB
    print(
        f"\nlarge reads: /healthz {len(health)}, slowest {slowest_ms:.0f} ms; peak {peak_mb:.1f} MB"
    )
    assert answers == [(200, 10_000)] * len(readers)
    assert all(status == 200 for status, _ in health), health
    assert max(took for _, took in health) < 2.0, health
    assert memory_bytes(runner, "VmHWM") < PEAK_RSS_BAR_BYTES
    status, body = mesh.request(runner, "GET", f"{path}?lines=5")
    numbered = [line for line in body.decode().splitlines() if not line.startswith("[shoal]")]
    assert numbered[-2:] == [f"{i:07d} " + "x" * 191 for i in (149_998, 149_999)]


def test_a_stalled_log_follower_holds_the_log_on_disk_not_in_memory(mesh: Mesh) -> None:
    job_id, runner = run_job(mesh, [sys.executable, "-c", STEADY_LOG, "120"], "running")
    idle_rss = memory_bytes(runner)
    ctx = client_context(mesh.operator, mesh.operator.ca_certificate)
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = runner.address.rsplit(":", 1)
    raw.connect((host, int(port)))
    with ctx.wrap_socket(raw, server_hostname=host) as follower:
        request = f"GET /v1/jobs/{job_id}/logs?follow=1&lines=10000 HTTP/1.1\r\nHost: a\r\n\r\n"
        follower.sendall(request.encode())
        assert follower.recv(64).startswith(b"HTTP/1.1 200")
        # The job writes ~5 MB/s; the follower reads nothing for 5 s.
        rss = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            status, took = timed_health(mesh, runner)
            assert status == 200 and took < 2.0
            rss.append(memory_bytes(runner))
            time.sleep(0.25)
        print(f"\nstalled follower: RSS {idle_rss / MB:.1f} MB before, {max(rss) / MB:.1f} MB max")
        assert max(rss) - idle_rss < 20 * MB, (idle_rss, rss)
        assert follower.recv(64)  # still streaming
    assert memory_bytes(runner, "VmHWM") < PEAK_RSS_BAR_BYTES


# -- an idle connection flood --------------------------------------------------------------------


class IdleFlood:
    """Plain TCP connections to an agent that never send a byte (every ``stalled``-th sends
    one, the first of a TLS record, and stops there). Those the agent closes are opened again
    while the flood lasts, ``max_opens`` in all; every socket is closed at the end."""

    def __init__(self, address: str, size: int, max_opens: int, stalled: int = 0) -> None:
        host, port = address.rsplit(":", 1)
        self._target = (host, int(port))
        self._size = size
        self._max_opens = max_opens
        self._stalled = stalled
        self._open: dict[int, socket.socket] = {}
        self._poll = select.poll()
        self.opened = 0
        self.closed_by_agent = 0
        self.failed = 0

    def fill(self) -> None:
        while len(self._open) < self._size and self.opened < self._max_opens:
            self.opened += 1
            try:
                sock = socket.create_connection(self._target, timeout=2.0)
            except OSError:
                self.failed += 1
                continue
            if self._stalled and self.opened % self._stalled == 0:
                sock.send(b"\x16")
            self._open[sock.fileno()] = sock
            self._poll.register(sock, select.POLLIN)

    def reap(self) -> None:
        """Close what the agent closed (a closed socket reads as ready: it never sends)."""
        for fd, _ in self._poll.poll(0):
            sock = self._open.pop(fd)
            self._poll.unregister(fd)
            sock.close()
            self.closed_by_agent += 1

    def run(self, stop: threading.Event, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            self.reap()
            self.fill()
            stop.wait(0.05)

    def close(self) -> None:
        for sock in self._open.values():
            sock.close()
        self._open.clear()


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def test_an_idle_connection_flood_neither_starves_healthz_nor_grows_the_agent(
    mesh: Mesh,
) -> None:
    raise_open_files(1_500)  # the test's own sockets; the agent holds at most a few hundred
    target, watcher = mesh.agents
    idle_rss = memory_bytes(target)
    flood = IdleFlood(target.address, size=1_000, max_opens=8_000, stalled=4)
    stop = threading.Event()
    flooding = threading.Thread(target=flood.run, args=(stop, 30.0))
    health: list[tuple[int, float]] = []
    rss: list[int] = []
    try:
        flood.fill()
        assert flood.opened - flood.failed >= 950
        flooding.start()
        for _ in range(40):
            health.append(timed_health(mesh, target))
            rss.append(memory_bytes(target))
            time.sleep(0.1)
    finally:
        stop.set()
        if flooding.is_alive():
            flooding.join()
        flood.close()
    took_s = sorted(took for _, took in health)
    print(
        f"\nflood: {flood.opened} connections, {flood.closed_by_agent} seen closed by the agent; "
        f"/healthz {sum(s == 200 for s, _ in health)}/{len(health)} answered, "
        f"p50 {took_s[len(took_s) // 2] * 1000:.0f} ms, max {took_s[-1] * 1000:.0f} ms; "
        f"RSS idle {idle_rss / MB:.1f} MB, during {max(rss) / MB:.1f} MB max, "
        f"peak {memory_bytes(target, 'VmHWM') / MB:.1f} MB"
    )
    assert [status for status, _ in health] == [200] * len(health)
    assert max(rss) < PEAK_RSS_BAR_BYTES and memory_bytes(target, "VmHWM") < PEAK_RSS_BAR_BYTES

    # Every connection the agent closed is counted, and in the end every one the flood opened:
    # evicted, timed out, or failed (closed by the flood before its handshake).
    closed = ("handshakes_evicted", "handshake_timeouts")

    def counted(*names: str) -> float:
        return sum(transport_stat(mesh, target, name) for name in names)

    assert counted(*closed) >= flood.closed_by_agent >= 500
    mesh.wait(
        "every flood connection counted",
        lambda: counted(*closed, "handshake_failed") >= flood.opened - flood.failed,
    )
    # Its peer never took the flooded agent for dead.
    assert mesh.get(watcher, "/healthz")["members"] == 2


# -- content types and the refusal counter -------------------------------------------------------


def test_wrong_content_types_are_refused_415_and_every_refusal_is_counted(mesh: Mesh) -> None:
    a = mesh.agents[0]
    sealed = mesh.seal("cordon", {"node": a.node_id})
    for content_type in ("application/json", "text/plain", "application/x-www-form-urlencoded"):
        status, body = mesh.request(a, "POST", "/v1/commands", sealed, content_type)
        assert status == 415, body
        assert "application/octet-stream" in json.loads(body)["error"]
    # An agent's own internal calls must be JSON.
    peer = load_identity(mesh.agents[1].directory / "identity")
    status, body = mesh.request(
        a, "POST", "/v1/internal/status", b"{}", "text/plain", identity=peer
    )
    assert status == 415, body
    status, _ = mesh.request(
        a, "POST", "/v1/internal/command", sealed, "application/json", identity=peer
    )
    assert status == 415
    # Other refusals, each counted under its route.
    too_big = b"\0" * (2 * MB)
    assert mesh.request(a, "POST", "/v1/commands", too_big, "application/octet-stream")[0] == 413
    assert mesh.request(a, "POST", "/v1/internal/status", b"{}")[0] == 403  # operator
    assert mesh.request(a, "GET", f"/v1/jobs/{new_job_id()}")[0] == 404
    assert mesh.request(a, "GET", "/v1/nothing-here")[0] == 404
    counted = refused(mesh, a)
    assert counted[("/v1/commands", "415")] == 3
    assert counted[("/v1/commands", "413")] == 1
    assert counted[("/v1/internal/{op}", "415")] == 1
    assert counted[("/v1/internal/command", "415")] == 1
    assert counted[("/v1/internal/{op}", "403")] == 1
    assert counted[("/v1/jobs/{job_id}", "404")] == 1
    assert counted[("(no route)", "404")] == 1
    # The right content type still goes through.
    status, answer = mesh.command(a, "cordon", {"node": a.node_id})
    assert status == 200, answer
