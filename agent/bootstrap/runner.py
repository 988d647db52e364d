"""One host end to end (many hosts at once: :mod:`agent.bootstrap.fleetrun`).

:func:`connect_host` reaches the host over SSH (the address it connected to is what the agent
advertises, see :mod:`agent.bootstrap.wiring`); :func:`bootstrap_host` then converges it on
"this Shoal build, certified by this cluster, running with this config (its seeds among the
fleet), alive in the mesh": it installs what is missing or different, leaves alone what
is already right (a rerun changes nothing and restarts nothing), and on any failure undoes what
this run did, in reverse, so the host is as it was. :func:`uninstall_host` removes it all and
revokes the node. Upgrades of running nodes go one host at a time (``upgrade_slots``) and drain
the node through the API first when it is in the mesh.

What a run is given and gives back (``BootstrapOptions``, ``HostWiring``, ``HostResult``) and one
host's run with its undo stack (``HostRun``) are :mod:`agent.bootstrap.hostrun`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shlex
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cryptography import x509

from agent.bootstrap import install, mesh
from agent.bootstrap.agentconfig import advertised_host, render_config
from agent.bootstrap.certify import KeyReport, needs_certificate, sign_node
from agent.bootstrap.hostrun import BootstrapOptions, HostResult, HostRun, HostWiring, Reporter
from agent.bootstrap.hosts import HostSpec
from agent.bootstrap.install import InstallRecord
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
from agent.bootstrap.shipping import HostPlatform, local_platform
from agent.bootstrap.ssh import BootstrapError, Remote, UnknownHostKey, connect
from agent.operator.client import ApiClient, ApiError
from agent.operator.failover import first_answering
from agent.operator.revocations import publish, revoke_nodes
from gossip.identity import (
    CA_CERT,
    NODE_CERT,
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


def _q(text: str) -> str:
    return shlex.quote(text)


async def _probe(remote: Remote, run: HostRun, options: BootstrapOptions) -> HostFacts:
    """What the host has; the interpreter asked for (``--python``) is the only one tried."""
    run.step("probing")
    wanted = run.spec.python or options.python
    pythons = (wanted,) if wanted else PYTHON_CANDIDATES
    result = await remote.run(probe_script(pythons), timeout_s=60)
    facts = parse_probe(str(result.stdout))
    run.facts = facts
    if facts.os not in SUPPORTED_OS:
        raise BootstrapError(f"unsupported OS {facts.os!r} (Linux and macOS are)")
    return facts


async def _mesh_client(options: BootstrapOptions, addresses: Sequence[str]) -> ApiClient:
    """The first of ``addresses`` that answers, as the operator."""
    return await first_answering(options.cluster.operator, addresses, what="the mesh")


async def _log_tail(remote: Remote, service: Service) -> str:
    """The agent log's last line on the host, for a failure message ('' when none)."""
    result = await remote.run(service.log_tail_script(), check=False, timeout_s=20)
    lines = [line.strip() for line in str(result.stdout or "").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


async def _confirm(
    run: HostRun, options: BootstrapOptions, wiring: HostWiring, node_id: str
) -> dict[str, Any]:
    """Wait until the node is alive in the mesh: as an agent of the existing mesh sees it, or
    (a new fleet, or none of those answers) as the node itself does; every host of the run is
    then checked to see every other (:func:`agent.bootstrap.wiring.confirm_one_mesh`)."""
    via = (*wiring.existing, wiring.address)
    run.step(f"waiting for the node in the mesh (via {', '.join(via[:2])})")
    node, where = await mesh.wait_alive_via(
        options.cluster.operator, via, node_id, options.join_timeout_s
    )
    if node is not None:
        if wiring.existing and where == wiring.address:
            run.notes.append(
                "no agent of the existing mesh answered (--join, fleet.toml): its join was "
                "confirmed through the node itself"
            )
        return node
    why = f"the agent did not join the mesh within {options.join_timeout_s:.0f} s ({where})"
    if run.remote is not None and run.kind is not None and run.layout is not None and run.facts:
        service = Service(service_kind(run.kind) or "process", run.layout, run.facts)
        running = await service.is_running(run.remote)
        last = await _log_tail(run.remote, service)
        why += "; its service is " + ("running" if running else "not running")
        why += f"; its log ends: {last}" if last else f"; see {run.layout.log} on the host"
    raise BootstrapError(why)


async def _node_in_mesh(options: BootstrapOptions, wiring: HostWiring, node_id: str) -> bool:
    async with await _mesh_client(options, wiring.mesh) as client:
        node = await mesh.find_node(client, node_id)
    return node is not None and node.get("state") == "alive"


async def connect_host(
    spec: HostSpec, options: BootstrapOptions, reporter: Reporter
) -> HostRun | HostResult:
    """The host reached over SSH (its key checked or, with ``--accept-new``, trusted on first
    sight and recorded), or the one-line result of why not."""
    run = HostRun(spec=spec, reporter=reporter)
    run.step("connecting")
    try:
        run.remote = await connect(spec, options.ssh)
    except UnknownHostKey as exc:
        unknown = None if exc.changed else exc.fingerprint
        return dataclasses.replace(run.failed(str(exc)), new_host_key=unknown)
    except BootstrapError as exc:
        return run.failed(str(exc))
    if run.remote.new_host_key:
        run.notes.append(
            f"trusted its new host key {run.remote.new_host_key} (added to "
            f"{options.ssh.known_hosts})"
        )
    return run


async def bootstrap_host(
    run: HostRun,
    options: BootstrapOptions,
    wiring: HostWiring,
    upgrade_slots: asyncio.Semaphore,
) -> HostResult:
    """Converge a connected host (see the module's docstring); the connection is closed after."""
    try:
        return await _bootstrap(run, options, wiring, upgrade_slots)
    except (BootstrapError, NoPython, IdentityError, ApiError) as exc:
        await run.rollback()
        return run.failed(str(exc))
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(run.rollback())
        raise
    finally:
        run.close()


async def _bootstrap(
    run: HostRun,
    options: BootstrapOptions,
    wiring: HostWiring,
    upgrade_slots: asyncio.Semaphore,
) -> HostResult:
    remote = run.remote
    assert remote is not None, "connect_host first"
    facts = await _probe(remote, run, options)
    source = options.source
    python = require_python(
        facts,
        run.spec.name,
        wanted=run.spec.python or options.python,
        prefer=local_platform().python if source.local_build is not None else None,
    )
    run.python = f"{python.version_text} ({python.path})"
    layout = RemoteLayout.for_host(
        run.spec.remote_dir or options.remote_dir, facts.home, facts.is_root
    )
    run.layout = layout
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
        target = HostPlatform(facts.os, facts.arch, (python.version[0], python.version[1]))
        if source.local_build is not None:
            run.step(f"preparing wheels for {target}")
        wheels = await source.wheels_for(target)
        new_venv = await install.create_venv(remote, layout, python.path, name, source)
        run.step(f"installing shoal {source.version} from {source.where}")
        await install.install_shoal(remote, layout, new_venv, source, wheels)
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
        advertised = advertised_host(run.spec, run.peer_ip)
        names = sorted({run.spec.host, *([advertised] if advertised else [])})
        signed = sign_node(options.cluster, report, names, options.cert_valid_for, now)
        for name, data in ((CA_CERT, signed.ca_crt_pem), (NODE_CERT, signed.node_crt_pem)):
            path = f"{layout.identity_dir}/{name}"
            await _replace_file(remote, run, path, data, f"restore {name}")
        changes.append("certificate")

    # -- config and service ------------------------------------------------------------------
    config = render_config(run.spec, layout, wiring.seeds, run.peer_ip)
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
                wiring,
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
        node = await _confirm(run, options, wiring, run.node_id)

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
    if kind == "process":
        run.warnings.append(
            "no systemd or launchd: the agent runs as a supervised process, which will not "
            "start again after a reboot (rerun shoal bootstrap then, or add it to the host's "
            "boot scripts)"
        )
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
        address=wiring.address,
        notes=tuple(run.notes),
        warnings=tuple(run.warnings),
    )


