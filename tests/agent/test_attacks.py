"""Attacks on real agent processes by a member of the mesh: one agent's stolen key and certificate.

Each attack is made as an intruder would make it, over mutual TLS with the stolen identity, and
each must be refused and counted with nothing else disturbed: the operator's jobs keep running,
listings stay true, the victims stay up.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.job.ownership import rank
from agent.mesh.view import pack
from agent.sandbox.localmesh import AgentProcess
from gossip import envelope
from gossip.certtrust import CertSigner
from gossip.codec import frame, signing_bytes
from gossip.identity import NodeIdentity, enroll_node, init_cluster, load_ca, load_identity
from gossip.messages import Compound, Dead, Record
from gossip.tls import client_context
from gossip.transport import CONTENT_TYPE, PATH, PROTOCOL_HEADER, PROTOCOL_VERSION
from tests.agent.agents import Mesh, spec

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class Intruder:
    """Agent ``index``'s stolen identity, used from outside its process."""

    def __init__(self, mesh: Mesh, index: int) -> None:
        self.mesh = mesh
        self.agent = mesh.agents[index]
        self.identity: NodeIdentity = load_identity(self.agent.directory / "identity")
        self.signer = CertSigner(self.identity)
        self._ssl: ssl.SSLContext = client_context(self.identity, self.identity.ca_certificate)

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    def post(self, a: AgentProcess, path: str, data: bytes, content_type: str) -> int:
        req = urllib.request.Request(f"https://{a.address}{path}", data=data, method="POST")
        req.add_header("Content-Type", content_type)
        if path == PATH:
            req.add_header(PROTOCOL_HEADER, PROTOCOL_VERSION)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=15) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            exc.close()  # its response holds the socket: closed here, not whenever collected
            return int(exc.code)

    def call(self, a: AgentProcess, op: str, body: dict[str, Any]) -> int:
        return self.post(a, f"/v1/internal/{op}", json.dumps(body).encode(), "application/json")

    def gossip_dead(self, a: AgentProcess, node_id: str) -> int:
        """A Dead about ``node_id``, signed as the intruder, for a life ahead of its own."""
        incarnation = int(time.time()) + 1000
        unsigned = Dead(node_id, incarnation, self.node_id, b"")
        signed = Dead(node_id, incarnation, self.node_id, self.signer.sign(signing_bytes(unsigned)))
        return self.post(a, PATH, frame(self.agent.address, signed, 1 << 20), CONTENT_TYPE)

    def gossip_record(
        self, a: AgentProcess, kind: str, payload: bytes, origin: str | None = None
    ) -> int:
        """A record under the stolen identity's origin (or ``origin``: a forgery), signed with
        its key, sent to ``a``."""
        origin = origin or self.node_id
        unsigned = Record(origin, kind, 2**40, 1, payload, b"")
        signed = Record(origin, kind, 2**40, 1, payload, self.signer.sign(signing_bytes(unsigned)))
        return self.post(a, PATH, frame(self.agent.address, signed, 1 << 20), CONTENT_TYPE)

    def gossip_forgeries(self, a: AgentProcess, origin: str, count: int) -> int:
        """One message of ``count`` records under ``origin``'s name, each newer than the last
        and with a signature that is not its: cheap to send, a signature check each to handle."""
        forged = tuple(
            Record(origin, "node", 2**40, i, b"x", bytes(64)) for i in range(1, count + 1)
        )
        return self.post(
            a, PATH, frame(self.agent.address, Compound(forged), 1 << 20), CONTENT_TYPE
        )


def metric(mesh: Mesh, a: AgentProcess, name: str, **labels: str) -> float:
    """A sample of agent ``a``'s ``/metrics`` (0 when absent)."""
    status, body = mesh.request(a, "GET", "/metrics")
    assert status == 200
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", re.M)
    for found_labels, value in pattern.findall(body.decode()):
        if ",".join(sorted(found_labels.split(","))) == want or (not want and not found_labels):
            return float(value)
    return 0.0


def job_out_of_reach(mesh: Mesh, intruder: Intruder) -> str:
    """A job id whose rendezvous order puts the intruder last: it may act as owner of none."""
    live = [a.node_id for a in mesh.agents]
    while True:
        job_id = new_job_id()
        if rank(job_id, live)[-1] == intruder.node_id:
            return job_id


