"""People on a real mesh: a person's identity (their key, a certificate the cluster's CA issued),
their sealed commands and reads over mutual TLS, and the team policy an admin signs.

The mesh's operator (``tests.agent.agents.Mesh``) is the first admin, as ``shoal init`` makes it.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from agent.sandbox.localmesh import AgentProcess
from agent.wire.policy import Person, PolicyBody, Quota, SignedPolicy, Team, sign_policy
from gossip import envelope
from gossip.certtrust import CertSigner
from gossip.identity import NodeIdentity, enroll_node, load_ca
from gossip.tls import client_context
from tests.agent.agents import Mesh

REFUSED = 0
"""What :meth:`PersonAt.request` answers when the TLS handshake itself is refused."""


class PersonAt:
    """A person of ``mesh``: their own key and a certificate of ``cert_role``."""

    def __init__(
        self, mesh: Mesh, name: str, cert_role: Literal["operator", "user"] = "user"
    ) -> None:
        self.mesh = mesh
        self.name = name
        self.identity: NodeIdentity = enroll_node(
            load_ca(mesh.cluster_dir),
            mesh.root / "people" / name,
            cert_role,
            [name],
            timedelta(days=1),
            datetime.now(UTC),
        )
        self.signer = CertSigner(self.identity)
        self._ssl: ssl.SSLContext = client_context(self.identity, self.identity.ca_certificate)

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    def request(
        self, a: AgentProcess, method: str, path: str, data: bytes | None = None
    ) -> tuple[int, bytes]:
        """Over mutual TLS as this person; :data:`REFUSED` when the handshake is refused."""
        req = urllib.request.Request(f"https://{a.address}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            with exc:  # its response holds the socket: closed here, not whenever it is collected
                return exc.code, exc.read()
        except (urllib.error.URLError, ssl.SSLError, ConnectionError):
            return REFUSED, b""

    def command(self, a: AgentProcess, kind: str, body: dict[str, Any]) -> tuple[int, str]:
        """A command this person signs, sent to ``a``: the status and the error, if any."""
        sealed = envelope.seal(self.signer, kind, json.dumps(body).encode(), time.time())
        status, raw = self.request(a, "POST", "/v1/commands", sealed)
        if status == REFUSED:
            return status, "the TLS handshake was refused"
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:  # a revoked peer is shown the revocation list (msgpack), not JSON
            return status, "refused (not JSON)"
        return status, str(answer.get("error", ""))


def body(version: int, *people: Person, ceilings: dict[str, int] | None = None) -> PolicyBody:
    """A policy of ``people``, each team listed (``vision``: ceiling 5 and a quota)."""
    teams = []
    for team in dict.fromkeys(p.team for p in people):
        if team == "vision":
            teams.append(Team("vision", 5, (Quota("any", 1, 2), Quota("H100", 1, 1))))
        else:
            teams.append(Team(team, None))
    return PolicyBody(
        version=version,
        issued_at=time.time(),
        teams=tuple(teams),
        users=people,
        ceilings=ceilings or {},
    )


def signed_by(signer: NodeIdentity, policy: PolicyBody) -> SignedPolicy:
    return sign_policy(policy, CertSigner(signer))


def policy_command(record: SignedPolicy | bytes) -> dict[str, Any]:
    data = record if isinstance(record, bytes) else record.encode()
    return {"policy": base64.b64encode(data).decode()}


def held_version(mesh: Mesh, a: AgentProcess) -> int:
    return int(mesh.get(a, "/v1/policy")["version"])
