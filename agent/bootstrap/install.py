"""The venv and Shoal itself on the host: from the package index, or from an uploaded wheelhouse.

Each build gets its own venv under ``BASE/venvs``; ``BASE/venv`` is a symlink flipped atomically
once the new venv is installed and checked, so an upgrade that fails leaves the old one running
and a rerun with nothing new installs nothing. What was installed is recorded in
``BASE/install.toml``.

``--system-site-packages`` lets the venv use the packages of the interpreter it is built from —
including, when that interpreter is itself a venv, that venv's packages (a ``.pth`` file names
them) — and installs Shoal alone (``--no-deps``). It is for hosts that already carry Shoal's
dependencies (a shared cluster image, or a test machine).
"""

from __future__ import annotations

import hashlib
import shlex
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from agent.bootstrap.layout import RemoteLayout
from agent.bootstrap.locked import HASHES_FILE, hashes_text, verified_wheelhouse, wheel_identity
from agent.bootstrap.ssh import BootstrapError, Remote, RemoteCommandFailed

if TYPE_CHECKING:
    from agent.bootstrap.shipping import HostPlatform, LocalBuild

PIP_TIMEOUT_S = 900.0

_SITE_CODE = "import site, sys; print('\\n'.join(site.getsitepackages()))"
_PURELIB_CODE = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
_VERSION_CODE = "import importlib.metadata as m; print(m.version('shoal'))"
_SWAP_CODE = (
    "import os, sys; t, link = sys.argv[1], sys.argv[2]; tmp = link + '.new'\n"
    "if os.path.lexists(tmp): os.unlink(tmp)\n"
    "os.symlink(t, tmp); os.replace(tmp, link)"
)


