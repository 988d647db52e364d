"""One host end to end, and many hosts in parallel.

:func:`bootstrap_host` converges a host on "this Shoal build, certified by this cluster, running
with this config, alive in the mesh": it installs what is missing or different, leaves alone what
is already right (a rerun changes nothing and restarts nothing), and on any failure undoes what
this run did, in reverse, so the host is as it was. :func:`uninstall_host` removes it all and
revokes the node. Upgrades of running nodes go one host at a time (``upgrade_slots``) and drain
the node through the API first when it is in the mesh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from cryptography import x509

from agent.bootstrap import install, mesh
from agent.bootstrap.agentconfig import agent_address, render_config
from agent.bootstrap.certify import KeyReport, needs_certificate, sign_node
from agent.bootstrap.hosts import HostSpec
from agent.bootstrap.install import InstallRecord, InstallSource
from agent.bootstrap.layout import RemoteLayout
from agent.bootstrap.probe import (
    PYTHON_CANDIDATES,
    HostFacts,
    NoPython,
    parse_probe,
    probe_script,
    require_python,
)
from agent.bootstrap.service import Service, choose_kind, service_kind
from agent.bootstrap.ssh import BootstrapError, Remote, SshOptions, connect
from agent.client import ApiClient, ApiError
from agent.revocations import publish, revoke_nodes
from gossip.identity import (
    CA_CERT,
    NODE_CERT,
    ClusterIdentity,
    IdentityError,
    certificate_node_id,
)

SUPPORTED_OS = ("Linux", "Darwin")
_BASE_ENTRIES = (
    "venv",
    "venv.new",
    "venvs",
    "identity",
    "data",
    "upload",
    "agent.toml",
    "install.toml",
    "agent.pid",
    "agent.log",
)


class Reporter(Protocol):
    """Where progress goes (the rich display, or nothing in tests)."""

    def step(self, host: str, text: str) -> None: ...


class QuietReporter:
    def step(self, host: str, text: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    """Everything a run needs besides the hosts."""

    cluster: ClusterIdentity
    source: InstallSource
    ssh: SshOptions
    join: tuple[str, ...] = ()
    remote_dir: str | None = None
    python: str | None = None
    service: str = "auto"
    force_reinstall: bool = False
    wait: bool = True
    join_timeout_s: float = 120.0
    cert_valid_for: timedelta = timedelta(days=365)
    drain_grace_s: float = 60.0
    drain_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class HostResult:
    """What happened on one host; ``message`` is the one line shown for it."""

    host: str
    ok: bool
    action: str
    message: str
    node_id: str | None = None
    os: str | None = None
    arch: str | None = None
    python: str | None = None
    gpu_drivers: str | None = None
    gpus: str | None = None
    service: str | None = None
    base: str | None = None
    changes: tuple[str, ...] = ()


@dataclass
class _Run:
    """One host's run: the undo stack and what was learned so far."""

    spec: HostSpec
    reporter: Reporter
    undo: list[tuple[str, Callable[[], Awaitable[None]]]] = field(default_factory=list)
    facts: HostFacts | None = None
    python: str | None = None
    layout: RemoteLayout | None = None
    kind: str | None = None
    node_id: str | None = None

    def step(self, text: str) -> None:
        self.reporter.step(self.spec.name, text)

    async def rollback(self) -> None:
        for what, action in reversed(self.undo):
            self.step(f"undoing: {what}")
            with contextlib.suppress(BootstrapError, OSError, asyncio.TimeoutError):
                await action()
        self.undo.clear()

    def failed(self, why: str) -> HostResult:
        facts = self.facts
        return HostResult(
            host=self.spec.name,
            ok=False,
            action="failed",
            message=why,
            node_id=self.node_id,
            os=facts.os if facts else None,
            arch=facts.arch if facts else None,
            python=self.python,
            gpu_drivers=facts.gpu_summary() if facts else None,
            base=self.layout.base if self.layout else None,
        )


