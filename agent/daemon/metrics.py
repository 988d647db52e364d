"""Prometheus ``/metrics`` for one agent (``prometheus_client``, one registry per agent).

Gauges are computed at scrape time from what the agent holds: this node's devices
(``shoal_gpu_util_pct``, ``shoal_gpu_mem_used_bytes``, ``shoal_gpu_mem_total_bytes``,
``shoal_gpu_temp_c``, ``shoal_gpu_power_watts``, labelled ``node`` and ``device``), jobs by state
as this agent sees the mesh (``shoal_jobs``), members by state, jobs running here, and every
gossip counter (``shoal_gossip_<name>_total``). Counters: commands accepted by kind and rejected by
reason (``shoal_commands_accepted_total``, ``shoal_commands_rejected_total``), agent calls
refused for want of authority (``shoal_internal_refused_total``), commands and log reads the
team policy's rules refused (``shoal_refused_total{why}``), policy records not believed
(``shoal_policy_refused_total{reason}``), gossip records refused or not
believed, by reason and by kind (``shoal_records_refused_total``,
``shoal_records_refused_kinds_total``), API requests refused by route and status
(``shoal_api_refused_total``), the offers this agent made as an owner, by outcome
(``shoal_placements_total``; ``rebound`` counts those of the ``started`` that the runner started
on other devices of the same models, the offered ones being taken meanwhile), jobs it owns
whose deadline passed before they ended
(``shoal_deadline_misses_total``, ``agent.job.deadlines``), preemptions on this runner, by outcome
(``preempted``: a job stopped for one of higher priority, ``shrunk``: an elastic job
restarted with fewer GPUs for another, ``moved``: a job moved off for a start its team's
guarantee is owed, ``refused``: a preempting offer refused:
``shoal_preemptions_total``), team quota checks of starts (``agent.running.teamdesk``:
``shoal_quota_total``), starts confirmed by a job's other owner (``agent.running.confirming``:
``shoal_start_confirmations_total``), and checkpoints by what happened (``read`` into the store,
``pulled``, ``handed`` on, ``fetched``, ``resumed``, ``failed``, ``refused``, ``refused_not_owner``:
``shoal_checkpoint_total``), the content transfer by what happened and the bytes fetched by
source kind (``shoal_content_total``, ``shoal_content_fetched_bytes_total{source=peer|http|s3}``,
``agent.content.fetch``), entries of the datasets folder refused, by reason (``name``,
``link_out``: ``shoal_datasets_refused_total``, ``agent.daemon.datasets``), and errors in one job's
step of a loop over many, by step, the loop having gone on (``shoal_job_step_errors_total``,
``agent.common.eachjob``). The content store (``agent.content.store``): chunks it had and did
not have when asked (``shoal_store_hits_total``, ``shoal_store_misses_total``), manifests evicted
(``shoal_store_evictions_total``), chunks refused on arrival and found rotten when read
(``shoal_store_refused_chunks_total``, ``shoal_store_corrupt_total``), the bytes it keeps and
may keep (``shoal_store_held_bytes``, ``shoal_store_budget_bytes``), and datasets that could not
be indexed (``shoal_datasets_unindexed_total``). Jobs' datasets (``agent.running.datastage``):
hits, misses, failed stagings and pre-fetches by outcome (``shoal_job_data_total``), each job's
wait for its data (the histogram ``shoal_job_data_wait_seconds``); the pre-fetches this agent
asked as an owner (``shoal_prefetch_total``, ``agent.owning.prefetching``).

The counters are plain ``collections.Counter`` objects and everything is turned into Prometheus
families at scrape time, so ``prometheus_client`` (and the HTTP server modules it brings, ~1 MB
of an agent's memory) loads on the first scrape, not in an agent nobody scrapes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from probers.records import Device

if TYPE_CHECKING:
    from prometheus_client.core import Metric


GOSSIP_GAUGES = frozenset(
    {"transport_handshake_slowest_ms", "records_held", "records_tombstones", "streams_open"}
)
"""The gossip figures that are levels; all others are counts since the agent started."""


class _Snapshot:
    """A ``prometheus_client`` collector of the agent's snapshot and command counters."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        refused = CounterMetricFamily(
            "shoal_api_refused",
            "API requests answered 400 or more",
            labels=["route", "status"],
        )
        for (route, status), count in sorted(self._metrics.api_refused.items()):
            refused.add_metric([route, status], count)
        yield refused
        snap = self._metrics.snapshot()
        m = self._metrics
        for name, text, label, counts in (
            ("commands_accepted", "Operator commands accepted", "kind", m.commands_accepted),
            ("commands_rejected", "Operator commands rejected", "reason", m.commands_rejected),
            ("refused", "Commands and reads refused by the team policy's rules", "why", m.refused),
            (
                "policy_refused",
                "Team policy records not believed, by reason",
                "reason",
                snap.get("policy_refused", {}),
            ),
            (
                "internal_refused",
                "Agent calls refused for want of authority",
                "call",
                m.internal_refused,
            ),
            ("placements", "Offers of jobs to runners, by outcome", "outcome", snap["placements"]),
            (
                "preemptions",
                "Preempting offers on this runner: victims stopped (preempted), offers refused",
                "outcome",
                snap.get("preemptions", {}),
            ),
            (
                "gang_holds",
                "Gang holds on this runner: held, committed, aborted, expired, refused (budget)",
                "outcome",
                snap.get("gang_holds", {}),
            ),
            (
                "quota",
                "Team quota checks of starts: refused here for a maximum, and, as a team's"
                " quota desk, granted and denied; unanswered: the desk did not answer",
                "outcome",
                snap.get("quota", {}),
            ),
            (
                "start_confirmations",
                "Starts confirmed by a job's other owner: asked (confirmed, refused, unanswered),"
                " answered (given, denied) and older copies fenced",
                "outcome",
                snap.get("start_confirmations", {}),
            ),
            (
                "checkpoint",
                "Checkpoints read, pulled, handed on, fetched, resumed, failed, and refusals",
                "what",
                snap.get("checkpoint", {}),
            ),
            (
                "content",
                "Content transfer: chunks refused (corrupt), holders dropped (served a corrupt"
                " chunk) or given up (unreachable), resumes, fetches ended or failed, stages"
                " failed, chunks served and refusals of members' asks",
                "what",
                {k: v for k, v in snap.get("content", {}).items() if not k.startswith("bytes_")},
            ),
            (
                "content_fetched_bytes",
                "Bytes of content fetched, by source kind (peer, http, s3)",
                "source",
                {
                    k.removeprefix("bytes_"): v
                    for k, v in snap.get("content", {}).items()
                    if k.startswith("bytes_")
                },
            ),
            (
                "job_data",
                "Datasets of jobs starting here: held already (hits), staged first (misses),"
                " stagings failed (failed); pre-fetches started, cancelled, refused",
                "what",
                snap.get("job_data", {}),
            ),
            (
                "env_builds",
                "Python environments of jobs starting here: found built (hits), built (builds),"
                " builds failed (failed)",
                "what",
                snap.get("env_builds", {}),
            ),
            (
                "image_pulls",
                "Images of container jobs starting here: held already (present), pulled from the"
                " registry, moved from a peer, failed; archives exported for peers (exported)",
                "what",
                snap.get("image_pulls", {}),
            ),
            (
                "workdir_uploads",
                "Working folders sent up to this agent: manifests, chunks and bytes received,"
                " manifests and chunks refused",
                "what",
                snap.get("workdir_uploads", {}),
            ),
            (
                "prefetch",
                "Pre-fetches this owner asked of its waiting jobs' likely nodes: asked, moved (the"
                " forecast moved: the old node told to stop), refused, failed",
                "what",
                snap.get("prefetch", {}),
            ),
            (
                "datasets_refused",
                "Entries of the datasets folder refused (name: not a dataset name; link_out: a"
                " link out of the folder), each counted once",
                "reason",
                snap.get("datasets_refused", {}),
            ),
            (
                "job_step_errors",
                "Errors in one job's step of a loop over many jobs (the others went on), "
                "stored copies whose details were left out (stored_copy_repaired), and stored "
                "job rows that did not decode (unreadable_row)",
                "step",
                snap.get("job_step_errors", {}),
            ),
            (
                "history_dropped",
                "Samples this node's history did not keep: late (its clock went back), not a"
                " finite number, or a write of the history file that failed",
                "reason",
                snap.get("history_dropped", {}),
            ),
            (
                "records_refused",
                "Gossip records refused (garbage, oversized, malformed) or not believed",
                "reason",
                snap["records_refused"],
            ),
            (
                "records_refused_kinds",
                "Gossip records refused or not believed, by record kind",
                "kind",
                snap["records_refused_kinds"],
            ),
        ):
            family = CounterMetricFamily(f"shoal_{name}", text, labels=[label])
            for key, count in sorted(counts.items()):
                family.add_metric([key], count)
            yield family
        waits = snap.get("job_data_wait")
        if waits is not None:
            yield HistogramMetricFamily(
                "shoal_job_data_wait_seconds",
                "Each job's wait for its datasets before it started here",
                buckets=waits.cumulative(),
                sum_value=waits.sum_s,
            )
        store = snap.get("store", {})
        for name, text in (
            ("hits", "Chunks the content store had when asked (to serve a peer or fill a file)"),
            ("misses", "Chunks asked of the content store that it did not have"),
            ("evictions", "Manifests the content store evicted (cache rules or an operator)"),
            ("refused_chunks", "Chunks refused before they were kept: not their digest or length"),
            (
                "corrupt",
                "Chunks held that no longer matched their digest when read (fetched again)",
            ),
        ):
            yield CounterMetricFamily(f"shoal_store_{name}", text, value=store.get(name, 0))
        yield GaugeMetricFamily(
            "shoal_store_held_bytes",
            "Bytes the content store keeps on its disk (datasets indexed in place not counted)",
            value=store.get("held_bytes", 0),
        )
        yield GaugeMetricFamily(
            "shoal_store_budget_bytes",
            "What the content store may keep (store_budget_bytes or a share of its disk)",
            value=store.get("budget_bytes", 0),
        )
        datasets_unindexed = CounterMetricFamily(
            "shoal_datasets_unindexed",
            "Datasets of this host that could not be indexed (unreadable, over the limits)",
            labels=["reason"],
        )
        for reason, count in sorted(store.get("refused", {}).items()):
            datasets_unindexed.add_metric([reason], count)
        yield datasets_unindexed
        yield CounterMetricFamily(
            "shoal_deadline_misses",
            "Jobs this agent owns whose deadline passed before they ended (each said once)",
            value=snap.get("deadline_misses", 0),
        )
        yield CounterMetricFamily(
            "shoal_jobs_stopped_for_disk",
            "Jobs this runner stopped for filling its disk (their files there removed)",
            value=snap.get("disk_stops", 0),
        )
        node: str = snap["node"]
        devices: list[Device] = snap["devices"]
        gauges = {
            "util_pct": GaugeMetricFamily(
                "shoal_gpu_util_pct", "GPU utilization (percent)", labels=["node", "device"]
            ),
            "mem_used": GaugeMetricFamily(
                "shoal_gpu_mem_used_bytes", "GPU memory in use", labels=["node", "device"]
            ),
            "mem_total": GaugeMetricFamily(
                "shoal_gpu_mem_total_bytes", "GPU memory", labels=["node", "device"]
            ),
            "temp_c": GaugeMetricFamily(
                "shoal_gpu_temp_c", "GPU temperature (Celsius)", labels=["node", "device"]
            ),
            "power": GaugeMetricFamily(
                "shoal_gpu_power_watts", "GPU power draw", labels=["node", "device"]
            ),
        }
        for d in devices:
            labels = [node, d.static.key]
            s = d.sample
            if s.util_pct is not None:
                gauges["util_pct"].add_metric(labels, s.util_pct)
            if s.mem_used_bytes is not None:
                gauges["mem_used"].add_metric(labels, s.mem_used_bytes)
            if d.static.mem_total_bytes is not None:
                gauges["mem_total"].add_metric(labels, d.static.mem_total_bytes)
            if s.temp_c is not None:
                gauges["temp_c"].add_metric(labels, s.temp_c)
            if s.power_mw is not None:
                gauges["power"].add_metric(labels, s.power_mw / 1000.0)
        yield from gauges.values()
        jobs = GaugeMetricFamily("shoal_jobs", "Jobs by state, as seen here", labels=["state"])
        for state, count in sorted(snap["jobs_by_state"].items()):
            jobs.add_metric([state], count)
        yield jobs
        members = GaugeMetricFamily("shoal_members", "Mesh members by state", labels=["state"])
        for state, count in sorted(snap["members_by_state"].items()):
            members.add_metric([state], count)
        yield members
        yield GaugeMetricFamily(
            "shoal_jobs_running_here", "Jobs running on this node", value=snap["running_here"]
        )
        yield GaugeMetricFamily(
            "shoal_jobs_pending_owned", "Pending jobs this node owns", value=snap["queue"]
        )
        for name, value in sorted(snap["gossip"].items()):
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if name in GOSSIP_GAUGES:
                yield GaugeMetricFamily(f"shoal_gossip_{name}", f"gossip {name}", value=value)
            else:  # every other gossip figure only ever grows
                yield CounterMetricFamily(f"shoal_gossip_{name}", f"gossip {name}", value=value)


class AgentMetrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot
        self.commands_accepted: Counter[str] = Counter()
        """Operator commands accepted, by kind."""
        self.commands_rejected: Counter[str] = Counter()
        """Operator commands rejected, by reason."""
        self.refused: Counter[str] = Counter()
        """Commands and log reads refused by the rules of :mod:`agent.people.rules`, by why."""
        self.internal_refused: Counter[str] = Counter()
        """Agent-to-agent calls refused because the caller has no authority, by call."""
        self.api_refused: Counter[tuple[str, str]] = Counter()
        """API requests answered 400 or more, by (route, status)."""
        self._registry: Any = None

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_Snapshot(self))
        return generate_latest(self._registry), CONTENT_TYPE_LATEST
