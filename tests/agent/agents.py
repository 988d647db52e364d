"""Start N real agent processes on loopback with a throwaway cluster, and talk to them.

``Mesh`` makes a cluster (CA + operator identity) in a temporary folder, enrolls one agent
identity per node, starts ``python -m agent.cli agent`` for each (simulated GPUs, loopback, mutual
TLS), and waits until every agent sees every other. Commands are sealed with the operator's key
and sent over mutual TLS with its certificate, as the CLI does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gossip import envelope
from gossip.certtrust import CertSigner
from gossip.identity import ClusterIdentity, enroll_node, init_cluster
from gossip.tls import client_context

DEADLINE_S = 30.0


@dataclass
class AgentProc:
    index: int
    data_dir: Path
    sim: str
    process: subprocess.Popen[str] | None = None
    node_id: str = ""
    addr: str = ""
    log_path: Path = field(default_factory=Path)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Mesh:
    def __init__(self, root: Path, sims: Sequence[str], *, extra: Sequence[str] = ()) -> None:
        self.root = root
        now = datetime.now(UTC)
        self.cluster: ClusterIdentity = init_cluster(root / "cluster", "test", "operator", now)
        self.agents: list[AgentProc] = []
        self.extra = list(extra)
        for i, sim in enumerate(sims):
            data_dir = root / f"agent{i}"
            enroll_node(
                self.cluster.ca,
                data_dir / "identity",
                "agent",
                ["localhost", "127.0.0.1"],
                timedelta(days=1),
                now,
            )
            self.agents.append(AgentProc(i, data_dir, sim, log_path=root / f"agent{i}.log"))
        op = self.cluster.operator
        self._ssl = client_context(op, op.ca_certificate)
        self.signer = CertSigner(op)

    # -- processes -------------------------------------------------------------------------------

    def start(self, i: int, join: Sequence[str] = ()) -> AgentProc:
        a = self.agents[i]
        argv = [
            sys.executable,
            "-m",
            "agent.cli",
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(a.data_dir),
            "--sim",
            a.sim,
            "--sim-seed",
            str(i),
            "--log-level",
            "INFO",
            *self.extra,
        ]
        for seed in join:
            argv += ["--join", seed]
        log = a.log_path.open("a")
        a.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        assert a.process.stdout is not None
        line = a.process.stdout.readline()
        if not line:
            raise AssertionError(f"agent {i} did not start:\n{a.log_path.read_text()[-3000:]}")
        doc = json.loads(line)
        a.node_id, a.addr = doc["node"], doc["addr"]
        return a

    def start_all(self) -> None:
        first = self.start(0)
        for i in range(1, len(self.agents)):
            self.start(i, [first.addr])
        self.wait_converged()

    def wait_converged(self, deadline_s: float = DEADLINE_S) -> None:
        n = sum(1 for a in self.agents if a.alive)
        self.wait(
            f"{n} agents see each other",
            lambda: all(self.get(a, "/healthz")["members"] == n for a in self.agents if a.alive),
            deadline_s,
        )
        # Every inventory has arrived everywhere.
        self.wait(
            "inventories everywhere",
            lambda: all(
                sum(1 for node in self.get(a, "/v1/nodes")["nodes"] if node["devices"]) >= n
                for a in self.agents
                if a.alive
            ),
            deadline_s,
        )

    def kill(self, i: int) -> None:
        a = self.agents[i]
        assert a.process is not None
        a.process.send_signal(signal.SIGKILL)
        a.process.wait(timeout=10)

    def terminate(self, i: int) -> None:
        a = self.agents[i]
        assert a.process is not None
        a.process.send_signal(signal.SIGTERM)
        a.process.wait(timeout=30)

    def stop_all(self) -> None:
        for a in self.agents:
            if a.alive:
                assert a.process is not None
                a.process.send_signal(signal.SIGTERM)
        for a in self.agents:
            if a.process is not None:
                try:
                    a.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    a.process.kill()
                    a.process.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            f"--- agent {a.index} {a.node_id[:8]}\n{a.log_path.read_text()[-4000:]}"
            for a in self.agents
            if a.log_path.exists()
        )

    # -- HTTP ------------------------------------------------------------------------------------

    def request(
        self,
        a: AgentProc,
        method: str,
        path: str,
        data: bytes | None = None,
        content_type: str = "application/json",
        timeout_s: float = 15.0,
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(f"https://{a.addr}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get(self, a: AgentProc, path: str) -> Any:
        status, body = self.request(a, "GET", path)
        assert status == 200, (status, body)
        return json.loads(body)

    def seal(self, kind: str, body: dict[str, Any], *, now: float | None = None) -> bytes:
        payload = json.dumps(body).encode()
        return envelope.seal(self.signer, kind, payload, time.time() if now is None else now)

    def command(
        self, a: AgentProc, kind: str, body: dict[str, Any], *, sealed: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        data = sealed if sealed is not None else self.seal(kind, body)
        status, raw = self.request(
            a, "POST", "/v1/commands", data, "application/octet-stream", timeout_s=30
        )
        return status, json.loads(raw)

    def job(self, a: AgentProc, job_id: str) -> dict[str, Any]:
        status, body = self.request(a, "GET", f"/v1/jobs/{job_id}")
        return json.loads(body) if status == 200 else {"state": None, "status": status}

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


def spec(argv: Sequence[str], *, gpus: int = 1, **extra: Any) -> dict[str, Any]:
    """A job spec's wire form with defaults for everything else."""
    from agent.jobspec import JobSpec, Resources

    resources = extra.pop("resources", None) or Resources(gpus_per_node=gpus)
    return JobSpec(command=tuple(argv), resources=resources, **extra).to_dict()