def submit_sleeper(mesh: Mesh, intruder: Intruder) -> tuple[str, dict[str, Any]]:
    """An operator's long job, running, beyond the intruder's reach: its id and record."""
    job_id = job_out_of_reach(mesh, intruder)
    status, answer = mesh.command(
        mesh.agents[0], "submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)}
    )
    assert status == 200, answer
    mesh.wait("the job running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    return job_id, mesh.job(mesh.agents[0], job_id)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("attacks"), ["h100:1", "mi300x:1", "l4:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


@pytest.fixture(scope="module")
def intruder(mesh: Mesh) -> Intruder:
    return Intruder(mesh, 3)


def by_id(mesh: Mesh, node_id: str | None) -> AgentProcess:
    return next(a for a in mesh.agents if a.node_id == node_id)


def test_a_member_cannot_start_a_command_of_its_choice(mesh: Mesh, intruder: Intruder) -> None:
    victim = mesh.agents[1]
    before = metric(mesh, victim, "shoal_internal_refused_total", call="start")
    job_id = job_out_of_reach(mesh, intruder)
    marker = mesh.root / "pwned"
    evil = spec(["sh", "-c", f"touch {marker}"], gpus=0)
    offer = {"job_id": job_id, "attempt": 1, "devices": [], "owner": intruder.node_id}
    # The old wire form: a spec of the caller's making.
    assert intruder.call(victim, "start", dict(offer, spec=evil)) == 403
    # A submission the member signed itself.
    body = json.dumps({"job_id": job_id, "spec": evil}).encode()
    forged = envelope.seal(intruder.signer, "submit", body, time.time())
    sealed = base64.b64encode(forged).decode()
    assert intruder.call(victim, "start", dict(offer, submission=sealed)) == 403
    # An operator's genuine submission, shown by a member that may not own the job.
    genuine = base64.b64encode(mesh.seal("submit", {"job_id": job_id, "spec": evil})).decode()
    assert intruder.call(victim, "start", dict(offer, submission=genuine)) == 403
    time.sleep(1.0)
    assert not marker.exists()
    assert metric(mesh, victim, "shoal_internal_refused_total", call="start") == before + 3


def test_a_member_cannot_stop_an_operators_job(mesh: Mesh, intruder: Intruder) -> None:
    job_id, job = submit_sleeper(mesh, intruder)
    runner = by_id(mesh, job["runner"])
    before = metric(mesh, runner, "shoal_internal_refused_total", call="stop")
    stop = {"job_id": job_id, "attempt": job["attempt"], "cause": "cancel", "grace_s": 0}
    assert intruder.call(runner, "stop", stop) == 403
    # Nor fence its next attempts.
    assert intruder.call(runner, "stop", dict(stop, attempt=10**9)) == 403
    time.sleep(1.0)
    assert mesh.job(mesh.agents[0], job_id)["state"] == "running"
    assert metric(mesh, runner, "shoal_internal_refused_total", call="stop") == before + 2
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_a_member_cannot_make_an_agent_adopt_or_keep_a_job(mesh: Mesh, intruder: Intruder) -> None:
    victim = mesh.agents[0]
    marker = mesh.root / "adopted"
    job_id = new_job_id()
    record = {
        "job_id": job_id,
        "state": "pending",
        "attempt": 0,
        "owner": "0" * 32,
        "runner": None,
        "submitted_at": time.time(),
    }
    evil = spec(["sh", "-c", f"touch {marker}"], gpus=0)
    forged = envelope.seal(
        intruder.signer, "submit", json.dumps({"job_id": job_id, "spec": evil}).encode(), 0.0
    )
    body = {"record": record, "detail": {}, "submission": base64.b64encode(forged).decode()}
    for op in ("adopt", "replicate"):
        assert intruder.call(victim, op, body) in (400, 403)
    time.sleep(1.0)
    assert not marker.exists()
    assert job_id not in {j["job_id"] for j in mesh.get(victim, "/v1/jobs")["jobs"]}
    assert metric(mesh, victim, "shoal_internal_refused_total", call="adopt") >= 1


def test_a_members_job_records_are_not_believed(mesh: Mesh, intruder: Intruder) -> None:
    job_id, job = submit_sleeper(mesh, intruder)
    others = [a for a in mesh.agents if a is not intruder.agent]
    refused = "shoal_records_refused_total"
    before = {a.index: metric(mesh, a, refused, reason="not_an_owner") for a in others}
    # "Cancelled", at a generation far beyond the owner's, and naming the intruder as owner.
    lie = dict(job, state="cancelled", gen=10**9, owner=intruder.node_id)
    lie.pop("spec", None)
    # A job no operator submitted, "running" on the first agent.
    fake_id = new_job_id()
    fake = dict(lie, job_id=fake_id, state="running", runner=others[0].node_id)
    for a in others:
        assert intruder.gossip_record(a, "job/" + job_id, pack(lie)) in (200, 204)
        assert intruder.gossip_record(a, "job/" + fake_id, pack(fake)) in (200, 204)
    time.sleep(2.0)  # time for the lie to spread, were it believed
    for a in others:
        listed = {j["job_id"]: j for j in mesh.get(a, "/v1/jobs")["jobs"]}
        assert fake_id not in listed
        assert listed[job_id]["state"] == "running"
        assert listed[job_id]["owner"] == job["owner"]
        assert metric(mesh, a, refused, reason="not_an_owner") > before[a.index]
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_one_members_dead_message_kills_no_live_agent(mesh: Mesh, intruder: Intruder) -> None:
    job_id, job = submit_sleeper(mesh, intruder)
    victim = by_id(mesh, job["runner"])
    if victim is intruder.agent:  # the runner is the intruder's own agent: accuse another
        victim = next(a for a in mesh.agents if a not in (intruder.agent,))
    others = [a for a in mesh.agents if a not in (victim, intruder.agent)]
    for a in others:
        assert intruder.gossip_dead(a, victim.node_id) in (200, 204)
    deadline = time.monotonic() + 6.0  # beyond the suspicion's minimum timeout at N=4
    while time.monotonic() < deadline:
        for a in mesh.agents:
            nodes = {n["node_id"]: n["state"] for n in mesh.get(a, "/v1/nodes")["nodes"]}
            assert nodes[victim.node_id] in ("alive", "suspect"), (a.index, nodes)
        time.sleep(0.3)
    for a in others:
        assert metric(mesh, a, "shoal_gossip_dead_deferred_total") >= 1
    # Its job ran on, once: no requeue, no new attempt.
    now = mesh.job(mesh.agents[0], job_id)
    assert (now["state"], now["attempt"], now["runner"]) == (
        "running",
        job["attempt"],
        job["runner"],
    )
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_a_job_that_cannot_start_fails_with_its_launch_error(mesh: Mesh) -> None:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(["/no/such/program"], gpus=0)}
    assert mesh.command(mesh.agents[1], "submit", body)[0] == 200
    mesh.wait("the job failed", lambda: mesh.job(mesh.agents[2], job_id)["state"] == "failed")
    job = mesh.job(mesh.agents[2], job_id)
    assert "/no/such/program" in job["reason"] and "No such file" in job["reason"]
    assert job["attempt"] <= 3
    launch_failed = sum(
        metric(mesh, a, "shoal_placements_total", outcome="launch_failed") for a in mesh.agents
    )
    assert launch_failed >= 3