def _q(text: str) -> str:
    return shlex.quote(text)


async def _probe(remote: Remote, run: _Run, options: BootstrapOptions) -> HostFacts:
    run.step("probing")
    wanted = run.spec.python or options.python
    pythons = (wanted,) if wanted else PYTHON_CANDIDATES
    result = await remote.run(probe_script(pythons), timeout_s=60)
    facts = parse_probe(str(result.stdout))
    run.facts = facts
    if facts.os not in SUPPORTED_OS:
        raise BootstrapError(f"unsupported OS {facts.os!r} (Linux and macOS are)")
    return facts


def _operator_client(options: BootstrapOptions, address: str) -> ApiClient:
    return ApiClient(options.cluster.operator, address, timeout_s=5.0)


async def _confirm(run: _Run, options: BootstrapOptions, node_id: str) -> dict[str, Any]:
    """Wait until the node is alive in the mesh (through the seed, else through itself)."""
    address = options.join[0] if options.join else agent_address(run.spec)
    run.step(f"waiting for the node in the mesh (via {address})")
    async with _operator_client(options, address) as client:
        node = await mesh.wait_alive(client, node_id, options.join_timeout_s)
    if node is None:
        raise BootstrapError(
            f"the agent did not join the mesh within {options.join_timeout_s:.0f} s "
            f"(via {address}); see {run.layout.log if run.layout else 'its log'} on the host"
        )
    return node


async def _node_in_mesh(options: BootstrapOptions, node_id: str) -> bool:
    if not options.join:
        return False
    async with _operator_client(options, options.join[0]) as client:
        node = await mesh.find_node(client, node_id)
    return node is not None and node.get("state") == "alive"


async def bootstrap_host(
    spec: HostSpec,
    options: BootstrapOptions,
    reporter: Reporter,
    upgrade_slots: asyncio.Semaphore,
) -> HostResult:
    run = _Run(spec=spec, reporter=reporter)
    run.step("connecting")
    try:
        remote = await connect(spec, options.ssh)
    except BootstrapError as exc:
        return run.failed(str(exc))
    try:
        return await _bootstrap(remote, run, options, upgrade_slots)
    except (BootstrapError, NoPython, IdentityError, ApiError) as exc:
        await run.rollback()
        return run.failed(str(exc))
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(run.rollback())
        raise
    finally:
        remote.close()


