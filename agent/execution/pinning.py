"""The environment that pins a job to the devices it was given, plus Shoal's own job variables.

Pinning by environment is a courtesy, not isolation: a process can reset these variables before
its runtime starts (AMD's own GPU isolation page says as much). What it does buy: a job cannot
*ask* for other devices through its spec (``agent.job.jobspec`` refuses every variable in
:data:`agent.job.envnames.RESERVED_ENV` and every ``SHOAL_*`` name), and a well-behaved job sees
only its grant. What each vendor's runtime reads:

- NVIDIA: ``CUDA_VISIBLE_DEVICES`` by UUID (``GPU-...``), immune to enumeration order; the index
  is used only for a device that reports no UUID, and then with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
  (CUDA's default order is fastest first, not the PCI order NVML indices follow).
- AMD: ``ROCR_VISIBLE_DEVICES`` takes the physical indices. HIP numbers devices *after* ROCr's
  filter, so ``HIP_VISIBLE_DEVICES`` gets ``0..n-1``; giving it the physical indices too would
  select the wrong GPUs (or none) whenever the grant is not ``0..n-1``.
- Intel: ``ZE_AFFINITY_MASK`` takes the Level Zero device indices.
- Apple Metal and CPU: nothing to pin.

A vendor the job was given nothing of is hidden where a value for "no device" exists:

- NVIDIA: ``CUDA_VISIBLE_DEVICES=-1``. The CUDA Programming Guide (CUDA Environment Variables)
  documents both an empty value and an invalid index as hiding devices ("only devices with indices
  that appear before the invalid index in the list are visible"). ``-1`` is used because AMD's HIP
  reads ``CUDA_VISIBLE_DEVICES`` when ``HIP_VISIBLE_DEVICES`` is empty and takes an empty value as
  unset (ROCclr: ``HIP_VISIBLE_DEVICES[0] != '\\0' ? HIP_VISIBLE_DEVICES : CUDA_VISIBLE_DEVICES``),
  and an empty variable may not survive on Windows. A job given AMD GPUs gets it too: HIP prefers
  the non-empty ``HIP_VISIBLE_DEVICES`` Shoal sets.
- AMD: ``ROCR_VISIBLE_DEVICES=""`` and ``HIP_VISIBLE_DEVICES=-1``. ROCm's documentation names no
  "none" value; these come from AMD's runtime sources: ROCr exposes zero devices when the variable
  is set but empty (``RvdFilter::SelectZeroDevices``), and ROCclr stops at the first invalid index.
- Intel: no value exists. The Level Zero specification (Affinity Mask) says an unset mask reports
  every device and gives no "none" form, so a job without Intel GPUs still sees them through Level
  Zero; only device-node permissions (the job user outside the ``render`` group) keep it off them.
- Apple Metal: no variable selects Metal devices.

``GPU_DEVICE_ORDINAL`` (ROCclr, OpenCL), ``ONEAPI_DEVICE_SELECTOR`` (oneAPI/SYCL),
``ZE_FLAT_DEVICE_HIERARCHY`` and ``ZE_ENABLE_PCI_ID_DEVICE_ORDER`` (which change what a Level Zero
index means) are reserved but left unset: the job cannot set them, the runtimes' defaults apply.

Every job also gets ``SHOAL_GPUS`` (how many devices it was given: an elastic job's world size
on its node, which changes when it is resized), ``SHOAL_DEVICES`` (the device keys, for tools
and the simulator),
``SHOAL_DEVICE_MODELS`` (the model of each of those devices, in the same order, as the policy
knows it: the catalog key, ``h100``, ``l4``; a job that wants to know what it runs on, such as the
demo's synthetic job, :mod:`agent.sandbox.synthjob`, reads it), and the gang variables when it is
one rank of a gang: Shoal runs one process per member node, so ``RANK`` and
``NODE_RANK`` are the node's rank, ``WORLD_SIZE`` and ``NNODES`` the number of members,
``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``, and ``MASTER_ADDR``/``MASTER_PORT`` where rank 0 listens
(what ``torch.distributed``'s ``env://`` reads). A member that wants one process per GPU runs
``torchrun --nnodes=$NNODES --node_rank=$NODE_RANK --nproc_per_node=<gpus>
--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT``, which sets these again for its children.
They override a job's own ``env``. A share of one GPU is pinned to its device like any other
grant (other shares see the same device) and gets its memory hints (:func:`share_env`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from probers.catalog import device_model
from probers.records import DeviceStatic

HIDE_ALL: Final[Mapping[str, Mapping[str, str]]] = {
    "nvidia": {"CUDA_VISIBLE_DEVICES": "-1"},
    "amd": {"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "-1"},
    "intel": {},
}
"""Per vendor, the values that expose none of its devices (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class GangRank:
    """Where one process of a gang job sits (the variables ``torch.distributed`` reads)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    local_world_size: int = 1
    node_rank: int = 0
    nnodes: int = 1

    @classmethod
    def one_per_node(
        cls, node_rank: int, nnodes: int, master_addr: str, master_port: int
    ) -> GangRank:
        """The member on node ``node_rank`` of ``nnodes``, one process per node (how Shoal runs
        a gang): its rank is its node's, and it is the only process there."""
        return cls(
            rank=node_rank,
            world_size=nnodes,
            local_rank=0,
            master_addr=master_addr,
            master_port=master_port,
            local_world_size=1,
            node_rank=node_rank,
            nnodes=nnodes,
        )

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        if self.local_rank < 0:
            raise ValueError(f"local_rank must not be negative, got {self.local_rank}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port {self.master_port} is not a TCP port")
        if not self.master_addr:
            raise ValueError("master_addr must not be empty")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local_rank {self.local_rank} is outside 0..local_world_size-1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is outside 0..{self.nnodes - 1}")


def device_env(devices: Sequence[DeviceStatic]) -> dict[str, str]:
    """The vendor variables for a grant of ``devices``; raises ``ValueError`` on a mixed grant."""
    if not devices:
        return {}
    vendors = sorted({d.vendor for d in devices})
    if len(vendors) > 1:
        raise ValueError(f"a job cannot be given devices of several vendors: {', '.join(vendors)}")
    keys = [d.key for d in devices]
    if len(set(keys)) != len(keys):
        raise ValueError("a job cannot be given the same device twice")
    ordered = sorted(devices, key=lambda d: (d.vendor_index, d.key))
    env = {
        "SHOAL_GPUS": str(len(ordered)),
        "SHOAL_DEVICES": ",".join(d.key for d in ordered),
        "SHOAL_DEVICE_MODELS": ",".join(device_model(d.name, d.backend) for d in ordered),
    }
    vendor = vendors[0]
    if vendor == "nvidia":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or str(d.vendor_index) for d in ordered)
        if any(d.uuid is None for d in ordered):
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # indices as NVML numbers them
    elif vendor == "amd":
        env["ROCR_VISIBLE_DEVICES"] = ",".join(str(d.vendor_index) for d in ordered)
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(ordered)))
    elif vendor == "intel":
        env["ZE_AFFINITY_MASK"] = ",".join(str(d.vendor_index) for d in ordered)
    return env


