"""Prometheus ``/metrics`` for one agent (``prometheus_client``, one registry per agent).

Gauges are computed at scrape time from what the agent holds: this node's devices
(``shoal_gpu_util_pct``, ``shoal_gpu_mem_used_bytes``, ``shoal_gpu_mem_total_bytes``,
``shoal_gpu_temp_c``, ``shoal_gpu_power_watts``, labelled ``node`` and ``device``), jobs by state
as this agent sees the mesh (``shoal_jobs``), members by state, jobs running here, and every
gossip counter (``shoal_gossip_<name>``). Counters: commands accepted by kind and rejected by
reason (``shoal_commands_accepted_total``, ``shoal_commands_rejected_total``), placements tried
and declined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from probers.records import Device


class _Snapshot(Collector):
    def __init__(self, source: Callable[[], dict[str, Any]]) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        snap = self._source()
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
            if isinstance(value, int | float) and not isinstance(value, bool):
                yield GaugeMetricFamily(f"shoal_gossip_{name}", f"gossip {name}", value=value)


class AgentMetrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.commands_accepted = Counter(
            "shoal_commands_accepted",
            "Operator commands accepted",
            ["kind"],
            registry=self.registry,
        )
        self.commands_rejected = Counter(
            "shoal_commands_rejected",
            "Operator commands rejected",
            ["reason"],
            registry=self.registry,
        )
        self.registry.register(_Snapshot(snapshot))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