def test_plain_http_carries_no_authority(mesh: Mesh) -> None:
    # The demo once served plain HTTP on loopback, where a header named the caller's role.
    victim = mesh.agents[0]
    sealed = JobSpec(command=("true",))
    req = urllib.request.Request(
        f"http://{victim.address}/v1/commands",
        data=json.dumps({"spec": sealed.to_dict()}).encode(),
        method="POST",
        headers={"Shoal-Dev-Role": "operator", "Shoal-Dev-Node": "x" * 32},
    )
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(req, timeout=5)
    assert metric(mesh, victim, "shoal_gossip_transport_handshake_failed_total") >= 1


def test_a_captured_command_is_refused_after_the_agent_restarts(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1"])
    mesh.start_all()
    try:
        a = mesh.agents[0]
        job_id = new_job_id()
        sealed = mesh.seal("submit", {"job_id": job_id, "spec": spec(["true"], gpus=0)})
        assert mesh.command(a, "submit", {}, sealed=sealed)[0] == 200
        assert mesh.command(a, "cancel", {"job_id": job_id})[0] == 200
        mesh.terminate(0)
        mesh.start(0)
        status, answer = mesh.command(a, "submit", {}, sealed=sealed)
        assert status == 409 and "replayed" in answer["error"], answer
        assert metric(mesh, a, "shoal_commands_rejected_total", reason="replayed") == 1
    finally:
        mesh.stop_all()


# -- more lying members, outsiders and hostile specs ---------------------------------------------


def test_a_member_cannot_forge_another_members_records(mesh: Mesh, intruder: Intruder) -> None:
    victim, witness = mesh.agents[1], mesh.agents[2]
    before = metric(mesh, witness, "shoal_gossip_rejected_signature_total")
    drained = pack({"v": 2, "drain": "drained", "queue": 0, "running": []})
    assert intruder.gossip_record(witness, "node", drained, origin=victim.node_id) in (200, 204)
    time.sleep(1.0)
    nodes = {n["node_id"]: n for n in mesh.get(witness, "/v1/nodes")["nodes"]}
    assert nodes[victim.node_id]["drain"] == "schedulable"
    assert metric(mesh, witness, "shoal_gossip_rejected_signature_total") > before


def test_a_members_progress_for_a_job_it_does_not_run_is_not_shown(
    mesh: Mesh, intruder: Intruder
) -> None:
    # A job only agent 1 can run (the one ROCm GPU), beyond the intruder's reach.
    job_id = job_out_of_reach(mesh, intruder)
    rocm = Resources(gpus_per_node=1, backends=("rocm",))
    body = {"job_id": job_id, "spec": spec(SLEEPER, resources=rocm)}
    assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
    mesh.wait("the job running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    assert mesh.job(mesh.agents[0], job_id)["runner"] == mesh.agents[1].node_id
    lie = {"v": 2, "drain": "schedulable", "queue": 0, "running": [job_id]}
    lie["progress"] = {job_id: [0.99, 1.0]}
    for a in mesh.agents:
        if a is not intruder.agent:
            assert intruder.gossip_record(a, "node", pack(lie)) in (200, 204)
    time.sleep(1.0)
    for a in mesh.agents:
        if a is not intruder.agent:
            shown = mesh.job(a, job_id)
            assert shown["state"] == "running" and shown["progress"] != 0.99, shown
    # The member whose key was stolen hears the lie in its name and outruns it: every agent,
    # itself included, comes back to what it said (it runs no such job).
    mesh.wait(
        "the intruder's own agent outruns the lie",
        lambda: all(not runs_here(mesh, a, job_id, intruder.agent) for a in mesh.agents),
    )
    assert metric(mesh, intruder.agent, "shoal_gossip_records_refuted_total") >= 1
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_a_captured_command_replayed_to_every_other_agent_is_refused(mesh: Mesh) -> None:
    job_id = new_job_id()
    sealed = mesh.seal("submit", {"job_id": job_id, "spec": spec(["true"], gpus=0)})
    assert mesh.command(mesh.agents[0], "submit", {}, sealed=sealed)[0] == 200
    replayed = sum(
        metric(mesh, a, "shoal_commands_rejected_total", reason="replayed") for a in mesh.agents
    )
    for a in mesh.agents[1:]:
        status, answer = mesh.command(a, "submit", {}, sealed=sealed)
        assert status == 409 and "replayed" in answer["error"], (a.index, answer)
    after = sum(
        metric(mesh, a, "shoal_commands_rejected_total", reason="replayed") for a in mesh.agents
    )
    assert after >= replayed + len(mesh.agents) - 1
    mesh.wait("the job known", lambda: "attempts" in mesh.job(mesh.agents[0], job_id))
    attempts = mesh.job(mesh.agents[0], job_id)["attempts"]
    assert len(attempts) <= 1  # the job was not started again


def _tls(cafile: Path, cert: NodeIdentity | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cafile))
    context.check_hostname = False
    if cert is not None:
        context = client_context(cert, cert.ca_certificate)
    return context


def _refused_by_the_listener(a: AgentProcess, context: ssl.SSLContext, path: str) -> None:
    """Refused at the handshake, or before any route (an HTTPError is a URLError)."""
    req = urllib.request.Request(f"https://{a.address}{path}")
    with (
        pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)),
        urllib.request.urlopen(req, context=context, timeout=10) as resp,
    ):
        resp.read()


