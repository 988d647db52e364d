"""A member that lies about its own inventory, on real agent processes.

The liar is agent 3: its inventory claims eight H100s (a simulated profile; to the mesh it is a
claim like any other). The threat model (``docs/security/threat-model.md``) bounds what that
lie buys: it is offered the jobs its claim fits and no others, nothing is believed of it about
another node, and the operator takes the jobs back, by migrating them or by revoking it, with
every attempt fenced: the job's processes (each writes its pid and ticks into the test's
folder) never run in two places at once.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import rank
from agent.sandbox.localmesh import AgentProcess
from gossip.identity import load_identity
from tests.agent.agents import Mesh, spec, started, tick_spans
from tests.agent.test_revocation import revoke

pytestmark = pytest.mark.slow

LIAR = 3
"""The lying member; agent 2 is the honest node with the same eight GPUs, cordoned at first."""

TICKER = """
import os, sys, time
folder, attempt = sys.argv[1], os.environ["SHOAL_ATTEMPT"]
with open(os.path.join(folder, attempt + ".pid"), "w") as f:
    f.write(str(os.getpid()))
while True:
    with open(os.path.join(folder, "ticks"), "a") as f:
        f.write(f"{attempt} {time.time()}\\n")
    time.sleep(0.05)
"""


def beyond_the_liar(mesh: Mesh) -> str:
    """A job id whose order puts the liar last: honest agents own it and hold its copy."""
    live = [a.node_id for a in mesh.agents]
    while True:
        job_id = new_job_id()
        if rank(job_id, live)[-1] == mesh.agents[LIAR].node_id:
            return job_id


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class Watch:
    """Samples each job's processes (its pid files) every 20 ms: the most found alive at once."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = folders
        self.most = dict.fromkeys(folders, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def pids(self, job_id: str) -> dict[int, int]:
        """Attempt -> the pid its process wrote."""
        out = {}
        for path in self.folders[job_id].glob("*.pid"):
            text = path.read_text()
            if text:
                out[int(path.stem)] = int(text)
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for job_id in self.folders:
                live = sum(1 for pid in self.pids(job_id).values() if alive(pid))
                self.most[job_id] = max(self.most[job_id], live)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def never_overlapped(folder: Path) -> dict[int, tuple[float, float]]:
    """The attempts' tick spans, checked one after another in time."""
    spans = tick_spans(folder / "ticks")
    ordered = [spans[n] for n in sorted(spans)]
    for (_, last), (first, _) in pairwise(ordered):
        assert last < first, spans
    return spans


def nodes(mesh: Mesh, a: AgentProcess) -> dict[str, dict[str, Any]]:
    return {n["node_id"]: n for n in mesh.get(a, "/v1/nodes")["nodes"]}


def running_on(mesh: Mesh, job_id: str) -> str | None:
    """The node the job runs on, as agent 0 shows it (None unless running)."""
    job = mesh.job(mesh.agents[0], job_id)
    return str(job["runner"]) if job["state"] == "running" else None


def is_running(mesh: Mesh, job_id: str) -> bool:
    return running_on(mesh, job_id) is not None


def inventory(device: dict[str, Any]) -> tuple[Any, ...]:
    return device["key"], device["name"], device.get("uuid"), device.get("mem_total_bytes")


def set_drain(mesh: Mesh, kind: str, target: AgentProcess, shown: str) -> None:
    status, answer = mesh.command(mesh.agents[0], kind, {"node": target.node_id})
    assert status == 200, answer
    mesh.wait(
        f"every agent sees agent {target.index} {shown}",
        lambda: all(
            nodes(mesh, a)[target.node_id]["drain"] == shown for a in mesh.agents if a.running
        ),
    )


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with started(tmp_path, ["l4:1", "mi300x:1", "h100:8", "h100:8"]) as m:
        yield m


def test_a_member_claiming_gpus_it_lacks_draws_what_fits_and_the_operator_takes_it_back(
    mesh: Mesh, tmp_path: Path
) -> None:
    liar, honest = mesh.agents[LIAR], mesh.agents[2]
    a0 = mesh.agents[0]
    # The honest eight-GPU node takes no work yet: only the liar's claim fits the big jobs.
    set_drain(mesh, "cordon", honest, "cordoned")
    big = Resources(gpus_per_node=4, backends=("cuda",))
    jobs: dict[str, str] = {}
    folders: dict[str, Path] = {}
    cases: list[tuple[str, Resources, dict[str, Any]]] = [
        ("big-a", big, {}),
        ("big-b", big, {}),
        # Jobs the liar's claim does not fit: an AMD GPU; a label it does not claim.
        ("rocm", Resources(gpus_per_node=1, backends=("rocm",)), {}),
        ("rack-a", Resources(gpus_per_node=1), {"affinity": {"zone": "rack-a"}}),
    ]
    for name, resources, extra in cases:
        job_id = beyond_the_liar(mesh)
        folders[job_id] = tmp_path / name
        folders[job_id].mkdir()
        jobs[name] = job_id
        argv = [sys.executable, "-c", TICKER, str(folders[job_id])]
        body = {"job_id": job_id, "spec": spec(argv, resources=resources, **extra)}
        assert mesh.command(a0, "submit", body)[0] == 200, name
        mesh.wait(f"{name} running", partial(is_running, mesh, job_id))
    with Watch(folders) as watch:
        records = {name: mesh.job(a0, j) for name, j in jobs.items()}
        # 1. It draws the jobs its claim fits, and is offered no other (an offer it declined
        #    would have cost the job an attempt).
        where = {name: (r["runner"], r["attempt"]) for name, r in records.items()}
        assert where == {
            "big-a": (liar.node_id, 1),
            "big-b": (liar.node_id, 1),
            "rocm": (mesh.agents[1].node_id, 1),
            "rack-a": (a0.node_id, 1),
        }, where
        # Its claim is its own: every agent shows its eight GPUs under its name, and each
        # honest node as that node says it is.
        for a in mesh.agents:
            seen = nodes(mesh, a)
            for b in mesh.agents:
                devices = seen[b.node_id]["devices"]
                own = nodes(mesh, b)[b.node_id]["devices"]
                assert len(devices) == {0: 1, 1: 1, 2: 8, 3: 8}[b.index], (a.index, b.index)
                assert [inventory(d) for d in devices] == [inventory(d) for d in own]

        # 2. The operator migrates one of its jobs to the honest node, now open again.
        set_drain(mesh, "undrain", honest, "schedulable")
        moved = jobs["big-a"]
        pid = watch.pids(moved)[1]
        status, answer = mesh.command(a0, "migrate", {"job_id": moved, "target": honest.node_id})
        assert status == 200, answer
        mesh.wait(
            "big-a running on the honest node",
            lambda: running_on(mesh, moved) == honest.node_id,
        )
        mesh.wait("its new attempt ticking", lambda: 2 in tick_spans(folders[moved] / "ticks"))
        assert not alive(pid)
        assert mesh.job(a0, moved)["attempt"] == 2
        # Its fenced attempt's end, told by the liar afterwards, is not believed.
        identity = load_identity(liar.directory / "identity")
        owner = next(a for a in mesh.agents if a.node_id == mesh.job(a0, moved)["owner"])
        lie = {"job_id": moved, "attempt": 1, "exit_code": 0, "signal": None, "cause": "exit"}
        lie |= {"started_at": time.time() - 5, "finished_at": time.time()}
        status, raw = mesh.request(
            owner, "POST", "/v1/internal/report", json.dumps(lie).encode(), identity=identity
        )
        assert status == 200 and json.loads(raw).get("stale") is True, (status, raw)
        # Nor one for the attempt it does not run.
        lie["attempt"] = 2
        status, raw = mesh.request(
            owner, "POST", "/v1/internal/report", json.dumps(lie).encode(), identity=identity
        )
        assert status == 200 and json.loads(raw).get("stale") is True, (status, raw)
        time.sleep(1.0)
        after = mesh.job(a0, moved)
        assert (after["state"], after["runner"], after["attempt"]) == (
            "running",
            honest.node_id,
            2,
        )

        # 3. The operator revokes the liar: the job it still held runs on an honest node.
        kept = jobs["big-b"]
        pid = watch.pids(kept)[1]
        revoke(mesh, 0, liar.node_id)
        assert liar.process is not None and liar.process.wait(timeout=30) == 0
        mesh.wait(
            "big-b running on the honest node",
            lambda: running_on(mesh, kept) == honest.node_id,
        )
        mesh.wait("its new attempt ticking", lambda: 2 in tick_spans(folders[kept] / "ticks"))
        assert not alive(pid)
        # Revoked, it is refused before any route: it can tell the owner nothing more.
        owner = next(a for a in mesh.agents if a.node_id == mesh.job(a0, kept)["owner"])
        lie |= {"job_id": kept, "attempt": 1}
        status, _ = mesh.request(
            owner, "POST", "/v1/internal/report", json.dumps(lie).encode(), identity=identity
        )
        assert status == 403
        time.sleep(0.5)
    # No job ever ran in two places at once: by its processes, and by its own ticks.
    assert watch.most == dict.fromkeys(folders, 1), watch.most
    assert set(never_overlapped(folders[moved])) == {1, 2}
    assert set(never_overlapped(folders[kept])) == {1, 2}
    for name in ("rocm", "rack-a"):
        assert set(never_overlapped(folders[jobs[name]])) == {1}
    # The other jobs ran on undisturbed.
    assert {n: mesh.job(a0, jobs[n])["attempt"] for n in ("big-a", "rocm", "rack-a")} == {
        "big-a": 2,
        "rocm": 1,
        "rack-a": 1,
    }
    for job_id in jobs.values():
        assert mesh.command(a0, "cancel", {"job_id": job_id})[0] == 200
