"""SSH connections for bootstrap: host keys checked against known_hosts, never accepted blindly.

With ``accept_new`` (``--accept-new``, as OpenSSH's ``StrictHostKeyChecking=accept-new``) a host
that known_hosts has no key for at all is trusted on first sight: its key is added to known_hosts
and its fingerprint reported (:attr:`Remote.new_host_key`). A key that differs from a recorded one
is refused exactly as without it.

Authentication is whatever the operator's SSH setup offers (keys in ``~/.ssh``, an ssh-agent,
``~/.ssh/config``) plus any key files named with ``--ssh-key``. Every remote command runs under
``sh -c`` so the remote login shell (bash, zsh, fish...) does not matter.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from agent.bootstrap.hosts import DEFAULT_SSH_PORT, HostSpec
from agent.operator.netwhy import why

CONNECT_TIMEOUT_S = 20.0

_KEYSCAN_TYPES = {
    "ssh-ed25519": "ed25519",
    "ssh-rsa": "rsa",
    "rsa-sha2-256": "rsa",
    "rsa-sha2-512": "rsa",
    "ecdsa-sha2-nistp256": "ecdsa",
    "ecdsa-sha2-nistp384": "ecdsa",
    "ecdsa-sha2-nistp521": "ecdsa",
}


class BootstrapError(Exception):
    """One host failed; ``str()`` is the one line the operator reads."""


class UnknownHostKey(BootstrapError):
    """The host's key is not in known_hosts (``changed``: differs from the one recorded there)."""

    def __init__(self, message: str, fingerprint: str, *, changed: bool = False) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint
        self.changed = changed


class RemoteCommandFailed(BootstrapError):
    pass


@dataclass(frozen=True, slots=True)
class SshOptions:
    """How to reach hosts: the known_hosts file, extra key files, the connect timeout."""

    known_hosts: Path
    client_keys: tuple[Path, ...] = ()
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    accept_new: bool = False
    """Trust (and record) the key of a host known_hosts has no key for."""


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def keyscan_command(host: str, port: int, algorithm: str, known_hosts: Path) -> str:
    """The command that records a host's key (after the operator has checked its fingerprint)."""
    kind = _KEYSCAN_TYPES.get(algorithm)
    parts = ["ssh-keyscan"]
    if port != DEFAULT_SSH_PORT:
        parts += ["-p", str(port)]
    if kind:
        parts += ["-t", kind]
    parts.append(host)
    return f"{shlex.join(parts)} >> {shlex.quote(str(known_hosts))}"


class _Client(asyncssh.SSHClient):
    """Remembers the host key that known_hosts did not vouch for, so we can show its fingerprint;
    accepts it when ``accept`` says so (a host never seen before, under ``--accept-new``)."""

    def __init__(self, accept: bool) -> None:
        self.accept = accept
        self.refused_key: asyncssh.SSHKey | None = None
        self.accepted_key: asyncssh.SSHKey | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        if self.accept:
            self.accepted_key = key
            return True
        self.refused_key = key
        return False


def _load_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise BootstrapError(f"cannot read {path}: {exc.strerror or exc}") from None
    return asyncssh.import_known_hosts(text)


def _recorded(known: asyncssh.SSHKnownHosts, host: str, port: int) -> bool:
    """Whether known_hosts holds any key for this host (so a mismatch means the key changed)."""
    trusted, trusted_ca, *_ = known.match(host, "", port)
    return bool(trusted or trusted_ca)