def test_an_outsider_an_expired_member_and_another_clusters_operator_are_refused(
    mesh: Mesh, tmp_path: Path
) -> None:
    victim = mesh.agents[0]
    job_id, _ = submit_sleeper(mesh, Intruder(mesh, 3))
    logs = f"/v1/jobs/{job_id}/logs"
    reasons = ("handshake_failed", "no_client_cert", "bad_cert")

    def refused() -> float:
        return sum(metric(mesh, victim, f"shoal_gossip_transport_{r}_total") for r in reasons)

    before = refused()
    # No certificate at all.
    _refused_by_the_listener(victim, _tls(mesh.cluster_dir / "ca.crt", None), logs)
    # A certificate of this cluster's CA, expired yesterday.
    ca = load_ca(mesh.cluster_dir)
    long_ago = datetime.now(UTC) - timedelta(days=3)
    expired = enroll_node(ca, tmp_path / "old", "operator", [], timedelta(days=1), long_ago)
    _refused_by_the_listener(victim, _tls(mesh.cluster_dir / "ca.crt", expired), logs)
    # Another cluster's operator asking for this cluster's job's log.
    other = init_cluster(tmp_path / "other", "other", "operator", datetime.now(UTC)).operator
    _refused_by_the_listener(victim, _tls(mesh.cluster_dir / "ca.crt", other), logs)
    assert refused() == before + 3
    # Nothing else disturbed: the job runs on, its own operator reads its log.
    assert mesh.job(victim, job_id)["state"] == "running"
    assert mesh.request(victim, "GET", logs)[0] == 200
    assert mesh.command(victim, "cancel", {"job_id": job_id})[0] == 200


