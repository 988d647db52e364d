"""Bootstrap's pure parts: targets, hosts file, probe output, unit and plist text, config."""

from __future__ import annotations

import plistlib
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.bootstrap.agentconfig import agent_address, render_config
from agent.bootstrap.certify import KeyReport, needs_certificate
from agent.bootstrap.display import failure_lines
from agent.bootstrap.hostrun import HostResult
from agent.bootstrap.hosts import HostSpec, parse_hosts_file, parse_target
from agent.bootstrap.layout import RemoteLayout
from agent.bootstrap.probe import NoPython, parse_probe, require_python
from agent.bootstrap.service import Service, choose_kind, launchd_plist, systemd_unit
from agent.bootstrap.ssh import keyscan_command
from agent.common.errors import UserError
from gossip.identity import certificate_fingerprint, init_cluster

PROBE_OUTPUT = """\
os=Linux
arch=x86_64
uid=1000
user=ana
home=/home/ana
systemd=1
loginctl=1
python=3.9.18 /usr/bin/python3
python=3.12.4 /usr/local/bin/python3.12
gpu=nvidia-smi /usr/bin/nvidia-smi
gpu=libnvidia-ml /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
gpu=amdgpu /sys/class/drm/card1
gpu=amdgpu /sys/class/drm/card2
not a key value line
"""


def test_parse_target_forms() -> None:
    assert parse_target("root@gpu-01:2222") == HostSpec(host="gpu-01", user="root", port=2222)
    assert parse_target("gpu-01") == HostSpec(host="gpu-01")
    assert parse_target("ana@[fe80::1]:22") == HostSpec(host="fe80::1", user="ana", port=22)
    assert parse_target("fe80::1").host == "fe80::1"
    assert parse_target("root@gpu-01:2222").name == "root@gpu-01:2222"
    assert parse_target("gpu-01:22").name == "gpu-01"
    with pytest.raises(UserError, match="port must be"):
        parse_target("gpu-01:99999")
    with pytest.raises(UserError, match="empty user"):
        parse_target("@gpu-01")


def test_hosts_file_reads_every_key_and_refuses_typos() -> None:
    specs = parse_hosts_file(
        """
[[host]]
address = "root@10.0.0.5:2200"
labels = { team = "vision" }
zone = "rack-a"
listen = "0.0.0.0:7000"
sim = "h100:2"
sim_seed = 4
python = "/usr/bin/python3.12"
remote_dir = "/srv/shoal"

[[host]]
address = "gpu-02"
"""
    )
    assert specs[0] == HostSpec(
        host="10.0.0.5",
        user="root",
        port=2200,
        labels={"team": "vision"},
        zone="rack-a",
        listen="0.0.0.0:7000",
        sim="h100:2",
        sim_seed=4,
        python="/usr/bin/python3.12",
        remote_dir="/srv/shoal",
    )
    assert specs[1] == HostSpec(host="gpu-02")
    with pytest.raises(UserError, match="unknown key 'adress'"):
        parse_hosts_file('[[host]]\nadress = "x"\n')
    with pytest.raises(UserError, match="address"):
        parse_hosts_file("[[host]]\nzone = 'a'\n")
    with pytest.raises(UserError, match="sim_seed must be an integer"):
        parse_hosts_file('[[host]]\naddress = "a"\nsim_seed = "1"\n')


def test_probe_output_parsed() -> None:
    facts = parse_probe(PROBE_OUTPUT)
    assert (facts.os, facts.arch, facts.uid, facts.user, facts.home) == (
        "Linux",
        "x86_64",
        1000,
        "ana",
        "/home/ana",
    )
    assert facts.systemd and facts.loginctl and not facts.launchd and not facts.is_root
    assert [p.version for p in facts.pythons] == [(3, 9, 18), (3, 12, 4)]
    assert require_python(facts, "ana@gpu").path == "/usr/local/bin/python3.12"
    assert facts.gpu_summary() == "nvidia-smi, libnvidia-ml, amdgpu x2"
    assert choose_kind(facts) == "systemd-user"


def test_no_python_message_names_the_best_interpreter_found() -> None:
    facts = parse_probe("os=Linux\npython=3.9.18 /usr/bin/python3\npython=3.8.10 /usr/bin/python\n")
    with pytest.raises(NoPython) as info:
        require_python(facts, "root@old")
    assert str(info.value) == (
        "host root@old: Python 3.11+ not found (found 3.9.18 at /usr/bin/python3); install "
        "Python 3.11 or newer (e.g. apt-get install python3.11 python3.11-venv, dnf install "
        "python3.11, brew install python@3.12) and pass --python PATH unless it is on PATH"
    )
    with pytest.raises(NoPython, match=r"none of python3\.14, .*, python3 or python on PATH\); "):
        require_python(parse_probe("os=Linux\n"), "h")


