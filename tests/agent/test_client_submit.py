"""A submission the owner holds but could not replicate yet (503) is sent again under the same
job id, so retrying never makes a second job; any other refusal is not retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, new_job_id
from agent.operator import client as client_module
from agent.operator.client import ApiClient, ApiError
from tests.agent.authority_kit import Kit


class _Owner:
    """Answers like an owner: ``refusals`` first, then the job."""

    def __init__(self, refusals: list[ApiError]) -> None:
        self.refusals = refusals
        self.bodies: list[dict[str, Any]] = []

    async def command(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        assert kind == "submit"
        self.bodies.append(body)
        if self.refusals:
            raise self.refusals.pop(0)
        return {"job_id": body["job_id"], "replicas": 2}


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "SUBMIT_RETRY_WAITS_S", (0.0, 0.0, 0.0))


async def _submit(tmp_path: Path, owner: _Owner, job_id: str) -> dict[str, Any]:
    kit = Kit(tmp_path)
    client = ApiClient(kit.cluster.operator, "127.0.0.1:9")
    client.command = owner.command  # type: ignore[method-assign]
    return await client.submit(JobSpec(command=("true",)), job_id)


async def test_a_held_but_unreplicated_submission_is_sent_again_as_the_same_job(
    tmp_path: Path,
) -> None:
    unreplicated = ApiError(503, "no replica could store the job; retry with the same job id")
    owner, job_id = _Owner([unreplicated, unreplicated]), new_job_id()
    assert (await _submit(tmp_path, owner, job_id))["replicas"] == 2
    assert [b["job_id"] for b in owner.bodies] == [job_id] * 3


async def test_a_refusal_is_not_retried(tmp_path: Path) -> None:
    owner = _Owner([ApiError(400, "bad spec")])
    with pytest.raises(ApiError, match="bad spec"):
        await _submit(tmp_path, owner, new_job_id())
    assert len(owner.bodies) == 1


async def test_a_mesh_that_never_replicates_is_said_after_the_retries(tmp_path: Path) -> None:
    owner = _Owner([ApiError(503, "no replica could store the job")] * 4)
    with pytest.raises(ApiError, match="no replica"):
        await _submit(tmp_path, owner, new_job_id())
    assert len({b["job_id"] for b in owner.bodies}) == 1 and len(owner.bodies) == 4


@pytest.mark.parametrize(
    ("address", "parsed"),
    [("10.0.0.5:7946", ("10.0.0.5", 7946)), ("[::1]:7946", ("::1", 7946)), ("gpu1:1", ("gpu1", 1))],
)
def test_agent_address_reads_what_an_operator_names(address: str, parsed: tuple[str, int]) -> None:
    assert client_module.agent_address(address) == parsed


@pytest.mark.parametrize("address", ["gpu1", ":7946", "gpu1:", "gpu1:0", "gpu1:65536", "gpu1:x"])
def test_agent_address_refuses_anything_else_in_one_line(address: str) -> None:
    with pytest.raises(ValueError, match="not a host:port address") as caught:
        client_module.agent_address(address)
    assert "\n" not in str(caught.value)
