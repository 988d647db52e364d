"""A typed snapshot of the mesh, and what the TUI derives from it.

It is built from the agent API's JSON by :mod:`tui.decode`.

Everything here is plain data and pure functions (no Textual, no I/O): the views render a
:class:`MeshSnapshot`; :class:`History` keeps ~10 minutes of utilization per GPU for the
sparklines, one value per time bucket so a repeated read of the same moment never adds a point.
Where a job would go is the agents' policy's answer, never the TUI's (:mod:`tui.preview`).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from agent.operator.when import Outlook, outlook
from agent.policy.forecast import Forecast
from agent.wire.codec import WireError
from agent.wire.documents import links_from_json, mig_from_json
from agent.wire.records import GangMember, telemetry_stale
from probers.records import Link, MigDevice

HISTORY_S: Final = 600.0
HISTORY_STEP_S: Final = 5.0
HISTORY_POINTS: Final = int(HISTORY_S / HISTORY_STEP_S)
LIVE_JOB_STATES: Final = frozenset({"pending", "placing", "running", "migrating"})
DEFAULT_SLOWDOWN_C: Final[Mapping[str, float]] = {"nvidia": 90.0, "amd": 100.0, "intel": 95.0}
"""Throttle points by vendor, used when a device does not report its own."""


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


LinkView = Link
"""A link from a GPU to a peer on its host: ``peer`` (device key), ``kind`` (``nvlink``,
``xgmi``, ``pcie``), ``bandwidth_mbps``, ``detail``."""


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One GPU as the mesh last saw it."""

    node_id: str
    key: str
    index: int
    vendor: str
    backend: str
    name: str
    arch: str | None
    compute_capability: str | None
    uuid: str | None
    pci_bus_id: str | None
    unified_memory: bool
    mem_total_bytes: int | None
    mem_used_bytes: int | None
    util_pct: float | None
    temp_c: float | None
    temp_slowdown_c: float | None
    power_mw: int | None
    power_limit_mw: int | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    row_key: str = ""
    """``node/device``: the GPU's stable key across the mesh (filled in when built)."""
    source: str = "unknown"
    """The prober that found it (``nvml``, ``amdgpu-sysfs``...; ``sim`` or ``sim:<source>``)."""

    @property
    def links(self) -> tuple[LinkView, ...]:
        """Interconnect links to the host's other GPUs (NVLink, xGMI, PCIe topology), decoded
        from the raw document when asked (only lines on screen ask)."""
        try:
            return links_from_json(self.raw.get("links"))
        except WireError:
            return ()

    @property
    def mig(self) -> tuple[MigDevice, ...]:
        """MIG instances carved out of this GPU (decoded when asked)."""
        try:
            return mig_from_json(self.raw.get("mig"))
        except WireError:
            return ()

    @property
    def mem_frac(self) -> float | None:
        if self.mem_total_bytes is None or self.mem_used_bytes is None or not self.mem_total_bytes:
            return None
        return self.mem_used_bytes / self.mem_total_bytes

    @property
    def slowdown_c(self) -> float | None:
        """This GPU's own throttle point where known, else its vendor's usual one."""
        return self.temp_slowdown_c or DEFAULT_SLOWDOWN_C.get(self.vendor)

    @property
    def short_name(self) -> str:
        """The model without vendor words and the ``(simulated)`` tag: ``H100 SXM``."""
        text = self.name.replace("(simulated)", "")
        for word in ("NVIDIA", "AMD", "Intel(R)", "Intel", "Apple", "Instinct", "Radeon", "Arc"):
            text = text.replace(word + " ", "")
        return " ".join(text.split()) or "?"


