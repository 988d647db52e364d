"""What the policy reads: a snapshot of the fleet, the jobs that wait and the jobs that run.

Plain frozen data, built by whoever calls the policy: the agents' owners through
:mod:`agent.policy.adapt` (from their gossip view), the TUI the same way (from the API's JSON),
and the simulator of ``python -m bench.sched`` directly. Nothing here reads a clock or does I/O:
``now`` travels in the :class:`Snapshot`.

Units are in the names. A share of a GPU is counted in bytes of its memory (a job that asks for
``--gpus 0.5`` is given half the memory of whichever GPU it lands on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from agent.policy.fragmentation import Shape
from gossip.vivaldi import Coordinate

if TYPE_CHECKING:
    from agent.policy.teams import Teams

SCHEDULABLE: Final = "schedulable"
JobKind = Literal["training", "inference", "batch"]
DeadlineAction = Literal["queue", "refuse"]


@dataclass(frozen=True, slots=True)
class Share:
    """A job holding part of a GPU's memory."""

    job_id: str
    mem_bytes: int
    job_class: str = ""


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU (or the CPU of a host without one) as the policy sees it."""

    key: str
    model: str
    """The accelerator model: a key of ``probers/catalog.toml`` (``v100``) where the device is
    known to the catalog, else its name as the driver reports it."""
    vendor: str = "nvidia"
    backend: str = "cuda"
    arch: str | None = None
    compute_capability: str | None = None
    mem_total_bytes: int = 0
    whole_job: str | None = None
    """The job holding the whole device, if any."""
    shares: tuple[Share, ...] = ()
    """Jobs holding part of its memory (never together with ``whole_job``)."""
    link_domain: str | None = None
    """Devices of one node with the same value share a fast link (NVLink, xGMI)."""
    link_kind: str | None = None
    """``nvlink``, ``xgmi`` or ``pcie``: the best link this device has to a peer."""
    temp_c: float | None = None
    temp_slowdown_c: float | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    healthy: bool = True

    @property
    def shared_mem_bytes(self) -> int:
        return sum(s.mem_bytes for s in self.shares)

    @property
    def is_free(self) -> bool:
        """Nothing runs on it: it can be given whole."""
        return self.whole_job is None and not self.shares and self.healthy

    @property
    def share_free_bytes(self) -> int:
        """Memory a new share could take (0 when the device is given whole or unhealthy)."""
        if self.whole_job is not None or not self.healthy:
            return 0
        return self.mem_total_bytes - self.shared_mem_bytes


@dataclass(frozen=True, slots=True)
class Node:
    """One host: its devices, where it is, what it holds and what it costs."""

    node_id: str
    devices: tuple[Device, ...] = ()
    drain: str = SCHEDULABLE
    labels: Mapping[str, str] = field(default_factory=dict)
    zone: str | None = None
    os: str | None = None
    datasets: frozenset[str] = frozenset()
    """The datasets held whole here: by name, and as ``NAME@DIGEST`` for each version."""
    dataset_held: Mapping[str, int] = field(default_factory=dict)
    """``NAME@DIGEST`` -> bytes of that version held here, whole or in part."""
    fetch_rates: Mapping[str, float] = field(default_factory=dict)
    """Member -> bytes/s this node measured fetching content from it (its ``place`` record);
    the data term divides what is missing by these, not by a guessed link."""
    coord: Coordinate | None = None
    """Its Vivaldi coordinate: the RTT to another node is the distance between the two."""
    cost_per_hour: float | None = None
    cpu_milli_total: int | None = None
    """CPU in thousandths of a core; ``None`` when the policy does not account CPU."""
    cpu_milli_used: int = 0
    host_mem_total_bytes: int | None = None
    host_mem_used_bytes: int = 0
    network_gbps: float = 10.0
    """What a dataset transfer to this node can expect, in gigabits per second."""
    features: frozenset[str] | None = None
    """The job-spec features its agent runs (``gang``, ``image``...); ``None``: every one (the
    simulator's nodes)."""

    @property
    def cpu_milli_free(self) -> int | None:
        return None if self.cpu_milli_total is None else self.cpu_milli_total - self.cpu_milli_used

    @property
    def host_mem_free_bytes(self) -> int | None:
        if self.host_mem_total_bytes is None:
            return None
        return self.host_mem_total_bytes - self.host_mem_used_bytes


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the policy sees it: what it needs, how much it matters, and when it came."""

    job_id: str
    job_class: str = ""
    """What kind of program it is (``ResNet-50 (batch size 64)``, ``llama-7b``): the spec's
    ``class`` or ``model``, else its command. Jobs of one class run at one speed on one model."""
    kind: JobKind = "batch"
    owner: str | None = None
    gpus_per_node: int = 1
    nodes: int = 1
    """More than one makes it a gang: every member starts, or none."""
    gpus_max_per_node: int | None = None
    """An elastic job: the most GPUs it takes on its one node (``gpus_per_node`` the fewest);
    it is placed with as many as fit on a node now (:func:`agent.policy.place.rank`)."""
    min_mem_per_gpu_bytes: int | None = None
    share_mem_bytes: int | None = None
    """A share of one GPU by memory (``--gpu-mem 10GiB --share``)."""
    share_fraction: float | None = None
    """A share of one GPU as a fraction of its memory (``--gpus 0.5``)."""
    backends: tuple[str, ...] = ()
    min_compute_capability: str | None = None
    archs: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    """Accepted accelerator models; empty accepts any."""
    interconnect: str | None = None
    os: str | None = None
    affinity: Mapping[str, str] = field(default_factory=dict)
    anti_affinity: Mapping[str, str] = field(default_factory=dict)
    datasets: tuple[str, ...] = ()
    priority: int = 0
    preemptible: bool = False
    deadline: float | None = None
    deadline_action: DeadlineAction = "queue"
    """What to do with a deadline that cannot be met: queue it with a warning, or refuse it."""
    submitted_at: float = 0.0
    max_runtime_s: float | None = None
    max_cost_per_hour: float | None = None
    cpu_milli: int = 0
    host_mem_bytes: int = 0
    features: tuple[str, ...] = ()
    """The job-spec features it uses: only a node whose agent runs them all may host it."""
    attained_gpu_s: float = 0.0
    """GPU-seconds it ran in earlier attempts (it was preempted and queued again)."""
    team: str = ""
    """The team it counts against (quotas, fair share); empty: none."""
    user: str = ""
    """The person who submitted it (fair share within a team)."""

    @property
    def is_share(self) -> bool:
        return self.share_mem_bytes is not None or self.share_fraction is not None

    @property
    def is_gang(self) -> bool:
        return self.nodes > 1

    @property
    def is_elastic(self) -> bool:
        return self.gpus_max_per_node is not None

    @property
    def gpus(self) -> int:
        """GPUs over all its nodes (a share counts as one)."""
        return self.gpus_per_node * self.nodes

    def share_bytes_on(self, device: Device) -> int:
        """The memory a share of this job takes on ``device``."""
        if self.share_mem_bytes is not None:
            return self.share_mem_bytes
        return int((self.share_fraction or 0.0) * device.mem_total_bytes)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs: one entry per node, each with its device keys."""

    node_ids: tuple[str, ...]
    devices: tuple[tuple[str, ...], ...]
    share_mem_bytes: int = 0
    """For a share: the memory it holds on its one device; 0 for whole devices."""

    @property
    def node_id(self) -> str:
        return self.node_ids[0]


@dataclass(frozen=True, slots=True)
class Running:
    """A job that runs now, where, and how far it has come."""

    job: Job
    placement: Placement
    started_at: float
    """When this attempt started (after a move, when it restarted)."""
    device_model: str = ""
    """The model of the devices it runs on (its gang's slowest)."""
    progress: float | None = None
    """Fraction done, 0..1, as last reported."""
    progress_at: float | None = None
    rate_per_s: float | None = None
    """Fraction per second over the recent reports."""
    eta_s: float | None = None
    """Seconds left as of ``progress_at``, p50, from the job's own progress history (the
    runner's robust fit, :mod:`agent.job.progressfit`)."""
    eta_p90_s: float | None = None
    """The same at p90, where known (else the policy widens the p50 by the rate's spread)."""
    last_checkpoint_at: float | None = None
    moved_at: float | None = None
    """When the policy last moved or started it after a preemption (the anti-loop guard)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The fleet at ``now`` as one decider sees it."""

    now: float
    nodes: tuple[Node, ...]
    pending: tuple[Job, ...] = ()
    running: tuple[Running, ...] = ()
    dataset_bytes: Mapping[str, int] = field(default_factory=dict)
    """How big each dataset is, by name and by ``NAME@DIGEST`` (for the time a transfer takes);
    unknown: 0."""
    dataset_newest: Mapping[str, str] = field(default_factory=dict)
    """Dataset name -> the digest of its newest version in the mesh (what ``NAME`` means)."""
    shapes: tuple[Shape, ...] = ()
    """The recent workload's task shapes, weighted by how common each is: what fragmentation is
    measured against (FGD). Empty: the shapes of the jobs in this snapshot."""
    teams: Teams | None = None
    """Team quotas and fair-share usage (:mod:`agent.policy.teams`); ``None``: no teams."""
    stopping: tuple[Job, ...] = ()
    """Jobs stopping now (preempted, in their grace period), each queued again once it has
    stopped; not in ``pending``. One that its team is owed may be placed before then: its start
    names it in ``after`` (it waits for its own stop)."""
