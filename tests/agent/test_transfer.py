"""The checkpoint transfer protocol (``agent.checkpoints.transfer``), sans I/O, and the folders
around it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.checkpoints.ckptfiles import FolderReader, Vault, clear_folder
from agent.checkpoints.transfer import (
    HEADER_BYTES,
    FileEntry,
    Frame,
    Manifest,
    Receiver,
    TransferError,
    TransferLimits,
    check_path,
    plan,
)
from agent.execution.jobuser import lookup_job_user
from agent.job.jobspec import new_job_id

LIMITS = TransferLimits(max_total_bytes=1 << 20, max_files=8, max_chunk_bytes=4)
JOB = new_job_id()


def entry(path: str, data: bytes) -> FileEntry:
    return FileEntry(path, len(data), hashlib.sha256(data).hexdigest())


def manifest(**files: bytes) -> Manifest:
    return Manifest(JOB, 1, tuple(entry(p.replace("__", "/"), d) for p, d in files.items()))


def test_a_manifest_round_trips_and_its_digest_names_its_content() -> None:
    m = manifest(step=b"step 7", model__weights=b"0123456789")
    back = Manifest.from_wire(m.to_wire(), LIMITS)
    assert back == m and back.total_bytes == 16
    assert Manifest(JOB, 5, m.files).digest == m.digest  # the attempt is not content
    assert manifest(step=b"step 8", model__weights=b"0123456789").digest != m.digest


@pytest.mark.parametrize(
    "path",
    ["", "/etc/passwd", "../up", "a/../../b", "a//b", "./a", "a/.", "c:x", "a\\b", "a\0b"],
)
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(TransferError):
        check_path(path)
    doc = manifest(ok=b"x").to_wire()
    doc["files"][0]["path"] = path
    doc.pop("digest")
    with pytest.raises(TransferError):
        Manifest.from_wire(doc, LIMITS)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d["files"][0].update(size_bytes=-1), "negative size"),
        (lambda d: d["files"][0].update(sha256="00"), "not a SHA-256"),
        (lambda d: d["files"].append(dict(d["files"][0])), "listed twice"),
        (lambda d: d["files"].append({**d["files"][0], "path": "a/b"}), "file and a folder"),
        (lambda d: d["files"][0].update(size_bytes=2 << 20), "over the limit"),
        (lambda d: d.update(files=[d["files"][0]] * 9), "more than 8 files"),
        (lambda d: d.update(attempt=0), "attempt numbers"),
    ],
)
def test_a_manifest_outside_the_rules_or_limits_is_refused(change: object, why: str) -> None:
    doc = manifest(a=b"x").to_wire()
    doc.pop("digest")
    change(doc)  # type: ignore[operator]
    with pytest.raises(TransferError, match=why):
        Manifest.from_wire(doc, LIMITS)


def test_a_manifest_whose_digest_lies_is_refused() -> None:
    doc = manifest(a=b"x").to_wire()
    doc["files"][0]["size_bytes"] = 2
    with pytest.raises(TransferError, match="digest"):
        Manifest.from_wire(doc, LIMITS)


def test_frames_carry_their_checksum_and_a_bad_one_is_refused() -> None:
    raw = Frame(1, 8, b"abcd").encode()
    assert len(raw) == HEADER_BYTES + 4
    assert Frame.decode(raw, LIMITS) == Frame(1, 8, b"abcd")
    flipped = raw[:-1] + b"X"
    with pytest.raises(TransferError, match="checksum"):
        Frame.decode(flipped, LIMITS)
    with pytest.raises(TransferError, match="header says"):
        Frame.decode(raw[:-1], LIMITS)
    with pytest.raises(TransferError, match="over"):
        Frame.decode(Frame(0, 0, b"abcde").encode(), LIMITS)
    with pytest.raises(TransferError, match="not a checkpoint frame"):
        Frame.decode(b"XXXX" + raw[4:], LIMITS)


def test_a_transfer_cut_off_resumes_from_the_offsets_held() -> None:
    data = {"step": b"step 7", "w": b"0123456789"}
    m = manifest(**data)
    chunks = list(plan(m, [0, 0], LIMITS.max_chunk_bytes))
    assert [(c.index, c.offset_bytes, c.length_bytes) for c in chunks] == [
        (0, 0, 4),
        (0, 4, 2),
        (1, 0, 4),
        (1, 4, 4),
        (1, 8, 2),
    ]
    first = Receiver(m, LIMITS)
    blobs = list(data.values())
    for c in chunks[:3]:  # then the connection drops
        assert first.accept(Frame(c.index, c.offset_bytes, blobs[c.index][c.offset_bytes :][:4]))
    assert first.offsets == (6, 4) and not first.complete
    # A new receiver from what is on disk: only the rest is sent.
    resumed = Receiver(m, LIMITS, held=first.offsets)
    rest = list(plan(m, resumed.offsets, LIMITS.max_chunk_bytes))
    assert rest == chunks[3:]
    # A repeat of bytes already held (the answer was lost) is taken as done, not written twice.
    assert resumed.accept(Frame(1, 0, b"0123")) is False
    for c in rest:
        resumed.accept(Frame(c.index, c.offset_bytes, blobs[c.index][c.offset_bytes :][:4]))
    assert resumed.complete and resumed.received_bytes == 16
    resumed.verify([f.sha256 for f in m.files])


def test_the_receiver_refuses_what_the_manifest_does_not_allow() -> None:
    m = manifest(a=b"abcdef")
    r = Receiver(m, LIMITS)
    with pytest.raises(TransferError, match="no file 3"):
        r.accept(Frame(3, 0, b"ab"))
    with pytest.raises(TransferError, match="expected 0"):
        r.accept(Frame(0, 2, b"cd"))  # a gap
    r.accept(Frame(0, 0, b"abcd"))
    with pytest.raises(TransferError, match="past the end"):
        r.accept(Frame(0, 4, b"efg"))  # more bytes than the manifest says
    r.accept(Frame(0, 4, b"eX"))
    # The chunks were each intact, but the whole file is not what the manifest says.
    with pytest.raises(TransferError, match="does not match its checksum"):
        r.verify([hashlib.sha256(b"abcdeX").hexdigest()])
    # Held offsets past a file's size count as nothing held.
    assert Receiver(m, LIMITS, held=[99]).offsets == (0,)


# -- folders (agent.checkpoints.ckptfiles) ---------------------------------------------------------


def test_a_folder_scan_leaves_out_links_and_a_vault_keeps_a_verified_copy(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "step").write_bytes(b"step 7")
    (folder / "sub" / "w").write_bytes(os.urandom(10))
    secret = tmp_path / "secret"
    secret.write_text("the agent's")
    (folder / "link").symlink_to(secret)
    (folder / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(folder / "fifo")
    reader = FolderReader(os.geteuid(), LIMITS)
    scan = reader.scan(folder, JOB, 2)
    assert [f.path for f in scan.manifest.files] == ["step", "sub/w"] and scan.skipped == 3
    assert reader.scan(tmp_path / "missing", JOB, 2).manifest.files == ()
    # Copy it chunk by chunk into a vault, cut off once and resumed.
    vault = Vault(tmp_path / "data", LIMITS)
    m = scan.manifest
    refs = list(plan(m, vault.begin(m), LIMITS.max_chunk_bytes))
    for ref in refs[:2]:
        assert vault.put(JOB, reader.read(folder, m, ref)) is False
    vault2 = Vault(tmp_path / "data", LIMITS)  # the receiver restarted
    offsets = vault2.begin(m)
    assert offsets == (6, 0)
    done = [vault2.put(JOB, reader.read(folder, m, r)) for r in plan(m, offsets, 4)]
    assert done[-1] is True and vault2.held(JOB) == m
    # An older attempt's checkpoint never replaces a newer one.
    with pytest.raises(TransferError, match="older"):
        vault2.begin(Manifest(JOB, 1, (entry("x", b"old"),)))
    # Restored into a job's folder: what an earlier attempt left there is gone.
    dest = tmp_path / "job" / "checkpoint"
    dest.mkdir(parents=True)
    (dest / "stale").write_text("step 1")
    user = lookup_job_user(None)
    vault2.restore(JOB, m.digest, dest, user)
    assert sorted(p.name for p in dest.rglob("*")) == ["step", "sub", "w"]
    assert (dest / "sub" / "w").read_bytes() == (folder / "sub" / "w").read_bytes()
    with pytest.raises(TransferError, match="not held"):
        vault2.restore(JOB, "0" * 64, dest, user)
    clear_folder(dest, user)
    assert list(dest.iterdir()) == []


def test_a_copy_that_does_not_match_its_manifest_is_thrown_away(tmp_path: Path) -> None:
    vault = Vault(tmp_path, LIMITS)
    lying = Manifest(JOB, 1, (FileEntry("w", 6, hashlib.sha256(b"other!").hexdigest()),))
    vault.begin(lying)
    vault.put(JOB, Frame(0, 0, b"abcd"))
    with pytest.raises(TransferError, match="does not match"):
        vault.put(JOB, Frame(0, 4, b"ef"))
    assert vault.held(JOB) is None
    assert vault.begin(lying) == (0,)  # nothing of it is kept


def test_only_what_changed_travels_to_a_vault_holding_the_last_copy(tmp_path: Path) -> None:
    vault = Vault(tmp_path, LIMITS)
    blob = os.urandom(9)
    first = manifest(step=b"1", model__w=blob)
    vault.begin(first)
    for f, data in ((0, b"1"), (1, blob)):
        for off in range(0, len(data), 4):
            vault.put(JOB, Frame(f, off, data[off : off + 4]))
    assert vault.held(JOB) == first
    second = Manifest(JOB, 2, manifest(step=b"2", model__w=blob).files)
    assert vault.begin(second) == (0, len(blob))  # the unchanged weights are not sent again
    assert vault.put(JOB, Frame(0, 0, b"2")) is True
    assert vault.held(JOB) == second
    assert (vault.current_folder(JOB) / "model" / "w").read_bytes() == blob