def test_a_spec_that_reaches_outside_its_folder_is_refused_and_counted(mesh: Mesh) -> None:
    a = mesh.agents[0]
    before = metric(mesh, a, "shoal_commands_rejected_total", reason="bad_body")
    hostile = [
        {"workdir": "../../identity"},
        {"workdir": "/srv/jobs/../../etc"},
        {"checkpoint_dir": "checkpoints"},
        {"checkpoint_dir": "/tmp/../root/.ssh"},
        {"datasets": ["../../etc/passwd"]},
        {"datasets": ["/etc"]},
    ]
    ids = []
    for extra in hostile:
        job_id = new_job_id()
        ids.append(job_id)
        body = {"job_id": job_id, "spec": spec(["true"], gpus=0, **extra)}
        status, answer = mesh.command(a, "submit", body)
        assert status == 400, (extra, answer)
    assert metric(mesh, a, "shoal_commands_rejected_total", reason="bad_body") == before + len(
        hostile
    )
    listed = {j["job_id"] for j in mesh.get(a, "/v1/jobs")["jobs"]}
    assert not listed & set(ids)
    # A log request whose job id is a path reads no file.
    for job_id in ("..%2F..%2Fidentity%2Fnode.key", "..", "a" * 31 + "%00"):
        status, body = mesh.request(a, "GET", f"/v1/jobs/{job_id}/logs")
        assert status in (400, 404), (job_id, body)
        assert b"PRIVATE KEY" not in body


@pytest.mark.slow
def test_a_member_whose_messages_are_dear_to_handle_is_held_to_its_cpu_budget(
    tmp_path: Path,
) -> None:
    """Within its message rate, a member sends compounds of thousands of forged records, each
    a signature check (~0.1 ms) to refuse: a tenth of a core is all it gets (the first messages
    spend its half second of burst, the rest are answered 429 until it has paid its debt), and
    the agent goes on hearing everybody else."""
    mesh = Mesh(tmp_path, ["h100:1", "l4:1", "mi300x:1"])
    mesh.start_all()
    try:
        witness, victim = mesh.agents[0], mesh.agents[1]
        intruder = Intruder(mesh, 2)
        forged_before = metric(mesh, witness, "shoal_gossip_rejected_signature_total")
        statuses = [intruder.gossip_forgeries(witness, victim.node_id, 4000) for _ in range(8)]
        assert statuses[0] in (200, 204) and statuses[-1] == 429, statuses
        limited = metric(mesh, witness, "shoal_gossip_transport_cpu_limited_total")
        # at least each 429 (the intruder's own agent, whose identity it stole, streams under the
        # same name and is held back with it)
        assert limited >= statuses.count(429) >= 4
        checked = metric(mesh, witness, "shoal_gossip_rejected_signature_total") - forged_before
        assert checked == 4000 * (8 - statuses.count(429))  # each handled one checked in full
        nodes = {n["node_id"]: n for n in mesh.get(witness, "/v1/nodes")["nodes"]}
        assert nodes[victim.node_id]["drain"] == "schedulable"
        # A job neither owned nor run by the intruder's own agent, whose messages the witness
        # drops too while the identity they share is in debt.
        job_id = job_out_of_reach(mesh, intruder)
        cuda = Resources(gpus_per_node=1, backends=("cuda",))
        body = {"job_id": job_id, "spec": spec(["true"], resources=cuda)}
        assert mesh.command(witness, "submit", body)[0] == 200
        mesh.wait("the job done", lambda: mesh.job(witness, job_id)["state"] == "succeeded")
    finally:
        mesh.stop_all()


