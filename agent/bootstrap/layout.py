"""Where Shoal lives on a bootstrapped host, all under one base directory::

    BASE/venv            -> venvs/<version>-<tag>   (a symlink, flipped atomically on upgrade)
    BASE/venvs/          one venv per installed build
    BASE/identity/       node.key (made here, never copied), node.crt, ca.crt
    BASE/data/           the agent's SQLite store, jobs and logs
    BASE/agent.toml      the agent's config
    BASE/install.toml    what bootstrap installed (version, wheel digest, service kind)
    BASE/agent.pid, BASE/agent.log   the supervised process (hosts without systemd or launchd)

The base is ``~/.local/share/shoal`` for a user and ``/opt/shoal`` for root, or ``--remote-dir``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

USER_BASE = "~/.local/share/shoal"
ROOT_BASE = "/opt/shoal"


@dataclass(frozen=True, slots=True)
class RemoteLayout:
    base: str

    @classmethod
    def for_host(cls, requested: str | None, home: str, is_root: bool) -> RemoteLayout:
        base = requested or (ROOT_BASE if is_root else USER_BASE)
        if base == "~" or base.startswith("~/"):
            base = home.rstrip("/") + base[1:]
        if not base.startswith("/"):
            base = posixpath.join(home, base)
        return cls(posixpath.normpath(base))

    def _join(self, name: str) -> str:
        return posixpath.join(self.base, name)

    @property
    def venv(self) -> str:
        return self._join("venv")

    @property
    def venvs(self) -> str:
        return self._join("venvs")

    @property
    def python(self) -> str:
        return self._join("venv/bin/python")

    @property
    def identity_dir(self) -> str:
        return self._join("identity")

    @property
    def data_dir(self) -> str:
        return self._join("data")

    @property
    def config(self) -> str:
        return self._join("agent.toml")

    @property
    def install_record(self) -> str:
        return self._join("install.toml")

    @property
    def pidfile(self) -> str:
        return self._join("agent.pid")

    @property
    def log(self) -> str:
        return self._join("agent.log")

    @property
    def uploads(self) -> str:
        return self._join("upload")
