"""A job's checkpoint folder as content of the node's store (``agent.checkpoints.ckptstore``), on
real folders and a real store: what is read of a folder, what a second checkpoint adds, which
copy is held, restored and forgotten, and who may read it."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.checkpoints import ckptstore
from agent.checkpoints.ckptfiles import CHECKPOINT_CHUNK_BYTES, clear_folder
from agent.checkpoints.ckptstore import CheckpointRef, Checkpoints
from agent.common.errors import ApiError
from agent.content.fetch import Fetcher, FetchError
from agent.content.manifest import ContentError
from agent.content.store import DiskStore
from agent.execution.jobuser import lookup_job_user
from agent.mesh.context import AgentContext
from agent.wire.calls import ResumeFrom

JOB = "c" * 32
ME, OWNER, STARTER, STRANGER = "me", "owner", "starter", "stranger"


class Local:
    """The jobs run here, as the runner would say: one folder, one last attempt."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.last: tuple[int, str | None] | None = (2, STARTER)

    def checkpoint_folder(self, job_id: str) -> Path:
        return self.folder

    def last_attempt(self, job_id: str) -> tuple[int, str | None] | None:
        return self.last


def checkpoints(tmp_path: Path) -> tuple[Checkpoints, DiskStore, Local, Counter[str]]:
    store = DiskStore(tmp_path / "store")
    authority = SimpleNamespace(may_own=lambda job_id, node: node in (ME, OWNER))
    mesh = SimpleNamespace(addr_of=lambda node: None, is_gone=lambda node: node == "dead")
    ctx = cast(
        AgentContext, SimpleNamespace(node_id=ME, authority=authority, peers=None, mesh=mesh)
    )
    local = Local(tmp_path / "job" / "checkpoint")
    local.folder.mkdir(parents=True)
    refused: Counter[str] = Counter()
    cp = Checkpoints(ctx, store, Fetcher(store), local, os.geteuid(), refused, tmp_path)
    return cp, store, local, refused


async def test_a_folder_read_into_the_store_leaves_out_links_and_shares_unchanged_chunks(
    tmp_path: Path,
) -> None:
    cp, store, local, _ = checkpoints(tmp_path)
    folder = local.folder
    (folder / "sub").mkdir()
    weights = os.urandom(3 * CHECKPOINT_CHUNK_BYTES)
    (folder / "sub" / "w").write_bytes(weights)
    (folder / "step").write_bytes(b"step 7")
    secret = tmp_path / "secret"
    secret.write_text("the agent's")
    (folder / "link").symlink_to(secret)
    (folder / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(folder / "fifo")

    first = await cp.read_folder(JOB, 2)
    assert first is not None and cp.held(JOB) == first
    manifest = store.manifest(first.digest)
    assert manifest is not None and manifest.kind == "checkpoint" and manifest.name == JOB
    assert [f.path for f in manifest.files] == ["step", "sub/w"]
    held_bytes = store.store_bytes()
    assert held_bytes == len(weights) + len(b"step 7")

    # The next checkpoint changed the step and one chunk of the weights: only those are added.
    changed = bytearray(weights)
    changed[CHECKPOINT_CHUNK_BYTES + 5] ^= 0xFF
    (folder / "sub" / "w").write_bytes(bytes(changed))
    (folder / "step").write_bytes(b"step 9")
    second = await cp.read_folder(JOB, 2)
    assert second is not None and second.digest != first.digest
    assert cp.held(JOB) == second
    assert store.held(first.digest) is None  # the copy it replaces is forgotten
    assert store.store_bytes() == held_bytes  # two of three chunks shared, and one replaced
    assert cp.digests(JOB) == [second.digest]

    # An older attempt's checkpoint never replaces a newer one.
    local.last = (1, STARTER)
    (folder / "step").write_bytes(b"step 1")
    with pytest.raises(ContentError, match="older"):
        await cp.read_folder(JOB, 1)
    assert cp.held(JOB) == second

    # Restored into a job's folder: what an earlier attempt left there is gone.
    dest = tmp_path / "next" / "checkpoint"
    dest.mkdir(parents=True)
    (dest / "stale").write_text("step 1")
    user = lookup_job_user(None)
    await cp.restore(JOB, ResumeFrom(2, second.digest), dest, user)
    assert sorted(p.name for p in dest.rglob("*")) == ["step", "sub", "w"]
    assert (dest / "sub" / "w").read_bytes() == bytes(changed)
    clear_folder(dest, user)
    assert list(dest.iterdir()) == []

    # The job ended: every copy of it goes from the store.
    cp.forget(JOB)
    assert cp.held(JOB) is None and store.held(second.digest) is None
    assert store.store_bytes() == 0


async def test_an_empty_folder_is_no_checkpoint_and_a_stale_attempt_is_refused(
    tmp_path: Path,
) -> None:
    cp, _, local, refused = checkpoints(tmp_path)
    assert await cp.read_folder(JOB, 2) is None
    (local.folder / "step").write_text("3")
    # Asked by an owner of the job for attempt 1 when attempt 2 ran here last.
    with pytest.raises(ApiError, match=r"attempt 2 of \w+ ran here last") as info:
        await cp.of_attempt(JOB, 1, OWNER)
    assert info.value.status == 409
    ref = await cp.of_attempt(JOB, 2, STARTER)  # the agent that started the attempt
    assert isinstance(ref, CheckpointRef) and ref.attempt == 2
    # Anyone else is refused and counted.
    with pytest.raises(ApiError, match="may not move") as info:
        await cp.of_attempt(JOB, 2, STRANGER)
    assert info.value.status == 403
    assert refused["checkpoint"] == 1 and cp.counts["refused_not_owner"] == 1


def test_who_may_read_a_checkpoint(tmp_path: Path) -> None:
    cp, _, local, refused = checkpoints(tmp_path)
    (local.folder / "step").write_text("3")
    ref = cp._read_folder(JOB, 2, local.folder)
    assert ref is not None
    assert cp.gate(ref.digest, OWNER) and cp.gate(ref.digest, STARTER)
    assert not cp.gate(ref.digest, STRANGER)
    assert refused["checkpoint"] == 1
    cp.grant(JOB, STRANGER)  # an owner named it to run the job's next attempt
    assert cp.gate(ref.digest, STRANGER)
    assert not cp.gate("0" * 64, OWNER)  # nothing held: no job to judge by


async def test_a_checkpoint_fetch_gives_up_at_once_a_holder_the_mesh_holds_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch is told which holders are gone (the fetcher gives such a holder up at once,
    ``tests/content/test_fetch.py``), not left to back off from a dead runner's copy."""
    cp, *_ = checkpoints(tmp_path)
    monkeypatch.setattr(cp, "addr_of", lambda node: f"127.0.0.1:{len(node)}")
    told: list[Callable[[str], bool] | None] = []

    async def fetch(digest: str, holders: object, **kw: Any) -> object:
        told.append(kw.get("gone"))
        raise FetchError("no holder has it")

    monkeypatch.setattr(cp.fetcher, "fetch", fetch)
    monkeypatch.setattr(ckptstore, "RESUME_WAIT_S", 0.0)
    with pytest.raises(FetchError, match="not fetched"):
        await cp.fetch(JOB, CheckpointRef(2, "d" * 64), ["dead", "alive"])
    gone = told[0]
    assert gone is not None and gone("dead") and not gone("alive")