async def _bootstrap(
    remote: Remote, run: _Run, options: BootstrapOptions, upgrade_slots: asyncio.Semaphore
) -> HostResult:
    facts = await _probe(remote, run, options)
    python = require_python(facts, run.spec.name)
    run.python = f"{python.version_text} ({python.path})"
    layout = RemoteLayout.for_host(
        run.spec.remote_dir or options.remote_dir, facts.home, facts.is_root
    )
    run.layout = layout
    source = options.source
    changes: list[str] = []

    base_exists = (await remote.run(f"test -d {_q(layout.base)}", check=False)).exit_status == 0
    if not base_exists:
        # A root agent runs its jobs as another user, who must pass through to its job folder.
        mode = "711" if facts.is_root else "700"
        await remote.run(f"mkdir -p {_q(layout.base)} && chmod {mode} {_q(layout.base)}")
        run.undo.append(("remove " + layout.base, lambda: _rm(remote, layout.base)))
    record = await install.read_record(remote, layout)
    kind = choose_kind(facts, options.service)
    run.kind = kind
    service = Service(kind, layout, facts)
    old_kind = service_kind(record.service) if record else None
    old_service = Service(old_kind, layout, facts) if old_kind else None
    running_before = bool(old_service and await old_service.is_running(remote))

    installed = await install.installed_version(remote, layout)
    need_install = (
        options.force_reinstall
        or not install.is_current(record, source)
        or installed != source.version
    )
    old_target = await install.current_venv_target(remote, layout)
    new_venv: str | None = None
    if need_install:
        run.step(f"creating venv ({python.version_text})")
        name = install.venv_name(source, str(int(time.time())))
        venv_path = f"{layout.venvs}/{name}"
        run.undo.append((f"remove {venv_path}", lambda: _rm(remote, venv_path)))
        new_venv = await install.create_venv(remote, layout, python.path, name, source)
        where = "wheelhouse" if source.wheelhouse else "index"
        run.step(f"installing shoal {source.version} from the {where}")
        await install.install_shoal(remote, layout, new_venv, source)
        changes.append(
            f"shoal {installed} -> {source.version}" if installed else f"shoal {source.version}"
        )
    venv_python = f"{new_venv}/bin/python" if new_venv else layout.python

    # -- identity: key made on the host, certificate signed here -------------------------------
    run.step("node key")
    out = await remote.run(
        f"{_q(venv_python)} -m agent.bootstrap.keygen --dir {_q(layout.identity_dir)}"
    )
    try:
        report = KeyReport.from_json(json.loads(str(out.stdout)))
    except (ValueError, KeyError, TypeError) as exc:
        raise BootstrapError(f"the host's keygen printed something unexpected: {exc}") from None
    run.node_id = report.node_id
    if report.created:
        changes.append("node key")
        key_path = f"{layout.identity_dir}/node.key"
        run.undo.append(("remove the node key", lambda: _rm(remote, key_path)))
    now = datetime.now(UTC)
    if needs_certificate(report, options.cluster, now):
        run.step("signing the certificate")
        names = sorted({run.spec.host, *([run.spec.advertise] if run.spec.advertise else [])})
        signed = sign_node(options.cluster, report, names, options.cert_valid_for, now)
        for name, data in ((CA_CERT, signed.ca_crt_pem), (NODE_CERT, signed.node_crt_pem)):
            path = f"{layout.identity_dir}/{name}"
            await _replace_file(remote, run, path, data, f"restore {name}")
        changes.append("certificate")

    # -- config and service ------------------------------------------------------------------
    config = render_config(run.spec, layout, options.join)
    if await remote.read_file(layout.config) != config:
        run.step("writing agent.toml")
        await _replace_file(remote, run, layout.config, config, "restore agent.toml")
        changes.append("config")

    restart = bool(changes) or not running_before or (old_service and old_service.kind != kind)
    node: dict[str, Any] | None = None
    if restart:
        slots = upgrade_slots if running_before else _NO_LIMIT
        async with slots:
            node = await _switch_and_start(
                remote,
                run,
                options,
                layout,
                service,
                old_service,
                running_before,
                new_venv,
                old_target,
                python.path,
                changes,
            )
    elif options.wait and run.node_id:
        node = await _confirm(run, options, run.node_id)

    await install.write_record(
        remote,
        layout,
        InstallRecord(
            version=source.version,
            build=source.build_digest(),
            venv=(new_venv or old_target or "").rsplit("/", 1)[-1],
            service=kind,
        ),
    )
    run.undo.clear()
    if new_venv:
        await _prune_venvs(remote, layout, new_venv)
    action = "installed" if record is None else ("upgraded" if need_install else "updated")
    if not changes and not restart:
        action = "unchanged"
    gpus = mesh.describe_devices(node) if node is not None else None
    message = ", ".join(changes) if changes else "nothing to change"
    if node is None and not options.wait:
        message += "; not waiting for the mesh"
    return HostResult(
        host=run.spec.name,
        ok=True,
        action=action,
        message=message,
        node_id=run.node_id,
        os=facts.os,
        arch=facts.arch,
        python=run.python,
        gpu_drivers=facts.gpu_summary(),
        gpus=gpus,
        service=kind,
        base=layout.base,
        changes=tuple(changes),
    )


class _Unlimited:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_LIMIT = _Unlimited()


