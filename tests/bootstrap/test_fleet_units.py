"""Bootstrap's fleet-wide parts without hosts: the seeds each host joins through, the wheels it
ships from a checkout, the summary as one line per host, a trusted key's known_hosts line."""

from __future__ import annotations

import importlib.metadata
import zipfile
from pathlib import Path

import asyncssh
import pytest

from agent.bootstrap.display import note_lines, summary_table, warning_lines
from agent.bootstrap.hostrun import HostResult
from agent.bootstrap.hosts import HostSpec
from agent.bootstrap.mesh import describe_devices
from agent.bootstrap.shipping import (
    HostPlatform,
    _split_requirement,
    installed_closure,
    repack,
    source_digest,
)
from agent.bootstrap.ssh import known_hosts_line
from agent.bootstrap.wiring import Reached, plan_wiring
from agent.operator.terminal import console

A, B, C, D = (f"10.0.0.{i}:7946" for i in range(1, 5))


def test_a_new_fleet_joins_through_its_other_hosts_never_itself_alone() -> None:
    hosts = [Reached("root@a", A), Reached("root@b", B), Reached("root@c", C)]
    wiring = plan_wiring(hosts, [])
    assert wiring["root@a"].seeds == (B, C)
    assert wiring["root@b"].seeds == (C, A)
    assert wiring["root@c"].seeds == (A, B)
    assert all(w.existing == () for w in wiring.values())
    assert wiring["root@a"].mesh == (B, C, A)  # commands go through the others first
    # One host alone: no seed (not itself).
    assert plan_wiring([Reached("root@a", A)], []).get("root@a").seeds == ()  # type: ignore[union-attr]


def test_hosts_added_to_a_fleet_join_it_first_and_a_rerun_plans_the_same() -> None:
    first = plan_wiring([Reached("root@d", D)], [A, B, C])
    assert first["root@d"].seeds == (A, B)
    assert first["root@d"].existing == (A, B, C)
    # New hosts always list one another too, in case the fleet file names agents that are gone.
    two = plan_wiring([Reached("root@d", D), Reached("root@c", C)], [A, B])
    assert two["root@d"].seeds == (A, B, C) and two["root@c"].seeds == (A, B, D)
    # The fleet file now names the hosts of this very run: the same seeds as the first time.
    hosts = [Reached("root@a", A), Reached("root@b", B), Reached("root@c", C)]
    assert plan_wiring(hosts, [A, B, C]) == plan_wiring(hosts, [])
    many = [Reached(f"h{i}", f"10.0.1.{i}:7946") for i in range(10)]
    assert all(len(w.seeds) == 2 for w in plan_wiring(many, []).values())


def test_requirements_are_read_with_their_extras_and_markers() -> None:
    assert _split_requirement("markdown-it-py[linkify] (>=2.1.0)") == (
        "markdown-it-py",
        {"linkify"},
        "",
    )
    name, extras, marker = _split_requirement('aiodns>=3; extra == "speedups"')
    assert (name, extras) == ("aiodns", set()) and "speedups" in marker


def test_the_closure_is_what_shoal_needs_as_installed_here() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in installed_closure()}
    assert {"aiohttp", "cryptography", "textual", "asyncssh", "psutil"} <= names
    assert "linkify-it-py" in names  # textual asks for markdown-it-py[linkify]
    assert "pytest" not in names and "shoal" not in names  # an extra, and Shoal itself


def test_an_installed_distribution_is_repacked_into_the_wheel_it_came_from(
    tmp_path: Path,
) -> None:
    dist = importlib.metadata.distribution("tomli_w")
    wheel = repack(dist, tmp_path)
    assert wheel.name == f"tomli_w-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    assert "tomli_w/__init__.py" in names
    assert not any(
        "__pycache__" in n or n.endswith(("INSTALLER", "direct_url.json")) for n in names
    )
    assert "tomli_w/__init__.py,sha256=" in record


