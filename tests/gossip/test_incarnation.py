"""The kept incarnation only grows across a node's lives, whatever the wall clock does: each
start writes one above the last used, and each refutation's raise is written before the Alive
that carries it goes out."""

from __future__ import annotations

import random
import stat
from pathlib import Path

import pytest

from gossip.config import GossipConfig
from gossip.incarnation import (
    MAX_INCARNATION,
    IncarnationError,
    IncarnationFile,
    boot_incarnation,
)
from gossip.peer import Peer
from gossip.simkeys import SimSigner, SimTrust
from tests.gossip.helpers import KEYRING, alive, suspect


def _life(kept: IncarnationFile, wall_s: float, seen: list[tuple[int, int]]) -> Peer:
    """A core started as the node starts one: at the kept file's boot incarnation, with the
    file keeping its raises; ``seen`` gets (raise, incarnation of our Alive at that moment)."""
    boot = kept.boot(int(wall_s))

    def keep(incarnation: int) -> bool:
        seen.append((incarnation, peer.self_alive.incarnation))
        return kept.keep(incarnation)

    cfg = GossipConfig(node_id="me", addr="me:1", boot_incarnation=boot)
    signer, trust = SimSigner("me", KEYRING), SimTrust(KEYRING)
    peer = Peer(cfg, signer, trust, [], 0.0, random.Random(1), on_incarnation=keep)
    peer.preload([alive("acc", 1)], 0.0)
    return peer


def test_the_start_rule() -> None:
    assert boot_incarnation(None, 1000) == 1000  # a first start, or a lost folder: the clock
    assert boot_incarnation(1000, 1000) == 1001  # the same second
    assert boot_incarnation(1500, 1000) == 1501  # refuted past the clock, or the clock back
    assert boot_incarnation(900, 1000) == 1000  # the clock moved on


def test_the_kept_incarnation_grows_across_restarts_and_past_refutations(tmp_path: Path) -> None:
    kept = IncarnationFile(tmp_path / "incarnation")
    assert kept.read() is None
    seen: list[tuple[int, int]] = []
    first = _life(kept, 1000.4, seen)
    assert (first.incarnation, kept.read()) == (1000, 1000)
    first.receive("acc:1", suspect("me", 1000, "acc"), 1.0)
    first.receive("acc:1", suspect("me", 1500, "acc"), 2.0)
    assert first.incarnation == 1501 and first.stats.refutations == 2
    # each raise was written while our Alive still carried the one before it
    assert seen == [(1001, 1000), (1501, 1001)]
    assert kept.read() == 1501
    assert first.self_alive.incarnation == 1501
    assert first.stats.incarnations_unkept == 0

    # restarted in the same second: above the refuted life, not at the clock
    second = _life(kept, 1000.9, seen)
    assert second.incarnation == 1502 and kept.read() == 1502
    # restarted under a clock stepped back ten minutes
    third = _life(kept, 400.0, seen)
    assert third.incarnation == 1503 and kept.read() == 1503
    third.receive("acc:1", suspect("me", 1503, "acc"), 1.0)
    assert kept.read() == 1504
    # the clock far ahead of every life: the clock
    assert _life(kept, 90_000.0, seen).incarnation == 90_000 and kept.read() == 90_000
    assert stat.S_IMODE((tmp_path / "incarnation").stat().st_mode) == 0o600


def test_a_refutation_that_cannot_be_kept_still_refutes_and_is_counted(tmp_path: Path) -> None:
    kept = IncarnationFile(tmp_path / "state" / "incarnation")
    (tmp_path / "state").mkdir()
    peer = _life(kept, 1000.0, [])
    (tmp_path / "state" / "incarnation").unlink()
    (tmp_path / "state").rmdir()  # the folder went away under the running node
    peer.receive("acc:1", suspect("me", 1000, "acc"), 1.0)
    assert peer.incarnation == peer.self_alive.incarnation == 1001
    assert peer.stats.incarnations_unkept == 1


@pytest.mark.parametrize(
    "content",
    [b"", b"abc\n", b"-5\n", b"12 13\n", b"1" * 40, str(MAX_INCARNATION + 1).encode(), b"\xff"],
)
def test_a_bad_incarnation_file_is_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "incarnation"
    path.write_bytes(content)
    with pytest.raises(IncarnationError) as err:
        IncarnationFile(path).boot(1000)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert path.read_bytes() == content  # nothing written over what could not be read


def test_an_incarnation_file_that_cannot_be_written_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "incarnation"
    with pytest.raises(IncarnationError, match="cannot write"):
        IncarnationFile(path).boot(1000)
    (tmp_path / "folder").mkdir()
    with pytest.raises(IncarnationError, match="cannot read"):
        IncarnationFile(tmp_path / "folder").boot(1000)
