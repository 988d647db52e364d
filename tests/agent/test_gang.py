"""Gangs without I/O: the runner's table of held devices, and an attempt as its owner follows it."""

from __future__ import annotations

import random

import pytest

from agent.job.jobspec import JobSpec
from agent.job.jobstate import JobState
from agent.owning.gang import (
    MAX_BACKOFF_S,
    GangAttempt,
    Step,
    backoff_s,
    fits_a_record,
    prepare_order,
    rebind_member,
)
from agent.owning.ownedjob import OwnedJob, gossip_payload
from agent.running.gangdesk import free_port, host_of
from agent.running.reservations import Hold, HoldRefused, Reservations
from agent.wire.calls import AttemptResult
from agent.wire.codec import MAX_RECORD_BYTES, unpack
from agent.wire.records import AttemptEntry, GangMember, JobStatus

JOB = "a" * 32
OTHER = "b" * 32


def hold(
    job: str = JOB, attempt: int = 1, devices: tuple[str, ...] = ("g0",), at: float = 30.0
) -> Hold:
    return Hold(job, attempt, "owner", GangMember(0, "n", devices), 2, b"s", expires_at=at)


# -- the reservation table -----------------------------------------------------------------------


def test_held_devices_are_busy_for_every_other_job_until_they_run_out() -> None:
    table = Reservations()
    table.hold(hold(devices=("g0", "g1"), at=30.0), now=0.0, devices=3)
    assert table.devices(10.0) == {"g0", "g1"}
    assert table.devices(10.0, but=JOB) == set()  # its own hold is not in its way
    with pytest.raises(HoldRefused, match="device g1 is held for another gang"):
        table.hold(hold(OTHER, devices=("g1", "g2")), now=10.0, devices=3)
    assert table.devices(30.0) == set()  # ran out
    table.hold(hold(OTHER, devices=("g1", "g2"), at=60.0), now=30.0, devices=3)
    assert table.holder(JOB) is None  # the run-out hold was dropped to make room
    assert table.devices(31.0) == {"g1", "g2"}


def test_the_jobs_holding_devices_are_listed() -> None:
    table = Reservations()
    assert table.job_ids() == []
    table.hold(hold(devices=("g0",)), now=0.0)
    table.hold(hold(OTHER, devices=("g1",)), now=0.0)
    assert sorted(table.job_ids()) == sorted([JOB, OTHER])
    table.release(JOB, 1)
    assert table.job_ids() == [OTHER]


def test_a_newer_attempt_replaces_the_older_hold_and_an_older_one_is_refused() -> None:
    table = Reservations()
    table.hold(hold(attempt=2), now=0.0)
    with pytest.raises(HoldRefused, match="attempt 2 of the job is held here already"):
        table.hold(hold(attempt=2), now=0.0)
    with pytest.raises(HoldRefused):
        table.hold(hold(attempt=1), now=0.0)
    replaced = table.hold(hold(attempt=3, devices=("g5",)), now=0.0)
    assert replaced is not None and replaced.attempt == 2
    assert table.devices(1.0) == {"g5"} and len(table) == 1


def test_a_commit_takes_only_the_live_hold_of_its_own_attempt() -> None:
    table = Reservations()
    table.hold(hold(attempt=4, at=30.0), now=0.0)
    assert table.take(JOB, 3, now=1.0) is None
    assert table.take(JOB, 4, now=30.0) is None  # ran out
    assert table.take(JOB, 4, now=29.0) is not None
    assert table.take(JOB, 4, now=29.0) is None  # taken once
    assert table.devices(1.0) == set()


def test_an_abort_frees_its_attempt_and_older_ones_never_a_newer_one() -> None:
    table = Reservations()
    table.hold(hold(attempt=5), now=0.0)
    assert table.release(JOB, 4) is None
    assert table.devices(1.0) == {"g0"}
    freed = table.release(JOB, 5)
    assert freed is not None and freed.attempt == 5
    assert table.devices(1.0) == set()
    assert table.release(JOB, 5) is None


def test_the_holds_an_owner_prepared_are_freed_when_it_is_gone() -> None:
    table = Reservations()
    table.hold(hold(JOB), now=0.0)
    other = Hold(OTHER, 1, "someone else", GangMember(0, "n", ("g1",)), 2, b"s", expires_at=30.0)
    table.hold(other, now=0.0)
    assert [h.job_id for h in table.release_owner("owner")] == [JOB]
    assert table.devices(1.0) == {"g1"}  # another owner's hold stays
    assert table.release_owner("owner") == []


