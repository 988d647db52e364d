"""A first fleet, as a new operator makes one: three hosts with their own sshd in their own network
namespaces (:mod:`tests.bootstrap.lab`), a fresh ``shoal init``, one ``shoal bootstrap`` (no
``--join``, no wheelhouse, unknown host keys accepted with ``--accept-new``), then a job through
the fleet the CLI remembers, its output through ``shoal logs -f``, and the first host's agent
restarted and seen back in the mesh. Every command is the real ``shoal`` on the operator's
machine."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.bootstrap.locked import read_lock
from tests.bootstrap.lab import SshLab
from tests.bootstrap.sshd import SSHD
from tests.netns import netns_available
from tests.support import require_system

pytestmark = [pytest.mark.slow, pytest.mark.system]

PORT = 7946


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[SshLab]:
    ok, why = netns_available()
    require_system(ok, why)
    require_system(SSHD.exists(), "OpenSSH server not installed (apt-get install openssh-server)")
    lab = SshLab(tmp_path / "lab")
    try:
        yield lab.open()
    finally:
        lab.close()


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where ``shoal bootstrap`` keeps the wheels it ships (``$XDG_CACHE_HOME``)."""
    return tmp_path_factory.mktemp("cache")


def run(
    lab: SshLab, cache: Path, *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """``shoal ARGS...`` on the operator's machine."""
    return subprocess.run(
        lab.operator([sys.executable, "-m", "agent.cli", *args]),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=lab.env({"XDG_CACHE_HOME": str(cache)}),
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def nodes(lab: SshLab, cache: Path, *extra: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads(ok(run(lab, cache, "nodes", "--json", *extra)))
    return listed


def by_host(listed: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str((n.get("host") or {}).get("hostname")): n for n in listed}


def wait_for(what: str, check: Any, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _hosts_have_this_python() -> bool:
    """Whether the lab's hosts (root over SSH, the system's PATH) find this Python's version by
    name: bootstrap then ships this environment's own wheels; for any other version it fetches
    the host's platform's wheels from the package index, which the lab's namespaces cannot
    reach."""
    name = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return (
        shutil.which(name, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        is not None
    )


def test_a_first_fleet_from_one_command(lab: SshLab, wheel_cache: Path) -> None:
    if not _hosts_have_this_python():
        pytest.skip(
            f"the lab's hosts have no Python {sys.version_info[0]}.{sys.version_info[1]} on the"
            " system's PATH, and their namespaces reach no package index for their own version's"
            " wheels (run the suite on the system's Python to run this test)"
        )
    hosts = [lab.target(i) for i in range(3)]
    addresses = [f"{lab.address(i)}:{PORT}" for i in range(3)]
    ok(run(lab, wheel_cache, "init", "--name", "lab"))

    done = run(lab, wheel_cache, "bootstrap", "--accept-new", *hosts, timeout_s=300)
    out = ok(done)
    for i, host in enumerate(hosts):
        # Each unknown key was trusted on first sight, with its fingerprint, and recorded.
        assert re.search(rf"host {host}: trusted its new host key ssh-ed25519 SHA256:\S+", out)
        assert f"[{lab.address(i)}]" not in lab.known_hosts.read_text()  # port 22: bare name
        assert lab.address(i) in lab.known_hosts.read_text()
        # No systemd here: said, as a warning.
        assert f"host {host}: warning: no systemd or launchd" in done.stderr
        # Each agent joins through the other two, never only through itself.
        config = tomllib.loads((lab.opt(i) / "shoal" / "agent.toml").read_text())["agent"]
        assert config["advertise"] == lab.address(i)
        assert sorted(config["join"]) == sorted(a for a in addresses if a != addresses[i])
    assert "this checkout" in done.stderr  # Shoal from a checkout ships its own build
    # ... with exactly the locked dependency set, installed by hash.
    locked = read_lock(Path(__file__).resolve().parents[2])
    code = "import importlib.metadata as m; print(m.version('cryptography'), m.version('aiohttp'))"
    # BASE/venv links to the venv by the host's own path: find it under the lab's folder.
    (host_python,) = (lab.opt(0) / "shoal" / "venvs").glob("*/bin/python")
    versions = subprocess.run(
        [str(host_python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert versions == [locked["cryptography"].version, locked["aiohttp"].version]
    fleet = tomllib.loads((lab.cluster_dir / "fleet.toml").read_text())
    assert [a["address"] for a in fleet["agent"]] == addresses
    assert f"fleet: 3 agents in {lab.cluster_dir / 'fleet.toml'}" in out

    # The CLI talks to the fleet it remembers: no --agent, no $SHOAL_AGENT.
    listed = by_host(nodes(lab, wheel_cache))
    assert sorted(listed) == ["gpu1", "gpu2", "gpu3"]
    assert {n["state"] for n in listed.values()} == {"alive"}
    table = ok(run(lab, wheel_cache, "nodes"))
    assert table.count("CPU only") == 3, table  # a host's CPU is not listed as a GPU

    done = run(lab, wheel_cache, "submit", "--", "sh", "-c", "echo hello from $(hostname)")
    out = ok(done)
    job = re.search(r"^submitted ([0-9a-f]{32}) ", out, re.M)
    assert job is not None, out
    assert "asks for no GPU (runs on any host)" in out
    logs = ok(run(lab, wheel_cache, "logs", "-f", job.group(1)))
    assert re.search(r"^hello from gpu[123]$", logs, re.M), logs
    # A GPU job on CPU-only hosts could never run: refused at once, nothing submitted.
    done = run(lab, wheel_cache, "submit", "--gpus", "1", "--", "nvidia-smi")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "none of its 3 live agents has a GPU that fits; nothing submitted" in done.stderr

    # The first host's agent dies and its service restarts it: it comes back through its seeds,
    # and the other hosts see it alive again.
    supervisor = lab.supervisor_pid(0)
    assert supervisor is not None
    [agent] = psutil.Process(supervisor).children()
    first_id = listed["gpu1"]["node_id"]
    agent.send_signal(signal.SIGKILL)
    agent.wait(30)

    def restarted() -> bool:
        children = psutil.Process(supervisor).children()
        return bool(children) and children[0].pid != agent.pid

    wait_for("the supervisor to start the agent again", restarted, 30)

    def back_everywhere() -> bool:
        # The new process knows only its seeds when it starts: listing both others alive, and
        # being listed alive by both, it has rejoined.
        answers = [run(lab, wheel_cache, "nodes", "--json", "--agent", a) for a in addresses]
        if any(done.returncode != 0 for done in answers):
            return False  # the new process does not listen yet
        views = [by_host(json.loads(done.stdout)) for done in answers]
        return all(v.get(h, {}).get("state") == "alive" for v in views for h in by_host_names)

    by_host_names = ("gpu1", "gpu2", "gpu3")
    wait_for("gpu1 back in one mesh with gpu2 and gpu3", back_everywhere, 60)
    assert by_host(nodes(lab, wheel_cache))["gpu1"]["node_id"] == first_id

    # Its service stopped for good: commands fail over to the next agent of the fleet.
    psutil.Process(supervisor).send_signal(signal.SIGTERM)
    wait_for("the supervisor to stop", lambda: not psutil.pid_exists(supervisor))
    listed = by_host(nodes(lab, wheel_cache))
    assert listed["gpu1"]["state"] in ("left", "dead", "suspect")
    # A rerun starts it again, confirmed through the rest of the fleet, and changes nothing else.
    out = ok(run(lab, wheel_cache, "bootstrap", hosts[0], timeout_s=120))
    assert "nothing to change" in out, out
    assert by_host(nodes(lab, wheel_cache, "--agent", addresses[1]))["gpu1"]["state"] == "alive"
