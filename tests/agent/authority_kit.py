"""What the owner and runner tests need of the authority model: a cluster, an operator's sealed
submissions, agent identities, an ``Authority`` over a chosen view of live agents, membership
as the test sets it, and the copy of a job an owner writes ahead to the job's other owner."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.job.authority import Authority
from agent.job.jobspec import JobSpec
from agent.job.jobstate import JobState
from agent.storage.store import JobRecord, Store
from agent.wire.calls import OwnerDetail
from agent.wire.records import GangMember
from gossip import envelope
from gossip.certtrust import CertSigner, CertTrust
from gossip.identity import ClusterIdentity, NodeIdentity, enroll_node, init_cluster


class Kit:
    """A throwaway cluster under ``root``: its operator signs, its CA enrolls agents."""

    def __init__(self, root: Path) -> None:
        now = datetime.now(UTC)
        self.root = root
        self.cluster: ClusterIdentity = init_cluster(root / "cluster", "test", "operator", now)
        self.operator = CertSigner(self.cluster.operator)

    def agent(self, name: str) -> NodeIdentity:
        return enroll_node(
            self.cluster.ca,
            self.root / name,
            "agent",
            ["127.0.0.1"],
            timedelta(days=1),
            datetime.now(UTC),
        )

    def submission(self, job_id: str, spec: JobSpec, *, signer: CertSigner | None = None) -> bytes:
        """The sealed ``submit`` command an operator (or ``signer``) would send for the job."""
        body = json.dumps({"job_id": job_id, "spec": spec.to_dict()}).encode()
        return envelope.seal(signer or self.operator, "submit", body, time.time())

    def trust(self, *known: NodeIdentity) -> CertTrust:
        """The CA's trust, with ``known`` agents admitted (as TLS or gossip would admit them)."""
        trust = CertTrust(self.cluster.ca.certificate)
        for node in known:
            trust.admit(node.node_id, node.certificate_der, time.time())
        return trust

    def authority(
        self,
        me: str,
        live: Callable[[], list[str]],
        *known: NodeIdentity,
        live_for_s: Callable[[str], float] = lambda node: 0.0,
    ) -> Authority:
        return Authority(me, self.trust(*known), live, live_for_s, time.time)


@dataclass
class FakeMesh:
    """Membership as the test sets it: these agents live, at these addresses."""

    live: Callable[[], list[str]]
    addrs: Callable[[str], str | None]
    gone: set[str] = field(default_factory=set)

    def live_agents(self) -> list[str]:
        return self.live()

    def addr_of(self, node_id: str) -> str | None:
        return self.addrs(node_id)

    def is_gone(self, node_id: str) -> bool:
        return node_id in self.gone


def write_ahead(
    store: Store,
    job_id: str,
    spec: JobSpec,
    sealed: bytes,
    *,
    attempt: int,
    owner: str,
    runner: str,
    members: Sequence[GangMember] = (),
) -> None:
    """Keep in ``store`` the copy an owner writes to the job's other owner before it offers an
    attempt: ``attempt`` placed on ``runner`` (or on a gang's ``members``), by ``owner``."""
    detail = OwnerDetail(devices=(), members=tuple(members), gen=attempt)
    store.put_job(
        JobRecord(
            job_id=job_id,
            spec=spec,
            state=JobState.PLACING,
            attempt=attempt,
            owner=owner,
            runner=runner,
            submitted_at=time.time(),
            updated_at=time.time(),
            detail=detail.to_wire(),
            submission=sealed,
        )
    )