async def _switch_and_start(
    remote: Remote,
    run: _Run,
    options: BootstrapOptions,
    layout: RemoteLayout,
    service: Service,
    old_service: Service | None,
    running_before: bool,
    new_venv: str | None,
    old_target: str | None,
    python_path: str,
    changes: list[str],
) -> dict[str, Any] | None:
    drained = False
    node_id = run.node_id
    if running_before and node_id and await _node_in_mesh(options, node_id):
        run.step("draining")
        async with _operator_client(options, options.join[0]) as client:
            drained = await mesh.drain(
                client, node_id, options.drain_grace_s, options.drain_timeout_s
            )
        if not drained:
            raise BootstrapError(
                f"the node did not drain within {options.drain_timeout_s:.0f} s; nothing changed"
            )

        async def undo_drain() -> None:
            async with _operator_client(options, options.join[0]) as c:
                with contextlib.suppress(ApiError):
                    await mesh.undrain(c, node_id)

        run.undo.append(("undrain", undo_drain))
    if running_before and old_service is not None:

        async def restart_old() -> None:
            await old_service.install(remote)
            await old_service.start(remote)

        run.undo.append(("restart the previous agent", restart_old))
        run.step("stopping the running agent")
        await old_service.stop(remote)
        if old_service.kind != service.kind:
            await old_service.remove(remote)
    if new_venv:
        run.step("switching venv")
        await install.point_venv(remote, layout, python_path, new_venv)

        async def restore_link() -> None:
            if old_target:
                await install.point_venv(remote, layout, python_path, old_target)
            else:
                await _rm(remote, layout.venv)

        run.undo.append(("restore the previous venv", restore_link))
    run.step(f"installing the {service.kind} service")
    if await service.install(remote):
        changes.append(f"{service.kind} unit")
        if old_service is None or old_service.kind != service.kind:
            run.undo.append(("remove the unit", lambda: service.remove(remote)))
    run.step("starting the agent")
    run.undo.append(("stop the new agent", lambda: service.stop(remote)))
    await service.start(remote)
    node: dict[str, Any] | None = None
    if options.wait and node_id:
        node = await _confirm(run, options, node_id)
    if drained and node_id:
        run.step("undraining")
        async with _operator_client(options, options.join[0]) as client:
            await mesh.undrain(client, node_id)
    return node


async def _rm(remote: Remote, path: str) -> None:
    """Remove ``path``, first killing what still runs from it (a pip install cut short when a
    run is stopped keeps going after its SSH channel closes). The pattern ``[/]x/...`` matches
    ``/x/...`` but not the shell running that command, which therefore must not name the path."""
    pattern = _q(f"[{path[0]}]{path[1:]}")
    kill = f"pkill -KILL -f -- {pattern} 2>/dev/null"
    await remote.run(f"{kill}; sleep 0.2; {kill}; true", check=False)  # no literal path in it
    await remote.run(f"rm -rf {_q(path)}", check=False)


async def _replace_file(remote: Remote, run: _Run, path: str, data: bytes, what: str) -> None:
    old = await remote.read_file(path)

    async def restore() -> None:
        if old is None:
            await _rm(remote, path)
        else:
            await remote.write_file(path, old)

    run.undo.append((what, restore))
    await remote.run(f"mkdir -p {_q(path.rsplit('/', 1)[0])}")
    await remote.write_file(path, data)


async def _prune_venvs(remote: Remote, layout: RemoteLayout, keep: str) -> None:
    """Remove venvs other than the current one (after a successful switch)."""
    keep_name = keep.rsplit("/", 1)[-1]
    await remote.run(
        f'cd {_q(layout.venvs)} && for d in *; do [ "$d" = {_q(keep_name)} ] || rm -rf "$d"; done',
        check=False,
    )


# -- uninstall ---------------------------------------------------------------------------------


