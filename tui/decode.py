"""The mesh snapshot (:class:`tui.model.MeshSnapshot`) built from the agent API's JSON.

The JSON is read with the wire contract's decoders (``agent.wire.documents``: the documents the
agents and the simulated mesh write); a host, job or event that does not decode is left out and
counted (:attr:`SnapshotBuilder.refused`), never a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from agent.wire.codec import WireError
from agent.wire.documents import (
    STATIC_KEYS,
    EventDoc,
    JobDoc,
    NodeDoc,
    device_sample_from_json,
    device_static_from_json,
)
from tui.model import DeviceView, EventView, HostView, JobView, MeshSnapshot


def _static_from_json(data: Mapping[str, Any]) -> tuple[Any, ...]:
    """A GPU's static facts (``agent.wire.documents.STATIC_KEYS``), decoded, as a tuple of plain
    values (which the garbage collector stops tracking: a cache of 8,000 GPUs costs a full
    collection nothing); links and MIG instances are decoded when a line asks for them."""
    s = device_static_from_json(data)
    return (
        s.key,
        s.vendor,
        s.backend,
        s.name,
        s.arch,
        s.compute_capability,
        s.uuid,
        s.pci_bus_id,
        s.unified_memory,
        s.mem_total_bytes,
        s.temp_slowdown_c,
        s.source,
    )


def _device(
    node_id: str, data: Mapping[str, Any], static: tuple[Any, ...], row_key: str
) -> DeviceView:
    key, vendor, backend, name, arch, cc, uuid, pci, unified, total, slowdown, source = static
    sample = device_sample_from_json(data, key)
    index = data.get("index")
    return DeviceView(
        node_id,
        key,
        index if isinstance(index, int) else 0,
        vendor,
        backend,
        name,
        arch,
        cc,
        uuid,
        pci,
        unified,
        total,
        sample.mem_used_bytes,
        sample.util_pct,
        sample.temp_c,
        slowdown,
        sample.power_mw,
        sample.power_limit_mw,
        data,
        row_key,
        source,
    )


def device_from_json(node_id: str, data: Mapping[str, Any]) -> DeviceView:
    return _device(node_id, data, _static_from_json(data), f"{node_id}/{data.get('key', '')}")


DeviceMaker = Callable[[str, Mapping[str, Any]], DeviceView]


def host_from_json(data: Mapping[str, Any], device: DeviceMaker = device_from_json) -> HostView:
    """A host from its ``/v1/nodes`` document; :class:`WireError` when it does not decode (a
    device that does not is left out)."""
    doc = NodeDoc.from_wire(data, devices=False)
    node_id = doc.node_id
    host = doc.host
    devices = []
    for d in data.get("devices") or ():
        try:
            devices.append(device(node_id, d))
        except WireError:
            continue
    return HostView(
        node_id=node_id,
        addr=doc.addr or "",
        state=doc.state,
        role=doc.role or "agent",
        drain=doc.drain or "schedulable",
        labels=doc.labels,
        hostname=(host.hostname if host else "") or node_id[:8],
        os=host.os if host else None,
        arch=host.arch if host else None,
        cpu_count=host.cpu_count if host else None,
        mem_total_bytes=host.mem_total_bytes if host else None,
        devices=tuple(devices),
        telemetry_age_s=doc.telemetry_age_s,
        running_jobs=doc.running_jobs,
        queue=doc.queue,
        raw=data,
        wire_version=doc.wire_version,
        features=doc.features,
        telemetry_every_s=doc.telemetry_every_s,
    )


def job_from_json(data: Mapping[str, Any]) -> JobView:
    doc = JobDoc.from_wire(data)
    status, progress = doc.status, doc.progress
    return JobView(
        job_id=status.job_id,
        state=status.state,
        attempt=status.attempt,
        owner=status.owner,
        runner=status.runner,
        devices=status.devices,
        spec=doc.spec,
        submitted_at=status.submitted_at,
        started_at=status.started_at,
        finished_at=status.finished_at,
        exit_code=status.exit_code,
        reason=status.reason or None,
        progress=None if progress is None else min(1.0, max(0.0, progress)),
        eta_s=doc.eta_s,
        raw=data,
        members=tuple(sorted(doc.members, key=lambda m: m.rank)),
    )


def event_from_json(data: Mapping[str, Any]) -> EventView:
    doc = EventDoc.from_wire(data)
    return EventView(
        seq=doc.seq,
        at=doc.at or 0.0,
        kind=doc.kind,
        node=doc.node,
        job_id=doc.job_id,
        message=doc.message,
    )


def snapshot_from_json(
    taken_at: float,
    nodes: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]] = (),
) -> MeshSnapshot:
    """A snapshot from ``ApiClient.nodes()``, ``.jobs()`` and the events seen so far.

    Hosts are ordered by host name then id; jobs newest first; events oldest first.
    """
    return SnapshotBuilder().build(taken_at, nodes, jobs, events)


_Static = tuple[tuple[Any, ...], tuple[Any, ...]]
"""A GPU's static fields as read (raw) and as decoded."""

T = TypeVar("T")


class SnapshotBuilder:
    """Turns each read of the mesh into a snapshot, parsing a GPU's static fields once.

    A GPU's model, vendor, memory size and throttle point do not change between reads: they are
    compared raw with the last read (one tuple comparison) and their parsed values reused, so a
    read of 8,000 GPUs makes one new object per GPU. One builder serves one stream of reads (not
    thread-safe; the app's mesh worker owns it).
    """

    def __init__(self) -> None:
        self._statics: dict[str, _Static] = {}
        self._last: dict[str, _Static] = {}
        self.refused = 0
        """Hosts, GPUs, jobs and events left out because they did not decode."""

    def device(self, node_id: str, data: Mapping[str, Any]) -> DeviceView:
        if not isinstance(data, dict | Mapping):
            self.refused += 1
            raise WireError("device: expected an object")
        row_key = f"{node_id}/{data.get('key', '')}"
        raw = tuple(map(data.get, STATIC_KEYS))
        static = self._last.get(row_key)
        try:
            if static is None or static[0] != raw:
                static = (raw, _static_from_json(data))
            self._statics[row_key] = static
            return _device(node_id, data, static[1], row_key)
        except WireError:
            self.refused += 1
            raise

    def _each(self, read: Callable[[Mapping[str, Any]], T], docs: Iterable[Any]) -> list[T]:
        out = []
        for doc in docs:
            try:
                out.append(read(doc))
            except WireError:
                self.refused += 1
        return out

    def build(
        self,
        taken_at: float,
        nodes: Sequence[Mapping[str, Any]],
        jobs: Sequence[Mapping[str, Any]],
        events: Sequence[Mapping[str, Any]] = (),
    ) -> MeshSnapshot:
        self._last, self._statics = self._statics, {}
        try:
            hosts = sorted(
                self._each(lambda n: host_from_json(n, self.device), nodes),
                key=lambda h: (h.hostname, h.node_id),
            )
        finally:
            self._last = {}
        job_views = sorted(
            self._each(job_from_json, jobs), key=lambda j: (-(j.submitted_at or 0.0), j.job_id)
        )
        return MeshSnapshot(
            taken_at=taken_at,
            hosts=tuple(hosts),
            jobs=tuple(job_views),
            events=tuple(self._each(event_from_json, events)),
        )
