"""Which job a full disk stops (``agent.running.diskguard.culprit``), and what is removed of it."""

from __future__ import annotations

import os
from pathlib import Path

from agent.running.diskguard import (
    clear,
    culprit,
    folder_bytes,
    job_bytes,
    note,
    reserve_bytes,
)

MIB = 1 << 20


def test_the_job_holding_the_most_is_stopped_only_while_the_reserve_is_not_free() -> None:
    held = {"a" * 32: 3 * MIB, "b" * 32: 40 * MIB, "c" * 32: 0}
    assert culprit(free_bytes=10 * MIB, reserve=5 * MIB, held=held) is None  # room enough
    assert culprit(free_bytes=1 * MIB, reserve=5 * MIB, held=held) == "b" * 32
    assert culprit(free_bytes=0, reserve=5 * MIB, held={}) is None


def test_a_disk_not_filled_by_a_job_stops_no_job() -> None:
    # Every job holds less than the reserve: something else filled the disk.
    assert culprit(free_bytes=0, reserve=5 * MIB, held={"a" * 32: 4 * MIB}) is None


def test_the_reserve_is_a_twentieth_of_the_disk_at_most_a_gibibyte() -> None:
    assert reserve_bytes(24 * MIB) == int(24 * MIB * 0.05)
    assert reserve_bytes(4 << 40) == 1 << 30


def test_clearing_keeps_the_current_log_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"x" * 10_000)
    job = tmp_path / "job"
    (job / "checkpoint" / "deep").mkdir(parents=True)
    (job / "checkpoint" / "deep" / "fill").write_bytes(b"\0" * (2 * MIB))
    (job / "checkpoint" / "link").symlink_to(outside)
    (job / "escape").symlink_to(outside / "precious")
    for name in ("output.log", "output.log.1", "output.log.2"):
        (job / name).write_text("line\n")
    (job / "output.log.x").write_text("not a log of ours")
    held = folder_bytes(job)
    assert held >= 2 * MIB
    assert clear(job) >= 2 * MIB
    assert [p.name for p in job.iterdir()] == ["output.log"]  # its backups went too
    assert (outside / "precious").read_bytes() == b"x" * 10_000


def test_the_note_goes_into_the_log_never_through_a_link(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("the job's own\n")
    note(log, "stopped: its folder filled the disk")
    assert log.read_text().endswith("[shoal] stopped: its folder filled the disk\n")
    target = tmp_path / "target"
    target.write_text("")
    os.unlink(log)
    log.symlink_to(target)
    note(log, "nothing")
    assert target.read_text() == ""


def test_a_jobs_dataset_links_are_not_what_it_holds(tmp_path: Path) -> None:
    """The agent's ``datasets/`` in a job's folder is hardlinks to the content store: not the
    job's bytes. A ``datasets`` folder someone else owns (the job made it) counts."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "object").write_bytes(b"\1" * (2 * MIB))
    job = tmp_path / "job"
    (job / "datasets" / "imagenet").mkdir(parents=True)
    os.link(store / "object", job / "datasets" / "imagenet" / "a.bin")
    (job / "own").write_bytes(b"\2" * MIB)
    assert folder_bytes(job) >= 3 * MIB
    assert MIB <= job_bytes(job) < 2 * MIB
    if os.geteuid() == 0:  # a job user's own folder of that name is the job's
        os.chown(job / "datasets", 65534, 65534)
        assert job_bytes(job) >= 3 * MIB