async def uninstall_host(
    spec: HostSpec, options: BootstrapOptions, reporter: Reporter
) -> HostResult:
    run = _Run(spec=spec, reporter=reporter)
    run.step("connecting")
    try:
        remote = await connect(spec, options.ssh)
    except BootstrapError as exc:
        return run.failed(str(exc))
    try:
        return await _uninstall(remote, run, options)
    except (BootstrapError, IdentityError, ApiError) as exc:
        return run.failed(str(exc))
    finally:
        remote.close()


async def _uninstall(remote: Remote, run: _Run, options: BootstrapOptions) -> HostResult:
    facts = await _probe(remote, run, options)
    layout = RemoteLayout.for_host(
        run.spec.remote_dir or options.remote_dir, facts.home, facts.is_root
    )
    run.layout = layout
    record = await install.read_record(remote, layout)
    cert_pem = await remote.read_file(f"{layout.identity_dir}/{NODE_CERT}")
    node_id: str | None = None
    if cert_pem is not None:
        try:
            node_id = certificate_node_id(x509.load_pem_x509_certificate(cert_pem))
        except (ValueError, IdentityError):
            node_id = None
    run.node_id = node_id
    if record is None and cert_pem is None and not await _exists(remote, layout.base):
        return HostResult(
            host=run.spec.name,
            ok=True,
            action="absent",
            message=f"no Shoal under {layout.base}",
            base=layout.base,
        )
    if node_id and options.join:
        with contextlib.suppress(ApiError, BootstrapError):
            if await _node_in_mesh(options, node_id):
                run.step("draining")
                async with _operator_client(options, options.join[0]) as client:
                    await mesh.drain(
                        client, node_id, options.drain_grace_s, options.drain_timeout_s
                    )
    kinds = {choose_kind(facts, options.service)}
    recorded = service_kind(record.service) if record else None
    if recorded:
        kinds.add(recorded)
    for kind in sorted(kinds):
        run.step(f"removing the {kind} service")
        await Service(kind, layout, facts).remove(remote)
    run.step("removing venv, key and data")
    entries = " ".join(_q(f"{layout.base}/{e}") for e in _BASE_ENTRIES)
    await remote.run(f"rm -rf {entries}; rmdir {_q(layout.base)} 2>/dev/null; true")
    message = f"removed {layout.base}"
    if node_id:
        run.step("revoking the certificate")
        signed = revoke_nodes(options.cluster, {node_id})
        message += f"; node {node_id[:12]} revoked (list v{signed.version})"
        if options.join:
            async with _operator_client(options, options.join[0]) as client:
                why = await publish(client, signed)
            if why is not None:
                message += f"; not yet published to the mesh: {why}"
    return HostResult(
        host=run.spec.name,
        ok=True,
        action="uninstalled",
        message=message,
        node_id=node_id,
        os=facts.os,
        arch=facts.arch,
        base=layout.base,
    )


async def _exists(remote: Remote, path: str) -> bool:
    return (await remote.run(f"test -e {_q(path)}", check=False)).exit_status == 0


# -- many hosts ----------------------------------------------------------------------------------


async def run_hosts(
    specs: Sequence[HostSpec],
    options: BootstrapOptions,
    reporter: Reporter,
    *,
    jobs: int,
    upgrade_jobs: int = 1,
    uninstall: bool = False,
) -> list[HostResult]:
    """Every host, at most ``jobs`` at once; upgrades of running nodes ``upgrade_jobs`` at once."""
    slots = asyncio.Semaphore(max(1, jobs))
    upgrade_slots = asyncio.Semaphore(max(1, upgrade_jobs))

    async def one(spec: HostSpec) -> HostResult:
        async with slots:
            if uninstall:
                result = await uninstall_host(spec, options, reporter)
            else:
                result = await bootstrap_host(spec, options, reporter, upgrade_slots)
            reporter.step(spec.name, "done" if result.ok else "failed")
            return result

    return list(await asyncio.gather(*(one(s) for s in specs)))
