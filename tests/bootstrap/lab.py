"""A first fleet's machines, on this one: hosts in network namespaces, each with its own sshd, host
name and ``/opt``, and an operator's machine beside them.

Host ``i`` (of ``hosts``) is namespace ``i`` of a :class:`tests.netns.Lab` at ``198.18.0.(i+1)``,
named ``gpu<i+1>``: its sshd listens on port 22 there, with a fresh host key (so the operator's
``known_hosts`` does not know it), lets in the operator's key as root, and runs in its own UTS and
mount namespaces with a private ``/opt`` (a folder of the lab), so ``/opt/shoal`` of one host is
not another's. Everything a session starts there (the agent, its supervisor, its jobs) inherits
them. The operator's machine is the last namespace: its ``HOME`` (``~/.ssh``, ``~/.config/shoal``)
is a folder of the lab, and :meth:`SshLab.operator` runs a command there.

Run as a script, it opens a lab and holds it until Ctrl-C, printing how to use it
(``python -m tests.bootstrap.lab``); the docs' first fleet
(``docs/operations/first-fleet.md``) was timed in one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.bootstrap.sshd import SSHD, keygen, write_config
from tests.netns import Lab, netns_available

SSH_PORT = 22


@dataclass
class SshLab:
    root: Path
    hosts: int = 3
    net: Lab = field(init=False)
    sshd: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.net = Lab(self.hosts + 1)

    # -- where things are ------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        """The operator's home folder."""
        return self.root / "operator"

    @property
    def known_hosts(self) -> Path:
        return self.home / ".ssh" / "known_hosts"

    @property
    def cluster_dir(self) -> Path:
        return self.home / ".config" / "shoal" / "cluster"

    def address(self, i: int) -> str:
        return self.net.address(i)

    def target(self, i: int) -> str:
        """``root@198.18.0.(i+1)``, as the operator names host ``i``."""
        return f"root@{self.address(i)}"

    def name(self, i: int) -> str:
        return f"gpu{i + 1}"

    def opt(self, i: int) -> Path:
        """Host ``i``'s ``/opt`` as seen from outside the lab."""
        return self.root / f"host-{i}" / "opt"

    def pidfile(self, i: int) -> Path:
        """The supervisor's pidfile of host ``i``'s agent (root's ``/opt/shoal/agent.pid``)."""
        return self.opt(i) / "shoal" / "agent.pid"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The operator's environment: its own home, nothing of the caller's Shoal settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "XDG_"))}
        env.update({"HOME": str(self.home), "PYTHONUNBUFFERED": "1"})
        env.update(extra or {})
        return env

    def operator(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on the operator's machine."""
        return self.net.command(self.hosts, argv)

    # -- up and down -----------------------------------------------------------------------------

    def open(self) -> SshLab:
        ok, why = netns_available()
        if not ok:
            raise RuntimeError(why)
        if not SSHD.exists():
            raise RuntimeError("OpenSSH server not installed")
        (self.home / ".ssh").mkdir(parents=True, mode=0o700)
        keygen(self.home / ".ssh" / "id_ed25519")
        self.net.open()
        try:
            for i in range(self.hosts):
                self.sshd.append(self._start_sshd(i))
        except BaseException:
            self.close()
            raise
        return self

    def _start_sshd(self, i: int) -> subprocess.Popen[bytes]:
        directory = self.root / f"host-{i}"
        self.opt(i).mkdir(parents=True)
        keygen(directory / "host_ed25519")
        authorized = directory / "authorized_keys"
        shutil.copy(self.home / ".ssh" / "id_ed25519.pub", authorized)
        config = write_config(directory, self.address(i), SSH_PORT, authorized)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        script = (
            f"hostname {self.name(i)} && mount --bind {self.opt(i)} /opt && "
            f"exec {SSHD} -D -e -f {config}"
        )
        with (directory / "sshd.log").open("wb") as log:  # sshd keeps its own copy of the file
            process = subprocess.Popen(
                self.net.command(i, ["unshare", "--uts", "sh", "-c", script]),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 10
        probe = ["bash", "-c", f"exec 3<>/dev/tcp/{self.address(i)}/{SSH_PORT}"]
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(directory / 'sshd.log').read_text()[-500:]}")
            ready = subprocess.run(self.net.command(i, probe), capture_output=True, check=False)
            if ready.returncode == 0:
                return process
            time.sleep(0.1)
        process.kill()
        raise RuntimeError("sshd did not listen within 10 s")

    def supervisor_pid(self, i: int) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.pidfile(i).read_text().strip())
        return None

    def stop_agents(self) -> None:
        """Kill every host's supervised agent (its process group) and its jobs."""
        for i in range(self.hosts):
            pid = self.supervisor_pid(i)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def close(self) -> None:
        self.stop_agents()
        for process in self.sshd:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        self.sshd.clear()
        self.net.close()


def main() -> int:
    """Open a lab in a temporary folder and hold it until Ctrl-C."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="shoal-lab-") as tmp:
        lab = SshLab(Path(tmp)).open()
        try:
            hosts = " ".join(lab.target(i) for i in range(lab.hosts))
            print(f"hosts: {hosts}")
            print(f"operator: ip netns exec {lab.net.host(lab.hosts)} env HOME={lab.home} bash")
            print("Ctrl-C ends the lab", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        finally:
            lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
