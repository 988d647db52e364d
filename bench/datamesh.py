"""The data benchmark's agents and data: a local mesh whose agents run in a lab's namespaces,
datasets of seeded bytes, and their layout in the holders' datasets folders."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from agent.operator.client import ApiClient
from agent.sandbox.localmesh import AgentProcess, LocalMesh
from bench.netlab import Lab
from gossip.identity import enroll_node, init_cluster
from gossip.tls import client_context

AGENT_PORT: Final = 7400
PROFILE: Final = "l4:1"
"""One GPU per host: a job holds its host, and the next waits for the slot."""
CORRUPT_ENV: Final = "SHOAL_TEST_CORRUPT_CHUNKS"
"""The agents' test hook: an agent started with it set serves corrupt chunks."""
BLOCK_BYTES: Final = 4 << 20
_SAMPLE: Final = re.compile(r'(?P<family>\w+)\{what="(?P<what>[^"]*)"\} (?P<value>\S+)')


@dataclass
class DataMesh(LocalMesh):
    """A :class:`LocalMesh` whose agent i runs in the lab's host i, at that host's address;
    the agents of ``corrupt`` serve corrupt chunks; with ``prefetch`` off, each refuses every
    pre-fetch."""

    lab: Lab | None = None
    config_text: str = ""
    corrupt: Sequence[int] = ()
    prefetch: bool = True
    """``False``: the agents run with ``--no-prefetch`` (every pre-fetch refused)."""
    _clients: dict[int, ApiClient] = field(default_factory=dict, repr=False)

    def create(self) -> None:
        assert self.lab is not None
        now = datetime.now(UTC)
        cluster = init_cluster(self.root / "cluster", "shoal-data", "operator", now)
        self.operator = cluster.operator
        for i in range(self.nodes):
            directory = self.root / f"agent-{i:02d}"
            address = self.lab.address(i)
            identity = enroll_node(
                cluster.ca, directory / "identity", "agent", [address], timedelta(days=1), now
            )
            agent = AgentProcess(i, directory, f"{address}:{AGENT_PORT}", PROFILE, identity.node_id)
            self.agents.append(agent)
            if self.config_text:
                agent.config_path.write_text(self.config_text)

    def command(self, agent: AgentProcess) -> list[str]:
        assert self.lab is not None
        argv = super().command(agent)
        if not self.prefetch:
            argv.append("--no-prefetch")
        if self.config_text and self.placement is None:
            argv += ["--config", str(agent.config_path)]
        return self.lab.command(agent.index, argv)

    def env(self, agent: AgentProcess) -> dict[str, str]:
        extra = {CORRUPT_ENV: "1"} if agent.index in self.corrupt else {}
        return {**super().env(agent), **extra}

    def client_of(self, agent: AgentProcess) -> ApiClient:
        """One client per agent, kept (:meth:`close_clients` closes them)."""
        client = self._clients.get(agent.index)
        if client is None:
            client = self._clients[agent.index] = self.client(agent.index)
        return client

    def counters(self, family: str) -> Counter[str]:
        """Prometheus counter ``family`` summed over every running agent, by its ``what``
        label (read from each agent's ``/metrics``, as the operator)."""
        assert self.operator is not None
        context = client_context(self.operator, self.operator.ca_certificate)
        total: Counter[str] = Counter()
        for agent in self.agents:
            if not agent.running:
                continue
            try:
                with urllib.request.urlopen(
                    f"https://{agent.address}/metrics", context=context, timeout=10
                ) as answer:
                    text = answer.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                if (m := _SAMPLE.fullmatch(line)) and m["family"] == family:
                    total[m["what"]] += int(float(m["value"]))
        return total

    async def close_clients(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()


def write_dataset(folder: Path, seed: str, file_bytes: Iterable[int]) -> dict[str, str]:
    """Files ``part-NN.bin`` of seeded bytes under ``folder``; each one's SHA-256."""
    rng = random.Random(seed)
    files = {}
    folder.mkdir(parents=True, exist_ok=True)
    for k, size in enumerate(file_bytes):
        path = f"part-{k:02d}.bin"
        h = hashlib.sha256()
        with (folder / path).open("wb") as out:
            left = size
            while left > 0:
                block = rng.randbytes(min(left, BLOCK_BYTES))
                h.update(block)
                out.write(block)
                left -= len(block)
        (folder / path).chmod(0o644)
        files[path] = h.hexdigest()
    folder.chmod(0o755)
    return files


def lay_out(data: Path, folder: Path, names: Iterable[str]) -> None:
    """Hard links of datasets ``names`` from ``data`` under ``folder`` (one entry each)."""
    for name in names:
        for source in sorted((data / name).iterdir()):
            target = folder / name / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)
        (folder / name).chmod(0o755)


def write_plan(path: Path, datasets: Mapping[str, object]) -> Path:
    """The jobs' plan (``bench/datajob.py``): ``datasets`` is each dataset's files and sources."""
    path.write_text(json.dumps({"datasets": datasets}))
    path.chmod(0o644)
    return path