@dataclass(frozen=True, slots=True)
class InstallSource:
    """Where Shoal comes from: a wheelhouse folder, this checkout's own build (``local_build``,
    shipped with its dependencies: :mod:`agent.bootstrap.shipping`), or the package index."""

    version: str
    wheelhouse: Path | None = None
    inherit_site_packages: bool = False
    index_url: str | None = None
    local_build: LocalBuild | None = None

    @property
    def where(self) -> str:
        """Where the wheels come from, as the progress line says it."""
        if self.wheelhouse is not None:
            return "the wheelhouse"
        if self.local_build is not None:
            return "this checkout (its wheel and dependencies, shipped)"
        return "the package index"

    def wheels(self) -> list[Path]:
        """The wheels to ship; a wheelhouse's are each checked against its hashes first."""
        if self.wheelhouse is None:
            return [self.local_build.wheel] if self.local_build is not None else []
        if not any(p.name.endswith(".whl") for p in self.wheelhouse.iterdir()):
            return []
        return verified_wheelhouse(self.wheelhouse)

    async def wheels_for(self, target: HostPlatform) -> list[Path]:
        """The wheels to upload to a host of ``target`` (none: pip uses the index)."""
        if self.local_build is not None:
            if self.inherit_site_packages:
                return [self.local_build.wheel]  # --no-deps: the inherited site has the rest
            return await self.local_build.wheels_for(target)
        if self.inherit_site_packages:
            return [w for w in self.wheels() if wheel_identity(w)[0] == "shoal"]
        return self.wheels()

    def shoal_wheel(self) -> Path | None:
        prefix = f"shoal-{self.version}-"
        return next((p for p in self.wheels() if p.name.startswith(prefix)), None)

    def build_digest(self) -> str:
        """Identifies the build: the SHA-256 of the Shoal wheel, or ``index`` for index installs."""
        if self.wheelhouse is None and self.local_build is None:
            return "index"
        wheel = self.shoal_wheel()
        if wheel is None:
            raise BootstrapError(
                f"the wheelhouse {self.wheelhouse} holds no shoal-{self.version} wheel "
                "(build one with: shoal bootstrap --build-wheelhouse DIR)"
            )
        return hashlib.sha256(wheel.read_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class InstallRecord:
    """``BASE/install.toml``."""

    version: str
    build: str
    venv: str
    service: str

    def to_toml(self) -> bytes:
        doc = {
            "install": {
                "version": self.version,
                "build": self.build,
                "venv": self.venv,
                "service": self.service,
            }
        }
        return tomli_w.dumps(doc).encode("utf-8")

    @classmethod
    def from_toml(cls, data: bytes) -> InstallRecord | None:
        try:
            section = tomllib.loads(data.decode("utf-8"))["install"]
            return cls(
                version=str(section["version"]),
                build=str(section["build"]),
                venv=str(section["venv"]),
                service=str(section["service"]),
            )
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
            return None


def is_current(record: InstallRecord | None, source: InstallSource) -> bool:
    """Whether the recorded install is the build we would install now."""
    return (
        record is not None
        and record.version == source.version
        and record.build == source.build_digest()
    )


def venv_name(source: InstallSource, suffix: str) -> str:
    build = source.build_digest()
    return f"{source.version}-{build[:12]}-{suffix}"


async def installed_version(remote: Remote, layout: RemoteLayout) -> str | None:
    result = await remote.run(
        f"{shlex.quote(layout.python)} -c {shlex.quote(_VERSION_CODE)}", check=False
    )
    out = str(result.stdout or "").strip()
    return out if result.exit_status == 0 and out else None


async def create_venv(
    remote: Remote, layout: RemoteLayout, python: str, name: str, source: InstallSource
) -> str:
    """Create ``BASE/venvs/NAME`` with ``python``; return its path."""
    path = f"{layout.venvs}/{name}"
    q = shlex.quote
    flags = " --system-site-packages" if source.inherit_site_packages else ""
    try:
        await remote.run(f"mkdir -p {q(layout.venvs)} && {q(python)} -m venv{flags} {q(path)}")
    except RemoteCommandFailed as exc:
        if "ensurepip" not in str(exc) and "venv" not in str(exc):
            raise
        raise BootstrapError(
            f"{python} cannot make a venv ({exc}); on Debian and Ubuntu install the "
            "python3.X-venv package of that Python"
        ) from None
    if source.inherit_site_packages:
        sites = await remote.run(f"{q(python)} -c {q(_SITE_CODE)}")
        purelib = await remote.run(f"{q(path)}/bin/python -c {q(_PURELIB_CODE)}")
        pth = f"{str(purelib.stdout).strip()}/shoal-inherited-site-packages.pth"
        await remote.write_file(pth, str(sites.stdout).encode("utf-8"))
    return path


async def install_shoal(
    remote: Remote,
    layout: RemoteLayout,
    venv: str,
    source: InstallSource,
    wheels: Sequence[Path] = (),
) -> None:
    """pip-install this exact version into ``venv`` (from ``wheels``, uploaded with a
    ``requirements.txt`` that pins each to its SHA-256 and installed with ``--require-hashes``,
    or else from the package index) and check that it imports."""
    q = shlex.quote
    pip = f"{q(venv)}/bin/python -m pip install --disable-pip-version-check --no-input -q"
    if source.inherit_site_packages:
        # The inherited site may hold a Shoal of its own (a development checkout): ignore it.
        pip += " --no-deps --ignore-installed"
    requirement = q(f"shoal=={source.version}")
    upload = ""
    if wheels:
        upload = f"{layout.uploads}/{Path(venv).name}"
        await remote.run(f"mkdir -p {q(upload)}")
        await remote.put_files([(w, f"{upload}/{w.name}") for w in wheels])
        await remote.write_file(f"{upload}/{HASHES_FILE}", hashes_text(wheels).encode("utf-8"))
        pip += f" --no-index --find-links {q(upload)} --require-hashes"
        requirement = f"-r {q(f'{upload}/{HASHES_FILE}')}"
    else:
        pip += " --retries 1 --timeout 15"
        if source.index_url:
            pip += f" --index-url {q(source.index_url)}"
    try:
        await remote.run(f"{pip} {requirement}", timeout_s=PIP_TIMEOUT_S)
    except RemoteCommandFailed as exc:
        if upload and "HASHES" in str(exc).upper():
            raise BootstrapError(
                "a wheel uploaded to the host does not match its hash: refused, nothing installed"
            ) from None
        if upload:
            raise
        raise BootstrapError(
            f"pip could not install shoal=={source.version} from the package index ({exc}); "
            "for hosts that cannot reach it, build a wheelhouse (shoal bootstrap "
            "--build-wheelhouse DIR) and pass --wheelhouse DIR"
        ) from None
    finally:
        if upload:
            await remote.run(f"rm -rf {q(upload)}", check=False)
    check = f"{q(venv)}/bin/python -c " + q(
        "import agent.cli, gossip.identity, agent.bootstrap.supervise; " + _VERSION_CODE
    )
    result = await remote.run(check, check=False)
    got = str(result.stdout or "").strip()
    if result.exit_status != 0 or got != source.version:
        raise BootstrapError(
            f"Shoal {source.version} does not import in the new venv ({got or 'import failed'})"
        )


async def point_venv(remote: Remote, layout: RemoteLayout, python: str, target: str) -> None:
    """Make ``BASE/venv`` point at ``target`` in one atomic rename."""
    q = shlex.quote
    await remote.run(f"{q(python)} -c {q(_SWAP_CODE)} {q(target)} {q(layout.venv)}")


async def current_venv_target(remote: Remote, layout: RemoteLayout) -> str | None:
    result = await remote.run(f"readlink {shlex.quote(layout.venv)}", check=False)
    out = str(result.stdout or "").strip()
    return out if result.exit_status == 0 and out else None


async def read_record(remote: Remote, layout: RemoteLayout) -> InstallRecord | None:
    data = await remote.read_file(layout.install_record)
    return InstallRecord.from_toml(data) if data is not None else None


async def write_record(remote: Remote, layout: RemoteLayout, record: InstallRecord) -> None:
    await remote.write_file(layout.install_record, record.to_toml())