@dataclass(frozen=True, slots=True)
class HostView:
    """One node of the mesh."""

    node_id: str
    addr: str
    state: str
    role: str
    drain: str
    labels: Mapping[str, str]
    hostname: str
    os: str | None
    arch: str | None
    cpu_count: int | None
    mem_total_bytes: int | None
    devices: tuple[DeviceView, ...]
    telemetry_age_s: float | None
    running_jobs: tuple[str, ...]
    queue: int
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    wire_version: int | None = None
    features: tuple[str, ...] = ()
    telemetry_every_s: float | None = None
    """The heartbeat the host's agent promised (``None``: not said, 60 s)."""

    @property
    def platform(self) -> str:
        """``linux/x86_64``, ``darwin/arm64``...; ``?`` for what is not known yet."""
        return f"{self.os or '?'}/{self.arch or '?'}"

    @property
    def mig_count(self) -> int:
        return sum(len(d.raw.get("mig") or ()) for d in self.devices)

    @property
    def stale(self) -> bool:
        """Last values kept but not fresh: telemetry older than one and a half of the host's
        heartbeat (it grows with the mesh), or a host not known alive."""
        if self.state in ("suspect", "dead", "left"):
            return True
        return telemetry_stale(self.telemetry_age_s, self.telemetry_every_s)

    @property
    def zone(self) -> str:
        return self.labels.get("zone", "no zone")

    @property
    def vendor(self) -> str:
        vendors = sorted({d.vendor for d in self.devices})
        return "+".join(vendors) if vendors else "cpu only"

    @property
    def util_pct(self) -> float | None:
        values = [d.util_pct for d in self.devices if d.util_pct is not None]
        return sum(values) / len(values) if values else None

    @property
    def mem_used_bytes(self) -> int | None:
        values = [d.mem_used_bytes for d in self.devices if d.mem_used_bytes is not None]
        return sum(values) if values else None

    @property
    def gpu_mem_total_bytes(self) -> int | None:
        values = [d.mem_total_bytes for d in self.devices if d.mem_total_bytes is not None]
        return sum(values) if values else None

    @property
    def temp_c(self) -> float | None:
        values = [d.temp_c for d in self.devices if d.temp_c is not None]
        return max(values) if values else None