def test_an_interpreter_asked_for_that_is_not_there_is_named() -> None:
    with pytest.raises(NoPython) as info:
        require_python(parse_probe("os=Linux\n"), "h", wanted="/usr/bin/python3.99")
    assert str(info.value) == (
        "host h: the interpreter /usr/bin/python3.99 does not exist there or does not run; "
        "pass --python with the path of Python 3.11 or newer on that host"
    )


def test_the_operators_python_is_preferred_when_its_wheels_ship() -> None:
    facts = parse_probe(
        "os=Linux\npython=3.13.1 /usr/bin/python3.13\npython=3.11.2 /usr/bin/python3.11\n"
    )
    assert require_python(facts, "h").path == "/usr/bin/python3.13"
    assert require_python(facts, "h", prefer=(3, 11)).path == "/usr/bin/python3.11"
    assert require_python(facts, "h", prefer=(3, 12)).path == "/usr/bin/python3.13"


def test_service_kind_choice() -> None:
    root_systemd = parse_probe("os=Linux\nuid=0\nsystemd=1\n")
    assert choose_kind(root_systemd) == "systemd-system"
    assert choose_kind(parse_probe("os=Linux\nuid=1000\nsystemd=1\n")) == "process"
    assert choose_kind(parse_probe("os=Linux\nuid=0\n")) == "process"
    assert choose_kind(parse_probe("os=Darwin\nuid=501\nlaunchd=1\n")) == "launchd"
    assert choose_kind(root_systemd, "process") == "process"
    with pytest.raises(ValueError, match="unknown service kind"):
        choose_kind(root_systemd, "upstart")


def test_layout_defaults() -> None:
    assert RemoteLayout.for_host(None, "/home/ana", False).base == "/home/ana/.local/share/shoal"
    assert RemoteLayout.for_host(None, "/root", True).base == "/opt/shoal"
    assert RemoteLayout.for_host("~/x", "/home/ana", False).venv == "/home/ana/x/venv"
    assert RemoteLayout.for_host("rel", "/home/ana", False).config == "/home/ana/rel/agent.toml"


def test_systemd_unit_text() -> None:
    layout = RemoteLayout("/opt/shoal")
    unit = systemd_unit(layout, user_unit=False)
    assert (
        "ExecStart=/opt/shoal/venv/bin/python -m agent.cli agent --config /opt/shoal/agent.toml\n"
        in unit
    )
    assert "Restart=on-failure\n" in unit
    assert "KillMode=mixed\n" in unit
    assert "Delegate=yes\n" in unit  # the agent's cgroup per job
    assert unit.endswith("[Install]\nWantedBy=multi-user.target\n")
    assert systemd_unit(layout, user_unit=True).endswith("WantedBy=default.target\n")
    facts = parse_probe("os=Linux\nuid=1000\nuser=ana\nhome=/home/ana\nsystemd=1\nloginctl=1\n")
    user = Service("systemd-user", RemoteLayout("/home/ana/s"), facts)
    assert user.unit_path == "/home/ana/.config/systemd/user/shoal-agent.service"
    assert user.start_script().startswith("loginctl enable-linger ana && ")
    assert "systemctl --user restart shoal-agent.service" in user.start_script()


def test_launchd_plist() -> None:
    doc = plistlib.loads(launchd_plist(RemoteLayout("/Users/ana/.local/share/shoal")))
    assert doc["Label"] == "org.shoal.agent"
    assert doc["ProgramArguments"] == [
        "/Users/ana/.local/share/shoal/venv/bin/python",
        "-m",
        "agent.cli",
        "agent",
        "--config",
        "/Users/ana/.local/share/shoal/agent.toml",
    ]
    assert doc["RunAtLoad"] is True
    assert doc["KeepAlive"] == {"SuccessfulExit": False}
    assert doc["StandardErrorPath"] == "/Users/ana/.local/share/shoal/agent.log"
    facts = parse_probe("os=Darwin\nuid=501\nhome=/Users/ana\nlaunchd=1\n")
    svc = Service("launchd", RemoteLayout("/Users/ana/s"), facts)
    assert svc.unit_path == "/Users/ana/Library/LaunchAgents/org.shoal.agent.plist"


