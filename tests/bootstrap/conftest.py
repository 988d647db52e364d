"""Fixtures of the bootstrap system tests: sshd servers, a wheelhouse, a running local mesh."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.bootstrap.hostrun import HostResult, QuietReporter
from agent.cli.bootstrap_args import add_bootstrap_arguments
from agent.cli.bootstrap_cmd import bootstrap
from agent.sandbox.localmesh import LocalMesh, free_ports
from tests.bootstrap.sshd import SSHD, SshServer, build_wheel, keygen, start_sshd
from tests.support import require_system


def _need_sshd() -> None:
    require_system(
        SSHD.exists() and shutil.which("ssh-keygen") is not None,
        "OpenSSH server not installed (apt-get install openssh-server openssh-client)",
    )


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_sshd()
    key = tmp_path_factory.mktemp("client") / "id_ed25519"
    keygen(key)
    return key


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built once per session."""
    _need_sshd()
    out = tmp_path_factory.mktemp("wheelhouse") / "wheels"
    build_wheel(out)
    return out


@pytest.fixture(scope="session")
def wheelhouse_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same code built as version 0.1.1, to upgrade to."""
    _need_sshd()
    out = tmp_path_factory.mktemp("wheelhouse-next") / "wheels"
    build_wheel(out, version="0.1.1")
    return out


@dataclass
class Fleet:
    """sshd "hosts", their known_hosts, a running mesh, and a way to run shoal bootstrap."""

    root: Path
    client_key: Path
    wheelhouse: Path
    mesh: LocalMesh
    servers: list[SshServer] = field(default_factory=list)

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def cluster_dir(self) -> Path:
        return self.mesh.root / "cluster"

    @property
    def seed(self) -> str:
        return self.mesh.agents[0].address

    def remote_dir(self, i: int) -> Path:
        return self.root / f"remote-{i}"

    def add_hosts(self, count: int, *, trust: bool = True) -> list[SshServer]:
        new = []
        for _ in range(count):
            i = len(self.servers)
            server = start_sshd(self.root / f"sshd-{i}", self.client_key.with_suffix(".pub"))
            self.servers.append(server)
            new.append(server)
            if trust:
                with self.known_hosts.open("a") as f:
                    f.write(server.known_hosts_line())
        return new

    def hosts_file(self, indices: list[int], python: str | None = None) -> Path:
        ports = free_ports(len(indices))
        lines = []
        for i, port in zip(indices, ports, strict=True):
            lines += [
                "[[host]]",
                f'address = "{self.servers[i].address}"',
                f'listen = "127.0.0.1:{port}"',
                'sim = "l4:2"',
                f"sim_seed = {100 + i}",
                f'remote_dir = "{self.remote_dir(i)}"',
                f'labels = {{ rack = "r{i}" }}',
            ]
            if python:
                lines.append(f'python = "{python}"')
            lines.append("")
        path = self.root / f"hosts-{'-'.join(map(str, indices))}.toml"
        path.write_text("\n".join(lines))
        return path

    def args(self, *extra: str, wheelhouse: Path | None = None) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_bootstrap_arguments(parser)
        return parser.parse_args(
            [
                "--identity",
                str(self.cluster_dir),
                "--join",
                self.seed,
                "--known-hosts",
                str(self.known_hosts),
                "--ssh-key",
                str(self.client_key),
                "--wheelhouse",
                str(wheelhouse or self.wheelhouse),
                "--system-site-packages",
                "--python",
                sys.executable,
                "--join-timeout",
                "120",  # the default: a loaded CI machine took over 60 s to join three at once
                *extra,
            ]
        )

    def bootstrap(self, *extra: str, wheelhouse: Path | None = None) -> list[HostResult]:
        return bootstrap(self.args(*extra, wheelhouse=wheelhouse), reporter=QuietReporter())

    def supervisor_pid(self, i: int) -> int | None:
        pidfile = self.remote_dir(i) / "agent.pid"
        with contextlib.suppress(OSError, ValueError):
            return int(pidfile.read_text().strip())
        return None

    def nodes(self) -> list[dict[str, object]]:
        async def go() -> list[dict[str, object]]:
            async with self.mesh.client(0) as client:
                return await client.nodes()

        return asyncio.run(go())

    def stop_remote_agents(self) -> None:
        for i in range(len(self.servers)):
            pid = self.supervisor_pid(i)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def fleet(tmp_path: Path, client_key: Path, wheelhouse: Path) -> Iterator[Fleet]:
    _need_sshd()
    mesh = LocalMesh(tmp_path / "mesh", 2, profiles=("h100:2", "mi300x:2"))
    fleet = Fleet(root=tmp_path, client_key=client_key, wheelhouse=wheelhouse, mesh=mesh)
    with mesh:
        asyncio.run(mesh.wait_converged(60))
        try:
            yield fleet
        finally:
            fleet.stop_remote_agents()
            for server in fleet.servers:
                server.stop()