@dataclass(frozen=True, slots=True)
class JobView:
    job_id: str
    state: str
    attempt: int
    owner: str | None
    runner: str | None
    devices: tuple[str, ...]
    spec: Mapping[str, Any]
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    reason: str | None
    progress: float | None
    eta_s: float | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    members: tuple[GangMember, ...] = ()
    """A gang's nodes by rank (with the devices each holds); empty for a one-node job."""

    @property
    def command(self) -> str:
        """The command on one line (a newline inside an argument is shown as ``↵``)."""
        text = " ".join(str(a) for a in self.spec.get("command") or [])
        return text if text.isprintable() else text.replace("\n", "↵").replace("\t", " ")

    @property
    def kind(self) -> str:
        return str(self.spec.get("kind") or "batch")

    @property
    def priority(self) -> int:
        return _opt_int(self.spec.get("priority")) or 0

    @property
    def gpus_per_node(self) -> int:
        resources = self.spec.get("resources") or {}
        return _opt_int(resources.get("gpus_per_node")) or 0

    @property
    def gpus_max_per_node(self) -> int | None:
        """An elastic job's most GPUs (``gpus_per_node`` its fewest); ``None``: not elastic."""
        resources = self.spec.get("resources") or {}
        return _opt_int(resources.get("gpus_max_per_node"))

    @property
    def nodes(self) -> int:
        """Nodes the job asks for: more than one makes it a gang."""
        resources = self.spec.get("resources") or {}
        return max(1, _opt_int(resources.get("nodes")) or 1)

    @property
    def live(self) -> bool:
        return self.state in LIVE_JOB_STATES

    def placed(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """``(node, device keys)`` for every node the job holds: each member of a gang, else
        its runner (nothing before it is placed)."""
        if self.members:
            return tuple((m.node, m.devices) for m in self.members)
        return ((self.runner, self.devices),) if self.runner is not None else ()

    def on_node(self, node_id: str) -> bool:
        """The job holds devices (or runs) on ``node_id``."""
        return any(node == node_id for node, _ in self.placed())


@dataclass(frozen=True, slots=True)
class EventView:
    seq: int
    at: float
    kind: str
    node: str | None
    job_id: str | None
    message: str


@dataclass(frozen=True, slots=True)
class MeshSnapshot:
    """What the mesh looked like at ``taken_at`` (epoch seconds), as one agent told us."""

    taken_at: float
    hosts: tuple[HostView, ...]
    jobs: tuple[JobView, ...]
    events: tuple[EventView, ...]
    _hosts_by_id: dict[str, HostView] = field(default_factory=dict, repr=False, compare=False)
    _jobs_by_id: dict[str, JobView] = field(default_factory=dict, repr=False, compare=False)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._hosts_by_id.update((h.node_id, h) for h in self.hosts)
        self._jobs_by_id.update((j.job_id, j) for j in self.jobs)

    def host(self, node_id: str | None) -> HostView | None:
        return None if node_id is None else self._hosts_by_id.get(node_id)

    def job(self, job_id: str | None) -> JobView | None:
        return None if job_id is None else self._jobs_by_id.get(job_id)

    def hostname(self, node_id: str | None) -> str:
        host = self.host(node_id)
        if host is not None:
            return host.hostname
        return (node_id or "-")[:8]

    def devices(self) -> Iterable[DeviceView]:
        for host in self.hosts:
            yield from host.devices

    def jobs_on(self, node_id: str, device_key: str | None = None) -> list[JobView]:
        """Live jobs running on a node (on one of its devices when ``device_key`` is given); a
        gang is on every node one of its members holds."""
        return [
            j
            for j in self.jobs
            if j.live
            and any(
                node == node_id and (device_key is None or device_key in keys)
                for node, keys in j.placed()
            )
        ]

    def holders(self) -> Mapping[tuple[str, str], str]:
        """``(node, device key)`` -> the live job holding that GPU (made once per snapshot)."""
        holders: dict[tuple[str, str], str] | None = self._memo.get("holders")
        if holders is None:
            holders = self._memo["holders"] = {}
            for job in self.jobs:
                if job.live:
                    for node, keys in job.placed():
                        for key in keys:
                            holders[(node, key)] = job.job_id
        return holders

    def outlook(self) -> Outlook:
        """The owners' policy's forecast of every live job and the line of each waiting one
        (:func:`agent.operator.when.outlook` over the documents this snapshot was made of); made
        when first asked, once per snapshot."""
        found: Outlook | None = self._memo.get("outlook")
        if found is None:
            nodes = [h.raw for h in self.hosts]
            jobs = [j.raw for j in self.jobs if j.live]
            found = self._memo["outlook"] = outlook(nodes, jobs, self.taken_at)
        return found

    def defer_outlook(self) -> None:
        """Leave the policy's forecasts out of this snapshot (a big mesh whose jobs view is not
        on screen): its jobs show no predicted times and no policy line; the snapshots made
        while the view is shown have them."""
        self._memo.setdefault("outlook", NO_OUTLOOK)

    def times(self, job: JobView) -> JobTimes:
        """When ``job`` should start and end, in seconds from now (see :class:`JobTimes`)."""
        if not job.live:
            return NO_TIMES
        forecast = self.outlook().forecasts.get(job.job_id)
        ends = None if forecast is None else _finite(forecast.end_p50 - self.taken_at)
        if job.state == "pending":
            starts = None if forecast is None else _finite(forecast.start_p50 - self.taken_at)
            return JobTimes(starts, ends, forecast)
        if job.eta_s is not None:
            ends = job.eta_s  # what the job itself reports beats the model's guess
        return JobTimes(None, ends, forecast)

    def why_waiting(self, job: JobView) -> str | None:
        """Why a pending job waits: its owner's reason, else the policy's line; a placing job
        whose runner stages its datasets: how far (its owner's reason)."""
        if job.state == "placing":
            return job.reason
        if job.state != "pending":
            return None
        return job.reason or self.outlook().waiting.get(job.job_id)

    def live_agents(self) -> list[HostView]:
        """The hosts that may take a job: live agents (not operators, not suspect or dead)."""
        return [h for h in self.hosts if h.state == "alive" and h.role == "agent"]

    def busy_devices(self) -> dict[str, set[str]]:
        """Device keys held by live jobs (every member of a gang), by node."""
        busy: dict[str, set[str]] = {}
        for job in self.jobs:
            if job.live:
                for node, keys in job.placed():
                    busy.setdefault(node, set()).update(keys)
        return busy


class JobTimes(NamedTuple):
    """When a live job should start and end, in seconds from the snapshot (``None``: not
    predicted, or never). A running job's end is the one it reports (``eta_s``) when it does,
    else the policy's forecast; a pending job's are the policy's forecast (p50)."""

    starts_in_s: float | None
    ends_in_s: float | None
    forecast: Forecast | None = None
    """The policy's whole forecast (p50 and p90), where it made one."""


NO_TIMES: Final = JobTimes(None, None)
NO_OUTLOOK: Final = Outlook({}, {})


def _finite(seconds: float) -> float | None:
    return seconds if math.isfinite(seconds) else None


EMPTY_SNAPSHOT: Final = MeshSnapshot(taken_at=0.0, hosts=(), jobs=(), events=())


# -- history -------------------------------------------------------------------------------------


class History:
    """Per-GPU utilization, one point per :data:`HISTORY_STEP_S` bucket, ~10 minutes kept.

    One ring of ``points`` floats per GPU, all in one flat ``array``: 8,000 GPUs' history is a
    handful of objects, none of which the garbage collector has to walk. Written by the mesh
    worker, read when a line is drawn.
    """

    def __init__(self, points: int = HISTORY_POINTS, step_s: float = HISTORY_STEP_S) -> None:
        self.points = points
        self.step_s = step_s
        self._slots: dict[str, int] = {}
        self._values = array("d")
        self._head = array("q")
        """Where each GPU's next value goes."""
        self._count = array("q")
        self._bucket = array("q")
        """The time bucket of each GPU's newest value."""

    def _slot(self, key: str) -> int:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = len(self._slots)
            self._values.extend(array("d", [0.0]) * self.points)
            self._head.append(0)
            self._count.append(0)
            self._bucket.append(_NO_BUCKET)
        return slot

    def _put(self, slot: int, value: float, bucket: int) -> None:
        points, base = self.points, slot * self.points
        head = self._head[slot]
        if self._bucket[slot] == bucket and self._count[slot]:
            self._values[base + (head - 1) % points] = value
            return
        self._values[base + head] = value
        self._head[slot] = (head + 1) % points
        self._count[slot] = min(points, self._count[slot] + 1)
        self._bucket[slot] = bucket

    def record(self, snapshot: MeshSnapshot) -> None:
        bucket = int(snapshot.taken_at // self.step_s)
        slot_of, put = self._slot, self._put
        for device in snapshot.devices():
            if device.util_pct is not None:
                put(slot_of(device.row_key), device.util_pct, bucket)

    def seed(self, row_key: str, values: Iterable[float], bucket: int) -> None:
        """Past values for one GPU (oldest first), ending at time bucket ``bucket``."""
        slot = self._slot(row_key)
        self._head[slot] = self._count[slot] = 0
        self._bucket[slot] = _NO_BUCKET
        kept = list(values)[-self.points :]
        for i, value in enumerate(kept):
            self._put(slot, value, bucket - len(kept) + 1 + i)

    def series(self, row_key: str) -> Sequence[float]:
        """Oldest first."""
        slot = self._slots.get(row_key)
        if slot is None:
            return ()
        points, base = self.points, slot * self.points
        count, head = self._count[slot], self._head[slot]
        start = (head - count) % points
        if start + count <= points:
            return self._values[base + start : base + start + count]
        return self._values[base + start : base + points] + self._values[base : base + head]


_NO_BUCKET: Final = -(2**62)


# -- filtering -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowFilter:
    """A ``/`` filter: a case-insensitive regex; a leading ``!`` keeps rows that do not match."""

    text: str = ""

    @property
    def active(self) -> bool:
        return bool(self.pattern_text)

    @property
    def inverted(self) -> bool:
        return self.text.startswith("!")

    @property
    def pattern_text(self) -> str:
        return self.text[1:] if self.inverted else self.text

    def compile(self) -> re.Pattern[str] | None:
        if not self.active:
            return None
        try:
            return re.compile(self.pattern_text, re.IGNORECASE)
        except re.error:
            return re.compile(re.escape(self.pattern_text), re.IGNORECASE)

    def keeps(self, haystack: str, pattern: re.Pattern[str] | None = None) -> bool:
        pattern = pattern if pattern is not None else self.compile()
        if pattern is None:
            return True
        return (pattern.search(haystack) is not None) != self.inverted


NO_FILTER: Final = RowFilter()
