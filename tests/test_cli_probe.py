"""``shoal probe`` as an operator runs it: a real process, real output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import SYSFS

DEVICE_KEYS = {
    "index",
    "vendor",
    "backend",
    "name",
    "uuid",
    "pci_bus_id",
    "arch",
    "unified_memory",
    "mem_total_bytes",
    "mem_used_bytes",
    "util_pct",
    "temp_c",
    "power_mw",
    "power_limit_mw",
    "links",
}
HOST_KEYS = {"hostname", "os", "arch", "cpu_count", "mem_total_bytes"}


def shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_probe_json_on_a_captured_tree_has_exactly_the_documented_shape() -> None:
    done = shoal("probe", "--json", "--root", str(SYSFS / "amd-rx6900xt"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"host", "devices"}
    assert set(report["host"]) == HOST_KEYS
    [device] = report["devices"]
    assert set(device) == DEVICE_KEYS
    assert device["vendor"] == "amd" and device["backend"] == "rocm"
    assert device["index"] == 0


def test_probe_sim_demo_shows_several_vendors() -> None:
    done = shoal("probe", "--json", "--sim", "demo")
    assert done.returncode == 0, done.stderr
    devices = json.loads(done.stdout)["devices"]
    assert len({d["backend"] for d in devices}) >= 3
    for device in devices:
        assert set(device) == DEVICE_KEYS
        for link in device["links"]:
            assert set(link) == {"peer", "kind", "bandwidth_mbps"}


def test_probe_table_fits_eighty_columns() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "probe", "--sim", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "TERM": "dumb"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) > 3
    assert max(len(line) for line in lines) <= 80


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("prob",), "invalid choice"),
        (("probe", "--root", "/no/such/folder"), "no such folder"),
        (("probe", "--sim", "no-such-gpu:3"), "no-such-gpu"),
        (("probe", "--interval", "soon"), "invalid float value"),
        (("probe", "--interval", "0"), "positive"),
    ],
)
def test_operator_mistakes_get_one_line_and_status_2(args: tuple[str, ...], needle: str) -> None:
    done = shoal(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert needle in done.stderr


def test_probe_live_host_never_crashes(tmp_path: Path) -> None:
    """On this machine whatever is (or is not) installed, probing the live host succeeds."""
    done = shoal("probe", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["devices"], "at least the CPU fallback is reported"