def share_env(devices: Sequence[DeviceStatic], share_bytes: int) -> dict[str, str]:
    """The hints a share of a GPU gets: ``SHOAL_GPU_MEM_BYTES`` (the memory it holds) and
    ``SHOAL_GPU_SHARE`` (that as a fraction of the device's memory, for
    ``torch.cuda.set_per_process_memory_fraction`` and the like). Nothing enforces them: the
    runtimes have no variable that caps a process's memory, so a job that exceeds its share
    takes memory from its neighbours."""
    if len(devices) != 1:
        raise ValueError(f"a share of a GPU is of one device, not {len(devices)}")
    env = {"SHOAL_GPU_MEM_BYTES": str(share_bytes)}
    total = devices[0].mem_total_bytes
    if total:
        env["SHOAL_GPU_SHARE"] = f"{min(1.0, share_bytes / total):.4g}"
    return env


def job_env(
    devices: Sequence[DeviceStatic],
    *,
    job_id: str,
    attempt: int,
    checkpoint_dir: str | None = None,
    gang: GangRank | None = None,
    resume: bool = False,
    share_bytes: int = 0,
) -> dict[str, str]:
    """Every variable Shoal sets for one attempt of a job; these override the job's own ``env``.
    ``resume``: the attempt starts from a checkpoint an earlier one wrote (``SHOAL_RESUME=1``).
    ``share_bytes``: the job holds that much of its one device's memory, a share of a GPU that
    other jobs may run on too (:func:`share_env`).

    Vendors the job was given no device of are hidden (:data:`HIDE_ALL`).
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    granted = {d.vendor for d in devices}
    env: dict[str, str] = {}
    for vendor, hide in HIDE_ALL.items():
        if vendor not in granted:
            env.update(hide)
    env.update(device_env(devices))
    if share_bytes:
        env.update(share_env(devices, share_bytes))
    env["SHOAL_JOB_ID"] = job_id
    env["SHOAL_ATTEMPT"] = str(attempt)
    if checkpoint_dir is not None:
        env["SHOAL_CHECKPOINT_DIR"] = checkpoint_dir
    if resume:
        env["SHOAL_RESUME"] = "1"
    if gang is not None:
        env["RANK"] = str(gang.rank)
        env["WORLD_SIZE"] = str(gang.world_size)
        env["LOCAL_RANK"] = str(gang.local_rank)
        env["LOCAL_WORLD_SIZE"] = str(gang.local_world_size)
        env["NODE_RANK"] = str(gang.node_rank)
        env["NNODES"] = str(gang.nnodes)
        env["MASTER_ADDR"] = gang.master_addr
        env["MASTER_PORT"] = str(gang.master_port)
    return env
