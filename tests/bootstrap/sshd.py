"""Real OpenSSH servers on loopback for the bootstrap tests, and the project wheel they install.

Each :class:`SshServer` is ``/usr/sbin/sshd -D -e -f <generated config>`` on a free port with its
own Ed25519 host key, accepting one test client key for the current user; the tests reach "remote
hosts" through them (several servers = several hosts, each with its own remote base directory).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agent.bootstrap.locked import HASHES_FILE, hashes_text

SSHD = Path("/usr/sbin/sshd")
PROJECT = Path(__file__).resolve().parents[2]
SOURCE_PARTS = ("pyproject.toml", "README.md", "probers", "gossip", "agent", "tui", "bench")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shoal-test", "-f", str(path)],
        check=True,
    )


@dataclass
class SshServer:
    directory: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def host_key_pub(self) -> Path:
        return self.directory / "host_ed25519.pub"

    def known_hosts_line(self) -> str:
        key = self.host_key_pub.read_text().split()
        return f"[127.0.0.1]:{self.port} {key[0]} {key[1]}\n"

    def fingerprint(self) -> str:
        out = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key_pub)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.split()[1]

    @property
    def address(self) -> str:
        return f"{getpass.getuser()}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def sftp_server() -> str:
    return next(
        (
            p
            for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server")
            if Path(p).exists()
        ),
        "internal-sftp",
    )


def write_config(directory: Path, address: str, port: int, authorized: Path) -> Path:
    """An sshd config for ``directory`` (its host key and pidfile there): key logins only,
    for the keys of ``authorized``; root may log in with a key."""
    config = directory / "sshd_config"
    config.write_text(
        f"Port {port}\n"
        f"ListenAddress {address}\n"
        f"HostKey {directory / 'host_ed25519'}\n"
        f"PidFile {directory / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "StrictModes no\n"
        "UsePAM no\n"
        f"Subsystem sftp {sftp_server()}\n"
        "LogLevel ERROR\n"
    )
    return config


def start_sshd(directory: Path, client_pub: Path) -> SshServer:
    directory.mkdir(parents=True)
    keygen(directory / "host_ed25519")
    authorized = directory / "authorized_keys"
    shutil.copy(client_pub, authorized)
    port = free_port()
    config = write_config(directory, "127.0.0.1", port, authorized)
    if os.geteuid() == 0:
        # What Debian's ssh.service does before starting sshd (privilege separation).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with (directory / "sshd.log").open("wb") as log:  # sshd keeps its own copy of the file
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=log
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited: {(directory / 'sshd.log').read_text()[-500:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return SshServer(directory, port, process)
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("sshd did not start listening within 10 s")


def build_wheel(out: Path, version: str | None = None) -> Path:
    """``pip wheel --no-deps`` of a copy of this checkout (optionally with another version)."""
    src = out.parent / f"src-{version or 'current'}"
    for part in SOURCE_PARTS:
        path = PROJECT / part
        if path.is_dir():
            shutil.copytree(path, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, src / part)
    if version is not None:
        pyproject = src / "pyproject.toml"
        text = pyproject.read_text()
        pyproject.write_text(text.replace('version = "', f'version = "{version}" #', 1))
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(src), "-w", str(out)],
        check=True,
        capture_output=True,
    )
    (out / HASHES_FILE).write_text(hashes_text(sorted(out.glob("*.whl"))))
    return next(out.glob("shoal-*.whl"))
