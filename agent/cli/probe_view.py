"""``shoal probe``: this host's devices as a rich table, JSON, or a live view."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich import box
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agent.common.errors import UserError
from agent.operator import terminal
from agent.operator.units import fmt_mem, fmt_pct, fmt_power, fmt_temp
from probers.host import HostProbe, ProbeOptions
from probers.records import Device, ProbeReport

SIM_SUFFIX = " (simulated)"


def _links(device: Device) -> str:
    kinds: dict[str, int] = {}
    for link in device.static.links:
        kinds[link.kind] = kinds.get(link.kind, 0) + 1
    return " ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "-"


def _name(device: Device) -> Text:
    text = Text(device.static.name.removesuffix(SIM_SUFFIX))
    if not device.sample.healthy:
        text.append(f" ({device.sample.error or 'unhealthy'})", style="bold red")
    elif device.static.unified_memory:
        text.append(" unified", style="dim")
    return text


def _gib(used_bytes: int | None, total_bytes: int | None) -> str:
    return fmt_mem(used_bytes, total_bytes).removesuffix(" GiB")


def _watts(power_mw: int | None, limit_mw: int | None) -> str:
    return fmt_power(power_mw, limit_mw).removesuffix(" W")


def report_table(report: ProbeReport) -> Table:
    host = report.host
    simulated = bool(report.devices) and all(d.static.source == "sim" for d in report.devices)
    title = f"{host.hostname} · {host.os}/{host.arch} · {host.cpu_count or '?'} CPUs"
    if simulated:
        title += " · simulated devices"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("API")
    table.add_column("Device", overflow="fold", ratio=1)
    table.add_column("Mem GiB", justify="right", no_wrap=True)
    table.add_column("Util", justify="right", no_wrap=True)
    table.add_column("Temp", justify="right", no_wrap=True)
    table.add_column("Power W", justify="right", no_wrap=True)
    table.add_column("Links", no_wrap=True)
    for device in report.devices:
        s, d = device.static, device.sample
        table.add_row(
            str(device.index),
            s.backend,
            _name(device),
            _gib(d.mem_used_bytes, s.mem_total_bytes),
            fmt_pct(d.util_pct),
            fmt_temp(d.temp_c),
            _watts(d.power_mw, d.power_limit_mw),
            _links(device),
        )
    return table


def _view(report: ProbeReport) -> Group:
    notes = [Text(f"warning: {w}", style="yellow") for w in report.warnings]
    return Group(report_table(report), *notes)


def run_probe(
    *, root: Path | None, sim: str | None, as_json: bool, watch: bool, interval_s: float
) -> int:
    if root is not None and not root.is_dir():
        raise UserError(f"--root {root}: no such folder")
    if interval_s <= 0:
        raise UserError("--interval must be a positive number of seconds")
    try:
        probe = HostProbe.from_options(ProbeOptions(root=root, sim=sim))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    console = terminal.console()
    try:
        probe.open()
        time.sleep(probe.settle_s)
        if not watch:
            report = probe.refresh()
            if as_json:
                print(json.dumps(report.to_json(), indent=2))
            else:
                console.print(_view(report))
            return 0
        with Live(_view(probe.refresh()), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval_s)
                report = probe.refresh()
                if as_json:
                    live.console.print_json(json.dumps(report.to_json()))
                else:
                    live.update(_view(report), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        probe.close()