def test_expiry_drops_what_ran_out_and_says_when_the_next_runs_out() -> None:
    table = Reservations()
    assert table.next_expiry() is None
    table.hold(hold(JOB, at=10.0), now=0.0)
    table.hold(hold(OTHER, devices=("g1",), at=20.0), now=0.0)
    assert table.next_expiry() == 10.0
    assert [h.job_id for h in table.expire(15.0)] == [JOB]
    assert table.next_expiry() == 20.0
    assert table.expire(15.0) == []


def _held(at: float, job: str = JOB, devices: tuple[str, ...] = ("g0", "g1"), n: int = 1) -> Hold:
    return Hold(job, n, "owner", GangMember(0, "n", devices), 2, b"s", expires_at=at)


def test_an_agent_that_never_commits_holds_every_device_a_minute_at_most() -> None:
    table = Reservations()
    now = 0.0
    for attempt in (1, 2):  # two holds of both devices, each a newer attempt: 60 s of each
        table.hold(_held(now + 30.0, n=attempt), now, devices=2)
        now += 1.0
    with pytest.raises(HoldRefused, match="uncommitted for as long as it may"):
        table.hold(_held(now + 30.0, n=3), now, devices=2)
    assert table.counts == {"held": 2, "refused": 1}
    # Then a tenth of the node's devices on average: 30 s of both, 300 s on.
    with pytest.raises(HoldRefused):
        table.hold(_held(290.0 + 30.0, n=4), 290.0, devices=2)
    table.hold(_held(302.0 + 30.0, n=4), 302.0, devices=2)
    # Holds of no device cost one each: they cannot pile up either.
    made = 0
    with pytest.raises(HoldRefused):
        for i in range(100):
            table.hold(_held(640.0, f"{i:032x}", devices=()), 610.0, devices=2)
            made += 1
    assert made <= 4  # two minutes of one device at most
    assert len(table) <= 1 + made and len(table.budget) == 1


def test_a_committed_or_aborted_hold_is_paid_back_what_it_did_not_use() -> None:
    table = Reservations()
    for attempt in range(1, 50):  # a gang placed, failed, aborted and placed again, at once
        now = float(attempt)
        table.hold(_held(now + 30.0, n=attempt), now, devices=2)
        assert table.release(JOB, attempt, now + 0.5, devices=2) is not None
    table.hold(_held(130.0, n=50), 100.0, devices=2)
    assert table.take(JOB, 50, 101.0, devices=2) is not None
    assert table.counts == {"held": 50, "aborted": 49, "committed": 1}
    # It paid only for the half seconds its holds lasted: a full hold of both is still its.
    table.hold(_held(131.0, n=51), 101.0, devices=2)
    assert table.release_owner("owner") and len(table.budget) == 0  # gone: forgotten
    table.hold(_held(230.0, OTHER), 200.0, devices=2)
    assert table.take(OTHER, 1, 200.0, devices=2) is not None
    assert len(table.budget) == 0  # paid back in full: nothing remembered


# -- an attempt as its owner follows it ----------------------------------------------------------

MEMBERS = (GangMember(0, "n-b", ("g0",)), GangMember(1, "n-a", ("g0",)), GangMember(2, "n-c", ()))


def end(
    cause: str = "exit", code: int | None = 0, attempt: int = 7, at: float = 5.0
) -> AttemptResult:
    return AttemptResult(JOB, attempt, code, None, cause, 1.0, at)


def test_every_member_exiting_zero_is_success_once_the_last_one_ends() -> None:
    a = GangAttempt(7, MEMBERS)
    assert a.end("n-a", end(at=3.0)) is Step.WAIT
    assert a.end("n-c", end(at=9.0)) is Step.WAIT
    assert [m.rank for m in a.running()] == [0]
    assert a.end("n-b", end(at=4.0)) is Step.DONE
    node, result = a.outcome()
    assert node == "n-b" and result.cause == "exit" and result.exit_code == 0
    assert (result.started_at, result.finished_at) == (1.0, 9.0)


def test_the_first_member_to_fail_stops_the_others_and_decides_the_outcome() -> None:
    a = GangAttempt(7, MEMBERS)
    assert a.end("n-a", end(code=0)) is Step.WAIT
    assert a.end("n-c", end(code=3)) is Step.STOP_OTHERS
    assert a.end("n-b", end("fenced", None)) is Step.DONE  # the one stopped for it
    assert a.outcome() == ("n-c", end(code=3))