def test_agent_config_toml() -> None:
    spec = HostSpec(host="gpu-01", user="root", labels={"b": "2", "a": "1"}, zone="z1", sim_seed=7)
    layout = RemoteLayout("/opt/shoal")
    doc = tomllib.loads(render_config(spec, layout, ["10.0.0.1:7946"], "10.0.0.21").decode())
    assert doc == {
        "agent": {
            "listen": "0.0.0.0:7946",
            "advertise": "10.0.0.21",  # the address SSH reached, not the name typed
            "data_dir": "/opt/shoal/data",
            "identity_dir": "/opt/shoal/identity",
            "join": ["10.0.0.1:7946"],
            "zone": "z1",
            "sim_seed": 7,
            "labels": {"a": "1", "b": "2"},
        }
    }
    assert agent_address(spec, "10.0.0.21") == "10.0.0.21:7946"
    assert agent_address(spec) == "gpu-01:7946"
    told = HostSpec(host="gpu-01", advertise="gpu-01.lab")
    assert agent_address(told, "10.0.0.21") == "gpu-01.lab:7946"  # the hosts file wins
    pinned = HostSpec(host="gpu-01", listen="127.0.0.1:9000")
    assert (
        "advertise"
        not in tomllib.loads(render_config(pinned, RemoteLayout("/x"), []).decode())["agent"]
    )
    assert agent_address(pinned) == "127.0.0.1:9000"


def test_keyscan_command() -> None:
    kh = Path("/home/ana/.ssh/known_hosts")
    assert keyscan_command("gpu-01", 22, "ssh-ed25519", kh) == (
        "ssh-keyscan -t ed25519 gpu-01 >> /home/ana/.ssh/known_hosts"
    )
    assert keyscan_command("10.0.0.5", 2222, "ecdsa-sha2-nistp256", kh) == (
        "ssh-keyscan -p 2222 -t ecdsa 10.0.0.5 >> /home/ana/.ssh/known_hosts"
    )


def test_certificate_kept_only_when_current_and_ours(tmp_path: Path) -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    cluster = init_cluster(tmp_path / "c", "lab", "op", now)
    ours = certificate_fingerprint(cluster.ca.certificate)
    good = KeyReport(b"\x01" * 32, "id", False, True, ours, (now + timedelta(days=90)).timestamp())
    assert not needs_certificate(good, cluster, now)
    assert needs_certificate(
        KeyReport(b"\x01" * 32, "id", False, True, ours, (now + timedelta(days=10)).timestamp()),
        cluster,
        now,
    )
    assert needs_certificate(
        KeyReport(b"\x01" * 32, "id", False, True, "00" * 32, good.cert_not_after_s),
        cluster,
        now,
    )
    assert needs_certificate(KeyReport(b"\x01" * 32, "id", True, False, None, None), cluster, now)


def test_failure_lines_are_one_line_per_host() -> None:
    results = [
        HostResult("a@h1", False, "failed", "cannot connect over SSH: refused"),
        HostResult("a@h2", False, "failed", "host a@h2: Python 3.11+ not found (no python3)"),
        HostResult("a@h3", True, "installed", "shoal 0.1.0"),
    ]
    assert failure_lines(results) == [
        "host a@h1: cannot connect over SSH: refused",
        "host a@h2: Python 3.11+ not found (no python3)",
    ]


def test_bootstrap_help_documents_every_key_of_the_hosts_file() -> None:
    from agent.bootstrap.hosts import _KEYS
    from tests.shoal_cli import shoal

    done = shoal("bootstrap", "--help")
    assert done.returncode == 0
    assert "[[host]]" in done.stdout and "--accept-new" in done.stdout
    for key in _KEYS:
        assert f"\n  {key} = " in done.stdout, key


async def test_an_index_that_cannot_be_reached_points_to_a_wheelhouse() -> None:
    from agent.bootstrap.install import InstallSource, install_shoal
    from agent.bootstrap.ssh import BootstrapError, RemoteCommandFailed

    class Remote:
        async def run(self, script: str, **kwargs: object) -> object:
            raise RemoteCommandFailed("ERROR: No matching distribution found for shoal==0.1.0")

    with pytest.raises(BootstrapError) as info:
        await install_shoal(Remote(), RemoteLayout("/x"), "/x/venvs/v", InstallSource("0.1.0"))  # type: ignore[arg-type]
    assert str(info.value) == (
        "pip could not install shoal==0.1.0 from the package index (ERROR: No matching "
        "distribution found for shoal==0.1.0); for hosts that cannot reach it, build a "
        "wheelhouse (shoal bootstrap --build-wheelhouse DIR) and pass --wheelhouse DIR"
    )
