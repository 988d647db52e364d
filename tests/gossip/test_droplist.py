"""The test-only drop list: off unless the process started with it; drops both ways; heals."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gossip import droplist
from gossip.certtrust import CertTrust
from gossip.droplist import DropList
from gossip.server import GossipServer
from gossip.transport import RemoteRejected, Unreachable
from tests.gossip.test_transport import TIMEOUT_S, Lab, client_for, lab  # noqa: F401


def test_the_list_is_read_again_when_the_file_changes(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "drop"
    drops = DropList(path, clock=lambda: now[0])
    assert not drops.drops("abc")  # no file: nothing dropped
    path.write_text("abc  # the other half\n\n# a comment\ndef\n")
    assert not drops.drops("abc")  # not looked at again yet
    now[0] += droplist.RECHECK_S
    assert drops.drops("abc") and drops.drops("def") and not drops.drops("ghi")
    path.write_text("")
    now[0] += droplist.RECHECK_S
    assert not drops.drops("abc")


@pytest.mark.parametrize("env", [None, "drop"])
def test_only_the_environment_at_start_switches_it_on(tmp_path: Path, env: str | None) -> None:
    code = "import gossip.droplist as d; print(d.active(), d.dropped('abc'))"
    environ = {"PATH": "/usr/bin:/bin"}
    if env is not None:
        (tmp_path / env).write_text("abc\n")
        environ[droplist.ENV] = str(tmp_path / env)
    out = subprocess.run(
        [sys.executable, "-c", code], env=environ, cwd=Path(__file__).parents[2],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.split() == (["True", "True"] if env else ["False", "False"])


@pytest.fixture
def drop_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "drop"
    monkeypatch.setattr(droplist, "_active", DropList(path, clock=lambda: 0.0))
    yield path


def _set(path: Path, *ids: str) -> None:
    path.write_text("".join(f"{i}\n" for i in ids))
    assert droplist._active is not None
    droplist._active._next_check = float("-inf")  # read it at the next check


async def test_requests_are_dropped_both_ways_and_flow_again_once_healed(
    lab: Lab,  # noqa: F811
    drop_file: Path,
) -> None:
    trust = CertTrust(lab.cluster.ca.certificate)
    async with (
        GossipServer(
            lab.a, lab.cluster.ca.certificate, lab.echo, "127.0.0.1", 0, 4096, trust=trust
        ) as server,
        client_for(lab, lab.b) as client,
    ):
        assert await client.send(server.address, b"hi", TIMEOUT_S) == b"echo:hi"
        _set(drop_file, lab.b.node_id)  # the server side drops the client
        with pytest.raises(RemoteRejected) as refused:
            await client.send(server.address, b"hi", TIMEOUT_S)
        assert refused.value.status == 503
        _set(drop_file, lab.a.node_id)  # the client side drops the server, on a warm connection
        with pytest.raises(Unreachable, match="dropped"):
            await client.send(server.address, b"hi", TIMEOUT_S)
        _set(drop_file)
        assert await client.send(server.address, b"again", TIMEOUT_S) == b"echo:again"
        assert [body for _, _, body in lab.seen] == [b"hi", b"again"]