def test_a_lost_node_decides_even_when_the_rest_were_stopped_after_it() -> None:
    a = GangAttempt(7, MEMBERS)
    assert a.end("n-b", end("lost", None)) is Step.STOP_OTHERS
    assert a.end("n-a", end("fenced", None)) is Step.WAIT  # decided already: no second stop
    assert a.end("n-c", end(code=1)) is Step.DONE
    assert a.outcome()[0] == "n-b" and a.outcome()[1].cause == "lost"


def test_ends_of_strangers_other_attempts_and_repeats_are_ignored() -> None:
    a = GangAttempt(7, MEMBERS)
    assert a.end("n-z", end()) is Step.IGNORE
    assert a.end("n-a", end(attempt=6)) is Step.IGNORE
    assert a.end("n-a", end(code=2)) is Step.STOP_OTHERS
    assert a.end("n-a", end(code=0)) is Step.IGNORE
    assert a.ends["n-a"].exit_code == 2 and not a.done


def test_every_owner_prepares_in_node_id_order_and_backs_off_with_jitter() -> None:
    assert [m.node for m in prepare_order(MEMBERS)] == ["n-a", "n-b", "n-c"]
    rng = random.Random(1)
    waits = [backoff_s(n, rng) for n in range(1, 9)]
    assert 0.25 <= waits[0] <= 0.75
    assert all(w <= MAX_BACKOFF_S * 1.5 for w in waits)
    assert waits[-1] >= MAX_BACKOFF_S * 0.5  # capped, never 0.5 * 2**7
    assert len({round(backoff_s(3, rng), 6) for _ in range(20)}) > 1  # two owners drift apart


def test_rank_zero_names_its_own_host_and_a_port_free_there() -> None:
    assert host_of("127.0.0.1:7946") == "127.0.0.1"
    assert host_of("[::1]:7946") == "::1"
    port = free_port("127.0.0.1")
    assert 0 < port < 65536


def _members(n: int, gpus: int) -> tuple[GangMember, ...]:
    """``n`` members of ``gpus`` devices each, named as NVIDIA devices are (by UUID)."""
    uuid = "GPU-" + "f" * 35
    keys = tuple(f"{uuid}{g}" for g in range(gpus))
    return tuple(GangMember(r, f"{r:032d}", keys) for r in range(n))


def test_a_gossiped_record_leaves_out_the_oldest_attempts_never_a_member() -> None:
    members = _members(4, 8)
    attempts = tuple(
        AttemptEntry(i // 4 + 1, f"{i % 4:032d}", 1.0, 2.0, "exit", 0, i % 4) for i in range(20)
    )
    status = JobStatus(
        "j" * 32,
        "running",
        5,
        "o" * 32,
        members[0].node,
        members[0].devices,
        attempts=attempts,
        members=members,
    )
    assert len(status.encode()) > MAX_RECORD_BYTES
    got = JobStatus.from_wire(unpack(gossip_payload(status)))
    assert got.members == members
    assert 0 < len(got.attempts) < 20 and got.attempts == attempts[-len(got.attempts) :]
    with pytest.raises(ValueError, match="over one record's limit"):
        gossip_payload(status._replace(members=_members(12, 8)))


def test_a_gang_too_large_for_a_record_is_known_before_it_is_placed() -> None:
    job = OwnedJob("j" * 32, JobSpec(command=("x",)), JobState.PENDING, 0, "o" * 32, None, 1.0)
    assert fits_a_record(job, _members(4, 8))
    assert not fits_a_record(job, _members(12, 8))


def test_a_member_held_on_other_devices_is_named_by_the_attempt_and_the_job() -> None:
    """Late binding for gangs (``gang_prepare`` with ``rebind``): the devices a member's runner
    held instead are what the attempt commits and the job's record says from then on."""
    from agent.owning.gang import GangAttempt

    job = OwnedJob("j" * 32, JobSpec(command=("x",)), JobState.PLACING, 3, "o" * 32, "n-a", 1.0)
    job.members, job.devices = MEMBERS, MEMBERS[0].devices
    a = GangAttempt(3, MEMBERS)
    rebind_member(job, a, MEMBERS[1]._replace(devices=("b9",)))
    rebind_member(job, a, MEMBERS[0]._replace(devices=("a9",)))
    assert [m.devices for m in a.members] == [("a9",), ("b9",), MEMBERS[2].devices]
    assert job.members == a.members and job.devices == ("a9",)
    job.attempt = 4  # a newer attempt is the job's now: an older one's answer changes only it
    rebind_member(job, a, MEMBERS[2]._replace(devices=("c9",)))
    assert a.members[2].devices == ("c9",) and job.members[2].devices == MEMBERS[2].devices