class Remote:
    """One authenticated connection to one host."""

    def __init__(
        self,
        spec: HostSpec,
        conn: asyncssh.SSHClientConnection,
        new_host_key: str | None = None,
    ) -> None:
        self.spec = spec
        self.conn = conn
        self.new_host_key = new_host_key
        """``ssh-ed25519 SHA256:...`` when this connection trusted the host's key on first sight."""

    @property
    def peer_ip(self) -> str | None:
        """The address this connection reached, as resolved (not an alias or a name)."""
        peer = self.conn.get_extra_info("peername")
        return str(peer[0]) if isinstance(peer, tuple) and peer else None

    async def run(
        self, script: str, *, check: bool = True, input: str | None = None, timeout_s: float = 600
    ) -> asyncssh.SSHCompletedProcess:
        """Run ``script`` under ``sh -c``; raise RemoteCommandFailed with stderr's last line."""
        try:
            result = await self.conn.run(
                f"sh -c {shlex.quote(script)}", check=False, input=input, timeout=timeout_s
            )
        except asyncssh.TimeoutError:
            raise RemoteCommandFailed(f"a remote command ran past {timeout_s:.0f} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise BootstrapError(f"SSH connection lost: {why(exc)}") from None
        if check and result.exit_status != 0:
            raise RemoteCommandFailed(_last_line(result) or f"exit status {result.exit_status}")
        return result

    async def put_files(self, files: Sequence[tuple[Path, str]]) -> None:
        """Upload local files to remote absolute paths over SFTP."""
        try:
            async with self.conn.start_sftp_client() as sftp:
                for local, remote in files:
                    await sftp.put(str(local), remote)
        except (asyncssh.Error, OSError) as exc:
            raise BootstrapError(f"upload failed: {exc}") from None

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically (a temporary name, then rename)."""
        tmp = f"{path}.tmp"
        try:
            async with self.conn.start_sftp_client() as sftp:
                async with sftp.open(tmp, "wb") as f:
                    await f.write(data)
                await sftp.chmod(tmp, mode)
                await sftp.posix_rename(tmp, path)
        except (asyncssh.Error, OSError) as exc:
            raise BootstrapError(f"cannot write {path}: {exc}") from None

    async def read_file(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        try:
            async with self.conn.start_sftp_client() as sftp:
                if not await sftp.exists(path):
                    return None
                async with sftp.open(path, "rb") as f:
                    data: bytes = await f.read()
                    return data
        except (asyncssh.Error, OSError) as exc:
            raise BootstrapError(f"cannot read {path}: {exc}") from None

    def close(self) -> None:
        self.conn.close()


def _last_line(result: asyncssh.SSHCompletedProcess) -> str:
    for stream in (result.stderr, result.stdout):
        text = stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


async def connect(spec: HostSpec, options: SshOptions) -> Remote:
    """Connect and authenticate; an unknown or changed host key raises UnknownHostKey."""
    known = _load_known_hosts(options.known_hosts)
    client = _Client(accept=options.accept_new and not _recorded(known, spec.host, spec.port))
    kwargs: dict[str, Any] = {}
    if options.client_keys:
        kwargs["client_keys"] = [str(p) for p in options.client_keys]
    if spec.user:
        kwargs["username"] = spec.user
    try:
        conn, _ = await asyncssh.create_connection(
            lambda: client,
            spec.host,
            port=spec.port,
            known_hosts=known,
            connect_timeout=options.connect_timeout_s,
            **kwargs,
        )
    except asyncssh.HostKeyNotVerifiable:
        key = client.refused_key
        if key is None:
            raise BootstrapError("host key refused (revoked or unusable)") from None
        fingerprint = key.get_fingerprint("sha256")
        if _recorded(known, spec.host, spec.port):
            raise UnknownHostKey(
                f"host key CHANGED ({key.get_algorithm()} {fingerprint}) — it differs from "
                f"{options.known_hosts}; if the host was really reinstalled, remove the old entry "
                f"with: ssh-keygen -R {shlex.quote(_known_name(spec))} "
                f"-f {shlex.quote(str(options.known_hosts))}",
                fingerprint,
                changed=True,
            ) from None
        command = keyscan_command(spec.host, spec.port, key.get_algorithm(), options.known_hosts)
        raise UnknownHostKey(
            f"unknown host key {key.get_algorithm()} {fingerprint}; check it, then trust it "
            f"with: {command} (or rerun with --accept-new)",
            fingerprint,
        ) from None
    except asyncssh.PermissionDenied:
        raise BootstrapError(
            "SSH authentication failed (no accepted key: load one into ssh-agent or pass "
            "--ssh-key FILE)"
        ) from None
    except (asyncssh.Error, OSError, TimeoutError) as exc:
        raise BootstrapError(f"cannot connect over SSH: {why(exc)}") from None
    new_key = client.accepted_key
    if new_key is None:
        return Remote(spec, conn)
    try:
        record_host_key(options.known_hosts, spec, new_key)
    except OSError as exc:
        conn.close()
        raise BootstrapError(
            f"cannot add the host's key to {options.known_hosts}: {exc.strerror or exc}"
        ) from None
    return Remote(spec, conn, f"{new_key.get_algorithm()} {new_key.get_fingerprint('sha256')}")


def known_hosts_line(spec: HostSpec, key: asyncssh.SSHKey) -> str:
    """The known_hosts line for ``key`` of this host (``[host]:port`` off port 22)."""
    public = key.export_public_key("openssh").decode().split()
    return f"{_known_name(spec)} {public[0]} {public[1]}\n"


def record_host_key(known_hosts: Path, spec: HostSpec, key: asyncssh.SSHKey) -> None:
    """Append the host's key to known_hosts (made, 0600, in a 0700 folder, when missing)."""
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(known_hosts_line(spec, key))


def _known_name(spec: HostSpec) -> str:
    return spec.host if spec.port == DEFAULT_SSH_PORT else f"[{spec.host}]:{spec.port}"