# -- a start needs the job's other owner's word (agent.running.confirming) -------------------------


def job_in_window(mesh: Mesh, intruder: Intruder, place: int) -> str:
    """A job id whose order puts the intruder at ``place`` (0: its owner, 1: beside it)."""
    live = [a.node_id for a in mesh.agents]
    while True:
        job_id = new_job_id()
        if rank(job_id, live)[place] == intruder.node_id:
            return job_id


def runs_here(mesh: Mesh, a: AgentProcess, job_id: str, of: AgentProcess | None = None) -> bool:
    """Whether agent ``a``'s own node record (or, as ``a`` holds it, agent ``of``'s) lists the
    job as running there."""
    nodes = {n["node_id"]: n for n in mesh.get(a, "/v1/nodes")["nodes"]}
    return job_id in (nodes[(of or a).node_id].get("running_jobs") or [])


def started_on(mesh: Mesh, a: AgentProcess, job_id: str) -> list[str]:
    """The ``running`` events agent ``a`` said of the job (one per attempt started there)."""
    return [
        e["message"]
        for e in mesh.events(a)
        if e["kind"] == "running" and e["job_id"] == job_id and e["node"] == a.node_id
    ]


def test_a_lone_members_second_start_is_refused_while_attempt_1_runs(
    mesh: Mesh, intruder: Intruder
) -> None:
    # The intruder is beside the job's owner in its order: it may act as the job's owner.
    job_id = job_in_window(mesh, intruder, 1)
    status, answer = mesh.command(
        mesh.agents[0], "submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)}
    )
    assert status == 200, answer
    mesh.wait("attempt 1 running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    job = mesh.job(mesh.agents[0], job_id)
    owner, first = by_id(mesh, job["owner"]), by_id(mesh, job["runner"])
    assert owner is not intruder.agent
    n = job["attempt"]  # 1, unless a runner declined an offer
    # An operator's submission of the job, as every member holds it (gossip's sub/<id>).
    sealed = mesh.seal("submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)})
    targets = [a for a in mesh.agents if a is not intruder.agent]
    before = {
        a.index: (
            metric(mesh, a, "shoal_internal_refused_total", call="start"),
            metric(mesh, a, "shoal_start_confirmations_total", outcome="refused"),
        )
        for a in targets
    }
    for a in targets:
        # Even with its own copy of the job written ahead to the owner first, as an owner would.
        forged = {
            "record": dict(job, attempt=n + 1, state="placing", runner=a.node_id, gen=10**6),
            "detail": {"gen": 10**6},
            "submission": base64.b64encode(sealed).decode(),
        }
        forged["record"]["owner"] = intruder.node_id
        assert intruder.call(owner, "replicate", forged) in (200, 403)
        offer = {
            "job_id": job_id,
            "attempt": n + 1,
            "owner": intruder.node_id,
            "devices": [],
            "submission": base64.b64encode(sealed).decode(),
        }
        assert intruder.call(a, "start", offer) == 403, a.index
    time.sleep(1.5)  # time for a second copy to start and be gossiped, were it started
    for a in targets:
        refused, unconfirmed = before[a.index]
        assert metric(mesh, a, "shoal_internal_refused_total", call="start") == refused + 1
        assert metric(mesh, a, "shoal_start_confirmations_total", outcome="refused") == (
            unconfirmed + 1
        )
        assert not any(f"attempt {n + 1} " in m for m in started_on(mesh, a, job_id)), a.index
    # Attempt 1 ran on, where it was, alone.
    now = mesh.job(mesh.agents[0], job_id)
    assert (now["state"], now["attempt"], now["runner"]) == ("running", n, first.node_id)
    assert now["attempts"] == job["attempts"]
    # as each node's own record says (under load, a record may be a tick behind its runs)
    mesh.wait(
        "attempt 1 listed by its runner alone",
        lambda: [a.index for a in mesh.agents if runs_here(mesh, a, job_id)] == [first.index],
        30.0,
    )
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_a_newer_attempt_confirmed_elsewhere_fences_the_older_copy_at_once(
    mesh: Mesh, intruder: Intruder
) -> None:
    """The intruder holds the key of the job's very owner: it may place the job, so the job's
    other owner confirms the attempt it writes ahead; the attempt that ran until then is
    fenced as the newer one is confirmed, so the two never run on together."""
    job_id = job_in_window(mesh, intruder, 0)
    body = {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)}
    assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
    mesh.wait("attempt 1 running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    job = mesh.job(mesh.agents[0], job_id)
    first = by_id(mesh, job["runner"])
    live = [a.node_id for a in mesh.agents]
    other = by_id(mesh, rank(job_id, live)[1])
    mesh.wait("attempt 1 listed by its runner", lambda: runs_here(mesh, first, job_id))
    second = next(a for a in mesh.agents if a not in (first, intruder.agent))
    n = job["attempt"]  # 1, unless a runner declined an offer
    before = metric(mesh, other, "shoal_start_confirmations_total", outcome="fenced")
    sealed = mesh.seal("submit", body)
    took = mesh.write_ahead(intruder.agent.index, job_id, sealed, n + 1, second.node_id, gen=10**6)
    assert took is other
    offer = {
        "job_id": job_id,
        "attempt": n + 1,
        "owner": intruder.node_id,
        "devices": [],
        "submission": base64.b64encode(sealed).decode(),
    }
    try:
        assert intruder.call(second, "start", offer) == 200
        # Attempt 2 was confirmed and started on the second runner; what the job's own owner
        # process does with it afterwards (it placed no such attempt) is not this test's.
        assert metric(mesh, second, "shoal_start_confirmations_total", outcome="confirmed") >= 1
        mesh.wait(
            "attempt 1 fenced on its runner",
            lambda: not runs_here(mesh, first, job_id),
            deadline_s=30.0,  # the stop and its report, on a busy 2-core machine
        )
        exits = [
            e["message"]
            for e in mesh.events(first)
            if e["kind"] == "exited" and e["job_id"] == job_id and e["node"] == first.node_id
        ]
        assert any(m.startswith(f"attempt {n} fenced") for m in exits), exits
        assert metric(mesh, other, "shoal_start_confirmations_total", outcome="fenced") == (
            before + 1
        )
    finally:
        stop = {"job_id": job_id, "attempt": n + 1, "cause": "cancel", "grace_s": 0}
        intruder.call(second, "stop", stop)
        mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})


