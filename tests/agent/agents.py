"""Real agent processes for the tests: :class:`agent.sandbox.localmesh.LocalMesh`, driven
synchronously.

``LocalMesh`` makes the throwaway cluster (CA, operator identity, one identity per agent), starts,
signals and stops the ``shoal agent`` processes (simulated GPUs, loopback, mutual TLS), exactly as
``shoal demo`` does. :class:`Mesh` adds what tests need on top: blocking waits with the agents'
logs in the failure message, and plain HTTPS requests and sealed commands as the operator.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.sandbox.localmesh import AgentProcess, LocalMesh
from gossip import envelope
from gossip.certtrust import CertSigner
from gossip.identity import NodeIdentity
from gossip.tls import client_context

if TYPE_CHECKING:
    from agent.job.jobspec import JobSpec

DEADLINE_S = 30.0


class Mesh:
    """Agents ``0..len(sims)-1``, agent ``i`` simulating the GPU profile ``sims[i]``."""

    def __init__(
        self,
        root: Path,
        sims: Sequence[str],
        *,
        extra: Sequence[str] = (),
        job_user: str | None = "",
    ) -> None:
        """``job_user`` is passed as ``--job-user``: by default ``""``, the agents' own user, so
        jobs may write into the test's folders; ``None`` leaves the agent's default (as root,
        ``shoal-job`` or ``nobody``)."""
        self.root = root
        if job_user is not None:
            extra = ("--job-user", job_user, *extra)
        self.local = LocalMesh(root, len(sims), profiles=tuple(sims), extra_args=tuple(extra))
        self.local.create()
        assert self.local.operator is not None
        self.operator: NodeIdentity = self.local.operator
        self._ssl = client_context(self.operator, self.operator.ca_certificate)
        self.signer = CertSigner(self.operator)

    @property
    def agents(self) -> list[AgentProcess]:
        return self.local.agents

    @property
    def cluster_dir(self) -> Path:
        """The operator identity's folder (``--identity`` for the CLI)."""
        return self.root / "cluster"

    # -- processes -------------------------------------------------------------------------------

    def start(self, i: int) -> AgentProcess:
        """Start (or restart) agent ``i`` on its address and wait until it listens."""
        a = self.agents[i]
        self.local.start_agent(a)
        try:
            asyncio.run(self.local.wait_listening(timeout_s=DEADLINE_S))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None
        if not a.running:
            raise AssertionError(f"agent {i} exited at start:\n{self.logs()}")
        return a

    def start_all(self) -> None:
        self.local.start()
        self.wait_converged()

    def wait_converged(self, deadline_s: float = DEADLINE_S) -> None:
        try:
            asyncio.run(self.local.wait_converged(timeout_s=deadline_s))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None
        n = sum(1 for a in self.agents if a.running)
        self.wait(
            f"{n} agents see each other",
            lambda: all(self.get(a, "/healthz")["members"] == n for a in self.agents if a.running),
            deadline_s,
        )
        # Every inventory has arrived everywhere.
        self.wait(
            "inventories everywhere",
            lambda: all(
                sum(1 for node in self.get(a, "/v1/nodes")["nodes"] if node["devices"]) >= n
                for a in self.agents
                if a.running
            ),
            deadline_s,
        )

    def kill(self, i: int) -> None:
        """SIGKILL agent ``i`` (a crash: no goodbye, no report)."""
        self.local.kill(self.agents[i], signal.SIGKILL)

    def terminate(self, i: int, timeout_s: float = 60.0) -> int:
        """SIGTERM agent ``i`` and wait for it to exit; its exit status."""
        a = self.agents[i]
        assert a.process is not None
        a.process.send_signal(signal.SIGTERM)
        try:
            return a.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent {i} still runs {timeout_s:.0f} s after SIGTERM") from None

    def stop_all(self) -> None:
        self.local.stop(grace_s=20.0)

    def logs(self) -> str:
        return "\n".join(
            f"--- agent {a.index} {a.node_id[:8]}\n{a.log_path.read_text()[-4000:]}"
            for a in self.agents
            if a.log_path.exists()
        )

    # -- HTTP ------------------------------------------------------------------------------------

    def request(
        self,
        a: AgentProcess,
        method: str,
        path: str,
        data: bytes | None = None,
        content_type: str = "application/json",
        timeout_s: float = 15.0,
        identity: NodeIdentity | None = None,
    ) -> tuple[int, bytes]:
        """As the operator, or as ``identity`` (an agent's, say)."""
        req = urllib.request.Request(f"https://{a.address}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        context = (
            self._ssl if identity is None else client_context(identity, identity.ca_certificate)
        )
        try:
            with urllib.request.urlopen(req, context=context, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            with exc:  # its response holds the socket: closed here, not whenever it is collected
                return exc.code, exc.read()

    def get(self, a: AgentProcess, path: str) -> Any:
        status, body = self.request(a, "GET", path)
        assert status == 200, (status, body)
        return json.loads(body)

    def seal(self, kind: str, body: dict[str, Any], *, now: float | None = None) -> bytes:
        payload = json.dumps(body).encode()
        return envelope.seal(self.signer, kind, payload, time.time() if now is None else now)

    def command(
        self, a: AgentProcess, kind: str, body: dict[str, Any], *, sealed: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        data = sealed if sealed is not None else self.seal(kind, body)
        status, raw = self.request(
            a, "POST", "/v1/commands", data, "application/octet-stream", timeout_s=30
        )
        return status, json.loads(raw)

    def job(self, a: AgentProcess, job_id: str) -> dict[str, Any]:
        status, body = self.request(a, "GET", f"/v1/jobs/{job_id}")
        return json.loads(body) if status == 200 else {"state": None, "status": status}

    def offer(
        self, caller: int, to: int, job: JobSpec, keys: Sequence[str], shrink: Sequence[str] = ()
    ) -> tuple[int, str]:
        """An offer of an operator's genuine submission, made by agent ``caller`` as the job's
        owner (a job id whose order puts it first), straight to agent ``to``'s runner: what an
        owner with a wrong view of the mesh would send (``shrink``: elastic jobs it asks to
        shrink). The status and the error, if any."""
        from agent.job.jobspec import new_job_id
        from agent.job.ownership import rank
        from gossip.identity import load_identity

        live = [a.node_id for a in self.agents]
        me = self.agents[caller]
        job_id = next(j for j in iter(new_job_id, "") if rank(j, live)[0] == me.node_id)
        sealed = self.seal("submit", {"job_id": job_id, "spec": job.to_dict()})
        self.write_ahead(caller, job_id, sealed, 1, self.agents[to].node_id)
        offer = {
            "job_id": job_id,
            "attempt": 1,
            "owner": me.node_id,
            "devices": list(keys),
            "submission": base64.b64encode(sealed).decode(),
        }
        if shrink:
            offer["shrink"] = list(shrink)
        identity = load_identity(me.directory / "identity")
        status, body = self.request(
            self.agents[to],
            "POST",
            "/v1/internal/start",
            json.dumps(offer).encode(),
            identity=identity,
        )
        return status, str(json.loads(body).get("error", ""))

    def write_ahead(
        self,
        caller: int,
        job_id: str,
        sealed: bytes,
        attempt: int,
        runner: str,
        *,
        gen: int | None = None,
        members: Sequence[dict[str, Any]] = (),
    ) -> AgentProcess | None:
        """What an owner does before it offers an attempt: agent ``caller``, as the job's owner,
        copies the job, ``attempt`` placed on ``runner`` (or on a gang's ``members``, in their
        wire form), to the job's other owner (the agent beside it in the job's order), which a
        runner asks before it starts the attempt. The agent that took the copy (``None``: a
        mesh of one)."""
        from agent.job.ownership import rank
        from agent.wire.calls import JobTransfer, OwnerDetail
        from agent.wire.records import GangMember, JobStatus
        from gossip.identity import load_identity

        me = self.agents[caller]
        window = rank(job_id, [a.node_id for a in self.agents if a.running])[:2]
        other = next((n for n in window if n != me.node_id), None)
        if other is None:
            return None
        gen = attempt if gen is None else gen
        record = JobStatus(
            job_id, "placing", attempt, me.node_id, runner, submitted_at=time.time(), gen=gen
        )
        gang = tuple(GangMember.from_wire(m, "member") for m in members)
        body = JobTransfer(record, OwnerDetail(gen=gen, members=gang), sealed).to_wire()
        target = self.agents[self.node_index(other)]
        identity = load_identity(me.directory / "identity")
        status, answer = self.request(
            target, "POST", "/v1/internal/replicate", json.dumps(body).encode(), identity=identity
        )
        assert status == 200, (status, answer)
        return target

    def events(self, a: AgentProcess) -> list[dict[str, Any]]:
        """Every event agent ``a`` holds (its own and those gossiped to it), oldest first."""
        rows: list[dict[str, Any]] = []
        since = 0
        while True:
            answer = self.get(a, f"/v1/events?since={since}")
            if not answer["events"]:
                return rows
            rows += answer["events"]
            since = answer["next"]

    def wait(self, what: str, check: Callable[[], bool], deadline_s: float = DEADLINE_S) -> float:
        started = time.monotonic()
        last: BaseException | None = None
        while time.monotonic() - started < deadline_s:
            try:
                if check():
                    return time.monotonic() - started
            except (OSError, AssertionError, KeyError, ValueError) as exc:
                last = exc
            time.sleep(0.1)
        raise AssertionError(
            f"timed out after {deadline_s:.0f} s waiting for {what} ({last!r})\n{self.logs()}"
        )

    def node_index(self, node_id: str) -> int:
        return next(a.index for a in self.agents if a.node_id == node_id)


@contextmanager
def started(root: Path, sims: Sequence[str], **kw: Any) -> Iterator[Mesh]:
    """A :class:`Mesh` of ``sims``, started and converged, stopped at the end."""
    m = Mesh(root, sims, **kw)
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def spec(argv: Sequence[str], *, gpus: int = 1, **extra: Any) -> dict[str, Any]:
    """A job spec's wire form with defaults for everything else."""
    from agent.job.jobspec import JobSpec, Resources

    resources = extra.pop("resources", None) or Resources(gpus_per_node=gpus)
    return JobSpec(command=tuple(argv), resources=resources, **extra).to_dict()


def tick_spans(path: Path) -> dict[int, tuple[float, float]]:
    """First and last tick of every attempt, from a file of ``attempt time`` lines."""
    spans: dict[int, tuple[float, float]] = {}
    for line in path.read_text().splitlines():
        attempt_text, _, at_text = line.partition(" ")
        attempt, at = int(attempt_text), float(at_text)
        lo, hi = spans.get(attempt, (at, at))
        spans[attempt] = (min(lo, at), max(hi, at))
    return spans
