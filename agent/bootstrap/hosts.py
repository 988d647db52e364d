"""Bootstrap targets: ``user@host[:port]`` on the command line or ``[[host]]`` in a TOML file.

Hosts file::

    [[host]]
    address = "root@gpu-01.lab:22"
    labels = { team = "vision" }
    zone = "rack-a"
    listen = "0.0.0.0:7946"        # the agent's listen address on that host
    advertise = "10.0.0.21"        # what peers dial (default: the address SSH connected to)
    sim = "h100:2"                 # simulate GPUs (tests and demos)
    sim_seed = 3
    python = "/usr/bin/python3.12" # the interpreter to build the venv from
    remote_dir = "/srv/shoal"      # where Shoal lives on that host

Every key but ``address`` is optional; unknown keys are refused so a typo is not ignored.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.common.errors import UserError
from agent.common.parsing import toml_loads

DEFAULT_SSH_PORT = 22
DEFAULT_AGENT_PORT = 7946


@dataclass(frozen=True, slots=True)
class HostSpec:
    """One host to bootstrap and how its agent should be set up."""

    host: str
    user: str | None = None
    port: int = DEFAULT_SSH_PORT
    labels: dict[str, str] = field(default_factory=dict)
    zone: str | None = None
    listen: str | None = None
    advertise: str | None = None
    sim: str | None = None
    sim_seed: int | None = None
    python: str | None = None
    remote_dir: str | None = None

    @property
    def name(self) -> str:
        """How the host is shown: ``user@host:port`` with the defaults left out."""
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port != DEFAULT_SSH_PORT else ""
        host = f"[{self.host}]" if ":" in self.host and port else self.host
        return f"{user}{host}{port}"


def parse_target(text: str) -> HostSpec:
    """``[user@]host[:port]``; IPv6 hosts take brackets when a port follows (``[::1]:2222``)."""
    user: str | None = None
    rest = text.strip()
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not user:
            raise UserError(f"{text!r}: empty user name before '@'")
    port = DEFAULT_SSH_PORT
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep:
            raise UserError(f"{text!r}: missing ']' after an IPv6 address")
        if tail:
            if not tail.startswith(":"):
                raise UserError(f"{text!r}: expected ':PORT' after ']'")
            port = _port(tail[1:], text)
    elif rest.count(":") == 1:
        host, raw_port = rest.split(":")
        port = _port(raw_port, text)
    else:
        host = rest
    if not host:
        raise UserError(f"{text!r}: no host name")
    if any(ch.isspace() or not ch.isprintable() for ch in host):
        raise UserError(f"{text!r}: a host name has no spaces or control characters")
    return HostSpec(host=host, user=user, port=port)


def _port(raw: str, text: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) < 65536:
        raise UserError(f"{text!r}: port must be a number from 1 to 65535")
    return int(raw)


_STR_KEYS = ("zone", "listen", "advertise", "sim", "python", "remote_dir")
_KEYS = {"address", "labels", "sim_seed", *_STR_KEYS}


def _host_from_table(doc: dict[str, Any], where: str) -> HostSpec:
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}")
    address = doc.get("address")
    if not isinstance(address, str):
        raise UserError(f'{where}: address = "user@host[:port]" is required')
    spec = parse_target(address)
    values: dict[str, Any] = {}
    for key in _STR_KEYS:
        if key in doc:
            if not isinstance(doc[key], str):
                raise UserError(f"{where}: {key} must be a string")
            values[key] = doc[key]
    labels = doc.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise UserError(f"{where}: labels must be a table of strings")
    seed = doc.get("sim_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UserError(f"{where}: sim_seed must be an integer")
    return HostSpec(
        host=spec.host,
        user=spec.user,
        port=spec.port,
        labels=dict(labels),
        sim_seed=seed,
        **values,
    )


def parse_hosts_file(text: str, where: str = "hosts file") -> list[HostSpec]:
    try:
        doc = toml_loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: {exc}") from None
    extra = sorted(set(doc) - {"host"})
    if extra:
        raise UserError(f"{where}: unknown table {extra[0]!r} (hosts are [[host]] entries)")
    tables = doc.get("host", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UserError(f"{where}: hosts are [[host]] entries")
    return [_host_from_table(t, f"{where}: host #{i + 1}") for i, t in enumerate(tables)]


def load_hosts_file(path: Path) -> list[HostSpec]:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_hosts_file(text, str(path))
