"""``shoal tui``: the command-line entry to the operator TUI.

``shoal tui`` (its arguments are defined in :mod:`agent.cli`, so the CLI never imports this
package until the command runs) calls ``run_tui(args)``. ``open_tui(address,
identity_dir)`` is the same for a caller that already knows the agent (``shoal demo``).
Settings come from ``<config home>/tui.toml`` (``~/.config/shoal/tui.toml``)::

    [tui]
    theme = "shoal-colorblind"
    ascii = false
    refresh_s = 2.0

    [keymap]
    "host.drain" = "D"
    "job.cancel" = "ctrl+x"

    [bootstrap]     # extra ``shoal bootstrap`` flags for every host added with ``a``
    args = ["--known-hosts", "/etc/shoal/known_hosts", "--index-url", "https://pypi.lab/simple"]

Adding hosts from the TUI signs their certificates with the cluster CA, so it works when
``--identity`` (default: the folder of ``shoal init``) holds the CA.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.common.errors import UserError
from agent.common.paths import config_home, default_cluster_dir

AGENT_ENV = "SHOAL_AGENT"


@dataclass(frozen=True, slots=True)
class TuiConfig:
    theme: str = "shoal"
    ascii: bool = False
    refresh_s: float = 2.0
    keymap: Mapping[str, str] = field(default_factory=dict)
    bootstrap_args: tuple[str, ...] = ()


def config_path() -> Path:
    return config_home() / "tui.toml"


def load_config(path: Path | None = None) -> TuiConfig:
    """The TUI settings; defaults when the file does not exist; ``UserError`` when it is wrong."""
    path = path or config_path()
    if not path.exists():
        return TuiConfig()
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    tui = data.get("tui", {})
    keymap = data.get("keymap", {})
    bootstrap = data.get("bootstrap", {})
    if not isinstance(tui, dict) or not isinstance(keymap, dict) or not isinstance(bootstrap, dict):
        raise UserError(f"{path}: [tui], [keymap] and [bootstrap] must be tables")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in keymap.items()):
        raise UserError(f'{path}: [keymap] maps binding ids to keys, e.g. "host.drain" = "D"')
    theme = tui.get("theme", "shoal")
    ascii_ = tui.get("ascii", False)
    refresh = tui.get("refresh_s", 2.0)
    if not isinstance(theme, str) or not isinstance(ascii_, bool):
        raise UserError(f"{path}: [tui] theme is a string and ascii is true or false")
    if not isinstance(refresh, int | float) or isinstance(refresh, bool) or refresh <= 0:
        raise UserError(f"{path}: [tui] refresh_s must be a positive number of seconds")
    return TuiConfig(
        theme=theme,
        ascii=ascii_,
        refresh_s=float(refresh),
        keymap=dict(keymap),
        bootstrap_args=_bootstrap_args(bootstrap, path),
    )


def _bootstrap_args(table: dict[str, Any], path: Path) -> tuple[str, ...]:
    unknown = sorted(set(table) - {"args"})
    if unknown:
        raise UserError(f"{path}: [bootstrap] has only args, not {unknown[0]!r}")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UserError(f'{path}: [bootstrap] args is a list of strings, e.g. ["--jobs", "4"]')
    if args:
        from tui.screens.addhost import check_extra_args

        try:
            check_extra_args(args)
        except UserError as exc:
            raise UserError(f"{path}: [bootstrap] args: {exc}") from None
    return tuple(args)


def _identity(directory: Path | None) -> Any:
    from gossip.identity import IdentityError, load_identity

    directory = directory or default_cluster_dir()
    if not (directory / "node.key").exists():
        raise UserError(
            f"no operator identity in {directory}: run 'shoal init' first or pass --identity DIR"
        )
    try:
        return load_identity(directory)
    except IdentityError as exc:
        raise UserError(f"cannot load your identity from {directory}: {exc}") from None


def _fleet_agent(identity_dir: Path | None) -> str:
    """The first agent of the fleet (``fleet.toml`` of the cluster folder) that answers."""
    import asyncio

    from agent.operator.client import ApiError
    from agent.operator.failover import first_answering
    from agent.operator.fleet import fleet_path, load_fleet

    directory = identity_dir or default_cluster_dir()
    fleet = load_fleet(directory)
    if not fleet.agents:
        raise UserError(
            f"no agent to join: pass --join HOST:PORT, set ${AGENT_ENV}, --sim N, or set up "
            f"hosts with 'shoal bootstrap' (it remembers them in {fleet_path(directory)})"
        )
    identity = _identity(directory)

    async def pick() -> str:
        async with await first_answering(identity, fleet.addresses) as client:
            return client.address

    try:
        return asyncio.run(pick())
    except ApiError as exc:
        raise UserError(str(exc)) from None


def api_source(address: str, identity_dir: Path | None) -> Any:
    """An :class:`tui.source.ApiSource` for the agent at ``address`` as the operator identity."""
    from agent.operator.client import ApiClient
    from gossip.identity import common_name
    from tui.source import ApiSource

    identity = _identity(identity_dir)
    try:
        client = ApiClient(identity, address)
    except ValueError as exc:
        raise UserError(f"--join: {exc}") from None
    mesh_name = common_name(identity.ca_certificate) or "shoal"
    return ApiSource(client, mesh_name, role=str(identity.role))


def _run(
    source: Any,
    config: TuiConfig,
    *,
    readonly: bool,
    theme: str | None,
    ascii_: bool,
    identity_dir: Path | None,
) -> int:
    from tui.app import ShoalApp

    app = ShoalApp(
        source,
        readonly=readonly,
        refresh_s=config.refresh_s,
        ascii=ascii_ or config.ascii,
        theme=theme or config.theme,
        keymap=config.keymap,
        identity_dir=identity_dir,
        bootstrap_args=config.bootstrap_args,
    )
    app.run()
    return 0


def open_tui(
    address: str, identity_dir: Path, *, readonly: bool = False, config: TuiConfig | None = None
) -> int:
    """Run the TUI on the mesh reachable at ``address`` (``shoal demo`` ends here)."""
    config = config or load_config()
    source = api_source(address, identity_dir)
    return _run(
        source, config, readonly=readonly, theme=None, ascii_=False, identity_dir=identity_dir
    )


def run_tui(args: argparse.Namespace) -> int:
    config = load_config()
    identity_dir: Path | None = None
    if args.sim is not None:
        from tui.simmesh import SimSource

        if args.sim < 1:
            raise UserError("--sim needs at least one host")
        source: Any = SimSource(args.sim, live=True, latency_s=0.3)
    else:
        address = args.agent or _fleet_agent(args.identity)
        source = api_source(address, args.identity)
        identity_dir = args.identity or default_cluster_dir()
    return _run(
        source,
        config,
        readonly=args.readonly,
        theme=args.theme,
        ascii_=args.ascii,
        identity_dir=identity_dir,
    )