def test_the_checkout_digest_follows_its_sources(tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "agent").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["agent*"]\n')
    (root / "agent" / "__init__.py").write_text("")
    first = source_digest(root)
    (root / "agent" / "__pycache__").mkdir()
    (root / "agent" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert source_digest(root) == first  # bytecode is not source
    (root / "agent" / "x.py").write_text("x = 1\n")
    assert source_digest(root) != first


def test_platforms_name_their_wheels() -> None:
    linux = HostPlatform("Linux", "aarch64", (3, 12))
    assert linux.key == "linux-aarch64-cp312"
    assert linux.pip_platforms() == ["manylinux2014_aarch64", "manylinux_2_28_aarch64"]
    assert str(linux) == "Linux aarch64, Python 3.12"


def test_the_summary_is_one_line_per_host_at_80_columns() -> None:
    results = [
        HostResult(
            "root@gpu-with-a-long-name.example.org",
            True,
            "installed",
            "shoal 0.1.0, node key, certificate, config, process unit",
            node_id="bbcoyqcykzzz52yipbn7kkc37h52sjr5",
            os="Linux",
            arch="x86_64",
            python="3.11.2 (/usr/bin/python3.11)",
            gpus="2x NVIDIA H100 80GB HBM3",
            service="process",
            notes=("trusted its new host key ssh-ed25519 SHA256:abc (added to kh)",),
            warnings=("no systemd or launchd: ...",),
        ),
        HostResult("root@b", False, "failed", "host root@b: Python 3.11+ not found " * 3),
    ]
    out = console()
    out.width = 80
    with out.capture() as captured:
        out.print(summary_table(results, 80))
    lines = captured.get().splitlines()
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines), lines
    assert note_lines(results) == [
        "host root@gpu-with-a-long-name.example.org: trusted its new host key ssh-ed25519 "
        "SHA256:abc (added to kh)"
    ]
    assert warning_lines(results)[0].startswith("host root@gpu-with-a-long-name.example.org: warn")


def test_a_cpu_is_not_reported_as_a_gpu() -> None:
    cpu = {"backend": "cpu", "name": "AMD EPYC 7B13"}
    assert describe_devices({"devices": [cpu]}) == "CPU only"
    assert describe_devices({"devices": [cpu, {"backend": "cuda", "name": "L4"}]}) == "1x L4"
    assert describe_devices({"devices": []}) == "no GPUs"


def test_a_trusted_key_is_recorded_as_ssh_would() -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    public = key.export_public_key("openssh").decode().split()
    assert known_hosts_line(HostSpec("10.0.0.1"), key) == f"10.0.0.1 {public[0]} {public[1]}\n"
    assert known_hosts_line(HostSpec("h", port=2222), key).startswith("[h]:2222 ssh-ed25519 ")


async def test_a_host_that_does_not_see_the_whole_mesh_fails_the_run_naming_whom(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent.bootstrap import wiring

    views = {A: {"n1", "n2", "n3", "old"}, B: {"n1", "n2", "old"}, C: "refused"}

    async def seen_by(identity: object, address: str) -> set[str] | str:
        return views[address]

    async def existing_agents(identity: object, existing: object) -> dict[str, str]:
        return {"old": "h100-00"}

    monkeypatch.setattr(wiring, "_seen_by", seen_by)
    monkeypatch.setattr(wiring, "_existing_agents", existing_agents)
    results = [
        HostResult("root@a", True, "installed", "ok", node_id="n1", address=A),
        HostResult("root@b", True, "installed", "ok", node_id="n2", address=B),
        HostResult("root@c", True, "installed", "ok", node_id="n3", address=C),
        HostResult("root@d", False, "failed", "no python"),
    ]
    checked = await wiring.confirm_one_mesh(None, results, [D], 0.0)  # type: ignore[arg-type]
    assert [r.ok for r in checked] == [True, False, False, False]
    assert checked[1].action == "split"
    assert checked[1].message == (
        "not one mesh after 0 s: it does not see root@c (node n3) as alive (asked "
        f"{B}) (the agent is left running: rerun once fixed, or --uninstall)"
    )
    assert "its API does not answer (refused)" in checked[2].message
    assert checked[3].message == "no python"
