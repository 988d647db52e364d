"""Bottleneck hints on the jobs a node runs, each told once: as an event, and on the job.

The agent judges its GPUs' hints (:func:`agent.history.history_hints.node_hints`) every
``hints_every_s`` (its config; :data:`EVERY_S` unless set) over the last ``hints_window_s``;
:class:`HintNotices` says which are news for the job that holds the GPU: a rule on a device of a
job is told once, and again only after it stopped firing for :data:`REARM_S`. A host's hint
(``host_memory_pressure``, subject ``host``) is told to every job the node runs. Jobs that no
longer run here are forgotten. Sans-I/O: ``now_s`` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agent.history.history_hints import Hint

EVERY_S: Final = 60.0
"""How often the agent judges its GPUs' hints for the jobs on them, by default (the agent
config's ``hints_every_s``)."""
REARM_S: Final = 600.0
"""A hint that stopped firing this long ago is told again when it fires again."""
HOST: Final = "host"


@dataclass(frozen=True, slots=True)
class Notice:
    job_id: str
    device: str
    """The GPU's key, or ``host``."""
    rule: str
    evidence: str

    def line(self) -> str:
        """``input_bound on sim:ab12:0: GPU 31% busy while the host's CPU ...``."""
        return f"{self.rule} on {self.device}: {self.evidence}"


@dataclass(slots=True)
class HintNotices:
    rearm_s: float = REARM_S
    _fired_at: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(job, device, rule) -> when it last fired."""

    def update(
        self, fired: Sequence[tuple[str, Hint]], holders: Mapping[str, str | None], now_s: float
    ) -> list[Notice]:
        """The hints that fired now (``fired``: device -> hint, ``holders``: each GPU's job, or
        ``None``) that are news for their job."""
        jobs = sorted({j for j in holders.values() if j is not None})
        out: list[Notice] = []
        for device, hint in fired:
            if hint.unjudged:
                continue
            for job in jobs if device == HOST else [holders.get(device)]:
                if job is None:
                    continue  # a GPU no job holds: the node's history says so, no job to tell
                key = (job, device, hint.rule)
                last = self._fired_at.get(key)
                if last is None or now_s - last > self.rearm_s:
                    out.append(Notice(job, device, hint.rule, hint.evidence))
                self._fired_at[key] = now_s
        running = set(jobs)
        for key in [k for k in self._fired_at if k[0] not in running]:
            del self._fired_at[key]
        return out
