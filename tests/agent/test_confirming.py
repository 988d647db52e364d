"""What the job's other owner confirms of a start, and which older copies it fences then
(``agent.running.confirming``, sans-I/O), row by row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent.job.jobspec import JobSpec
from agent.job.jobstate import JobState
from agent.running.confirming import Confirmations, Placed
from agent.storage.store import Store
from agent.wire.records import GangMember
from tests.agent.authority_kit import write_ahead

OWNER, LIAR = "owner", "liar"
R1, R2, R3 = "runner-1", "runner-2", "runner-3"


def placed(
    attempt: int, *nodes: str, owner: str = OWNER, state: JobState = JobState.PLACING
) -> Placed:
    return Placed(owner, attempt, state, frozenset(nodes))


def test_a_start_is_confirmed_only_as_the_copy_places_it() -> None:
    given = Confirmations()
    assert given.decide("j", 1, OWNER, R1, placed(1, R1)).confirmed
    refusals = [
        (None, "holds no copy"),
        (placed(1, R1, owner=LIAR), "names liar as the owner"),
        (placed(2, R1), "is at attempt 2"),
        (placed(1, R1, state=JobState.RUNNING), "attempt 1 running"),
        (placed(1, R2), "places attempt 1 on runner-2"),
    ]
    for copy, why in refusals:
        verdict = given.decide("k", 1, OWNER, R1, copy)
        assert not verdict.confirmed and why in verdict.reason, (copy, verdict)
        assert verdict.fence == ()
    assert len(given) == 1  # a refusal is not remembered


def test_a_newer_attempt_confirmed_fences_the_older_copies_elsewhere() -> None:
    given = Confirmations()
    assert given.decide("j", 1, OWNER, R1, placed(1, R1)).fence == ()
    # The same attempt asked again by its runner (an offer retried there): nothing to fence.
    assert given.decide("j", 1, OWNER, R1, placed(1, R1)).fence == ()
    # Attempt 2 on another runner: attempt 1's runner is told to stop it.
    assert given.decide("j", 2, OWNER, R2, placed(2, R2)).fence == ((R1, 1),)
    # Attempt 3 back on runner 2: it fences its own older attempt as it admits the newer.
    assert given.decide("j", 3, OWNER, R2, placed(3, R2)).fence == ()
    # An older attempt than one confirmed is refused, whatever the copy says since.
    late = given.decide("j", 2, OWNER, R1, placed(2, R1))
    assert not late.confirmed and "attempt 3 was confirmed already" in late.reason


def test_the_same_attempt_moved_to_another_runner_fences_where_it_was() -> None:
    # An owner that rewrites its copy: attempt 5 on runner 1, then on runner 2, then 3.
    given = Confirmations()
    assert given.decide("j", 5, LIAR, R1, placed(5, R1, owner=LIAR)).fence == ()
    assert given.decide("j", 5, LIAR, R2, placed(5, R2, owner=LIAR)).fence == ((R1, 5),)
    assert given.decide("j", 5, LIAR, R3, placed(5, R3, owner=LIAR)).fence == ((R2, 5),)


def test_the_nodes_whose_records_list_the_job_are_fenced_whatever_is_remembered() -> None:
    # Nothing remembered (the other owner restarted, or is new to the window): runners 1 and 3
    # say the job runs there; whatever attempt they run before 4 is fenced. The runner asking
    # fences its own.
    given = Confirmations()
    verdict = given.decide("j", 4, OWNER, R2, placed(4, R2), listed=[R1, R2, R3])
    assert verdict.confirmed and verdict.fence == ((R1, 3), (R3, 3))
    # Remembered too: the same stop covers both; the same attempt moved is fenced as itself.
    assert given.decide("j", 4, OWNER, R3, placed(4, R3), listed=[R1]).fence == ((R1, 3), (R2, 4))
    # A first attempt has nothing older to fence; a refused start fences nothing.
    assert Confirmations().decide("k", 1, OWNER, R2, placed(1, R2), listed=[R1]).fence == ()
    assert given.decide("j", 5, OWNER, R1, None, listed=[R3]).fence == ()


def test_a_gangs_members_are_each_confirmed_and_fenced_together() -> None:
    given = Confirmations()
    gang = placed(1, R1, R2)
    assert given.decide("g", 1, OWNER, R1, gang).fence == ()
    assert given.decide("g", 1, OWNER, R2, gang).fence == ()  # the other member: no conflict
    verdict = given.decide("g", 2, OWNER, R3, placed(2, R3, R1))
    assert verdict.confirmed and verdict.fence == ((R1, 1), (R2, 1))


def test_confirmations_are_bounded_and_forgotten_with_their_jobs() -> None:
    given = Confirmations(kept=2)
    for job_id in ("a", "b", "c"):
        given.decide(job_id, 1, OWNER, R1, placed(1, R1))
    assert len(given) == 2
    given.forget(["b", "c"])
    assert len(given) == 0
    # Forgotten: a newer attempt elsewhere fences nothing it no longer knows of.
    assert given.decide("c", 2, OWNER, R2, placed(2, R2)).fence == ()


def test_a_stored_copy_says_its_runner_or_its_gangs_members(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        spec = JobSpec(command=("true",))
        write_ahead(store, "j", spec, b"sealed", attempt=3, owner=OWNER, runner=R1)
        members = (GangMember(0, R2, ("a",)), GangMember(1, R3, ("b",)))
        write_ahead(store, "g", spec, b"sealed", attempt=1, owner=OWNER, runner=R2, members=members)
        one, gang = store.get_job("j"), store.get_job("g")
        assert one is not None and gang is not None
        assert Placed.of(one) == placed(3, R1)
        assert Placed.of(gang) == placed(1, R2, R3)
        # Details that do not decode: the record's own runner, no members.
        assert Placed.of(dataclasses.replace(gang, detail={"members": "x"})) == placed(1, R2)
    finally:
        store.close()