class _Unlimited:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_LIMIT = _Unlimited()


async def _switch_and_start(
    remote: Remote,
    run: HostRun,
    options: BootstrapOptions,
    wiring: HostWiring,
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
    if running_before and node_id and await _node_in_mesh(options, wiring, node_id):
        run.step("draining")
        async with await _mesh_client(options, wiring.mesh) as client:
            drained = await mesh.drain(
                client, node_id, options.drain_grace_s, options.drain_timeout_s
            )
        if not drained:
            raise BootstrapError(
                f"the node did not drain within {options.drain_timeout_s:.0f} s; nothing changed"
            )

        async def undo_drain() -> None:
            async with await _mesh_client(options, wiring.mesh) as c:
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
        node = await _confirm(run, options, wiring, node_id)
    if drained and node_id:
        run.step("undraining")
        async with await _mesh_client(options, wiring.mesh) as client:
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


async def _replace_file(remote: Remote, run: HostRun, path: str, data: bytes, what: str) -> None:
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


async def uninstall_host(run: HostRun, options: BootstrapOptions, wiring: HostWiring) -> HostResult:
    """Stop and remove Shoal on a connected host and revoke its node; the connection is closed
    after."""
    try:
        return await _uninstall(run, options, wiring)
    except (BootstrapError, IdentityError, ApiError) as exc:
        return run.failed(str(exc))
    finally:
        run.close()


async def _uninstall(run: HostRun, options: BootstrapOptions, wiring: HostWiring) -> HostResult:
    remote = run.remote
    assert remote is not None, "connect_host first"
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
    if node_id:
        with contextlib.suppress(ApiError, BootstrapError):
            if await _node_in_mesh(options, wiring, node_id):
                run.step("draining")
                async with await _mesh_client(options, wiring.mesh) as client:
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
        others = (*wiring.existing, *wiring.others)
        why: str | None = "no other agent of the mesh is known"
        if others:
            try:
                async with await _mesh_client(options, others) as client:
                    why = await publish(client, signed)
            except ApiError as exc:
                why = str(exc)
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
        address=wiring.address,
    )


async def _exists(remote: Remote, path: str) -> bool:
    return (await remote.run(f"test -e {_q(path)}", check=False)).exit_status == 0