def test_an_older_copy_the_other_owner_forgot_is_fenced_through_its_runners_record(
    tmp_path: Path,
) -> None:
    """As above, but the job's other owner restarted since it confirmed attempt 1, so it
    remembers nothing of it: the runner's own record, which lists the job, gets it fenced."""
    mesh = Mesh(tmp_path, ["h100:1", "l4:1", "h100:1"])
    mesh.start_all()
    try:
        intruder, a = Intruder(mesh, 2), mesh.agents[0]
        live = [x.node_id for x in mesh.agents]
        for _ in range(8):  # a job that runs elsewhere than on its other owner
            job_id = job_in_window(mesh, intruder, 0)
            body = {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)}
            assert mesh.command(a, "submit", body)[0] == 200
            mesh.wait("attempt 1 running", lambda j=job_id: mesh.job(a, j)["state"] == "running")
            job, other = mesh.job(a, job_id), by_id(mesh, rank(job_id, live)[1])
            if job["runner"] != other.node_id:
                break
            assert mesh.command(a, "cancel", {"job_id": job_id})[0] == 200
        first, n = by_id(mesh, job["runner"]), job["attempt"]
        assert first is not other
        mesh.terminate(other.index)
        mesh.start(other.index)
        mesh.wait_converged()

        def listed_by_other() -> bool:
            nodes = {x["node_id"]: x for x in mesh.get(other, "/v1/nodes")["nodes"]}
            return job_id in (nodes[first.node_id].get("running_jobs") or [])

        mesh.wait("the restarted other owner hearing where attempt 1 runs", listed_by_other)
        second = next(x for x in mesh.agents if x not in (first, intruder.agent))
        sealed = mesh.seal("submit", body)
        took = mesh.write_ahead(
            intruder.agent.index, job_id, sealed, n + 1, second.node_id, gen=10**6
        )
        assert took is other
        offer = {
            "job_id": job_id,
            "attempt": n + 1,
            "owner": intruder.node_id,
            "devices": [],
            "submission": base64.b64encode(sealed).decode(),
        }
        assert intruder.call(second, "start", offer) == 200
        # Attempt 2 was confirmed and started on the second runner; what the job's own owner
        # process does with it afterwards (it placed no such attempt) is not this test's.
        assert metric(mesh, second, "shoal_start_confirmations_total", outcome="confirmed") >= 1
        mesh.wait(
            "attempt 1 fenced on its runner",
            lambda: not runs_here(mesh, first, job_id),
            deadline_s=30.0,  # the stop and its report, on a busy 2-core machine
        )
        assert metric(mesh, other, "shoal_start_confirmations_total", outcome="fenced") == 1
    finally:
        mesh.stop_all()


