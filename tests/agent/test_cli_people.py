"""``shoal user`` and ``shoal team`` end to end, every step the real command: a person makes
their key and a request, an admin adds them (certificate and team policy), they install it and
act as themself on a real mesh, within their team's ceiling; the admin changes their role with
no new certificate, and revokes them."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from agent.wire.policy import POLICY_FILE
from tests.agent.agents import Mesh
from tests.shoal_cli import one_line_error, shoal

pytestmark = pytest.mark.slow


def _ok(*args: str) -> str:
    done = shoal(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_init_makes_the_first_admin(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    out = _ok("init", "--dir", str(cluster), "--operator", "Root.Host")
    assert "admin      root.host" in out
    assert stat.S_IMODE((cluster / POLICY_FILE).stat().st_mode) == 0o600


def test_a_person_joins_acts_as_themself_changes_role_and_is_revoked(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"])
    mesh.start_all()
    try:
        addr = mesh.agents[0].address
        admin = ("--identity", str(mesh.cluster_dir), "--agent", addr)
        me = tmp_path / "alice"
        request = json.loads(_ok("user", "request", "--dir", str(me), "--name", "alice", "--json"))
        assert stat.S_IMODE((me / "node.key").stat().st_mode) == 0o600
        added = json.loads(
            _ok(
                "user", "add", "alice", "--team", "vision", "--role", "user",
                "--request", str(me / "node.csr"), "--out", str(me / "alice.crt"), "--json",
                *admin,
            )
        )  # fmt: skip
        assert added["id"] == request["node_id"] and added["policy_version"] == 1
        _ok("user", "install", "--dir", str(me), str(me / "alice.crt"))
        _ok("team", "set", "vision", "--ceiling", "3", "--quota", "any=1:2", *admin)
        listed = json.loads(_ok("user", "ls", "--json", *admin))
        assert listed["version"] == 2
        assert {(u["name"], u["role"]) for u in listed["users"]} == {
            ("operator", "admin"),
            ("alice", "user"),
        }
        vision = next(t for t in listed["teams"] if t["name"] == "vision")
        assert vision == {
            "name": "vision",
            "ceiling": 3,
            "quotas": [{"class": "any", "guaranteed": 1, "max": 2}],
        }
        mesh.wait(
            "policy 2 on agent 1", lambda: mesh.get(mesh.agents[1], "/v1/policy")["version"] == 2
        )
        as_alice = ("--identity", str(me), "--agent", mesh.agents[1].address)
        sleeper = ("--gpus", "0", "--", sys.executable, "-c", "import time; time.sleep(60)")
        line = one_line_error(shoal("submit", "--priority", "4", *as_alice, *sleeper))
        assert "ceiling of 3" in line
        job = json.loads(_ok("submit", "--priority", "3", "--json", *as_alice, *sleeper))
        job_id = job["job_id"]
        # A viewer now, by policy version 3: the same certificate, less authority.
        _ok("user", "set", "alice", "--role", "viewer", *admin)
        mesh.wait(
            "policy 3 on agent 1", lambda: mesh.get(mesh.agents[1], "/v1/policy")["version"] == 3
        )
        line = one_line_error(shoal("cancel", job_id, *as_alice))
        assert "a viewer only reads" in line
        _ok("jobs", *as_alice)
        _ok("user", "revoke", "alice", *admin)
        mesh.wait("alice refused", lambda: shoal("jobs", *as_alice).returncode != 0)
        listed = json.loads(_ok("user", "ls", "--json", *admin))
        assert [u["name"] for u in listed["users"]] == ["operator"]
        _ok("cancel", job_id, *admin)
        # An admin demoted by the policy: told what their certificate still carries.
        bert = tmp_path / "bert"
        _ok("user", "request", "--dir", str(bert), "--name", "bert")
        _ok("user", "add", "bert", "--team", "ops", "--role", "admin",
            "--request", str(bert / "node.csr"), *admin)  # fmt: skip
        out = _ok("user", "set", "bert", "--role", "user", *admin)
        assert "note: bert keeps an admin's certificate" in out
    finally:
        mesh.stop_all()