def test_one_members_preempting_offers_start_no_attempt_on_several_runners(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("preempt_min_run_s = 0.5\n")
    mesh = Mesh(tmp_path, ["h100:1"] * 4, extra=("--config", str(config)))
    mesh.start_all()
    try:
        intruder = Intruder(mesh, 3)
        a = mesh.agents[0]
        # A high-priority job beside which the intruder stands in the order, running ...
        job_id = job_in_window(mesh, intruder, 1)
        high = {"job_id": job_id, "spec": spec(SLEEPER, gpus=1, priority=100)}
        assert mesh.command(a, "submit", high)[0] == 200
        mesh.wait("the high job running", lambda: mesh.job(a, job_id)["state"] == "running")
        # ... and preemptible low-priority ones on every other GPU, past their minimum run time.
        low = []
        for _ in range(3):
            low_id = new_job_id()
            body = {"job_id": low_id, "spec": spec(SLEEPER, gpus=1, preemptible=True)}
            assert mesh.command(a, "submit", body)[0] == 200
            low.append(low_id)
        mesh.wait(
            "the low jobs running", lambda: all(mesh.job(a, j)["state"] == "running" for j in low)
        )
        time.sleep(1.0)
        sealed = base64.b64encode(mesh.seal("submit", high)).decode()
        victims = {j: mesh.job(a, j) for j in low}
        placed = mesh.job(a, job_id)
        asked = [
            (by_id(mesh, doc["runner"]), j, doc)
            for j, doc in victims.items()
            if doc["runner"] != intruder.node_id
        ]
        assert len(asked) >= 2
        for runner, victim, doc in asked:
            offer = {
                "job_id": job_id,
                "attempt": 5,
                "owner": intruder.node_id,
                "devices": doc["devices"],
                "submission": sealed,
                "victims": [victim],
            }
            assert intruder.call(runner, "start", offer) == 403, runner.index
        time.sleep(1.5)
        for runner, victim, _ in asked:
            assert runs_here(mesh, runner, victim) and not runs_here(mesh, runner, job_id)
            assert metric(mesh, runner, "shoal_preemptions_total", outcome="preempted") == 0
            assert not any("attempt 5" in m for m in started_on(mesh, runner, job_id))
        for j, doc in victims.items():  # not preempted, not requeued
            was = (doc["state"], doc["attempt"], doc["runner"])
            now = mesh.job(a, j)
            assert (now["state"], now["attempt"], now["runner"]) == was, j
        now = mesh.job(a, job_id)
        assert (now["state"], now["attempt"]) == ("running", placed["attempt"])
        assert [x.index for x in mesh.agents if runs_here(mesh, x, job_id)] == [
            mesh.node_index(now["runner"])
        ]
    finally:
        mesh.stop_all()
