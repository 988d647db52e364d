"""The environment that pins a job to the devices it was given, plus Shoal's own job variables.

Pinning by environment is a courtesy, not isolation: a job can reset these variables. What each
vendor's runtime reads:

- NVIDIA: ``CUDA_VISIBLE_DEVICES`` by UUID (``GPU-...``), immune to enumeration order; the index
  is used only for a device that reports no UUID.
- AMD: ``ROCR_VISIBLE_DEVICES`` takes the physical indices. HIP numbers devices *after* ROCr's
  filter, so ``HIP_VISIBLE_DEVICES`` gets ``0..n-1``; giving it the physical indices too would
  select the wrong GPUs (or none) whenever the grant is not ``0..n-1``.
- Intel: ``ZE_AFFINITY_MASK`` takes the Level Zero device indices.
- Apple Metal and CPU: nothing to pin.

Every job also gets ``SHOAL_DEVICES`` (the device keys, for tools and the simulator), and the gang
variables when it is one rank of a gang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from probers.records import DeviceStatic


@dataclass(frozen=True, slots=True)
class GangRank:
    """Where one process of a gang job sits (the variables ``torch.distributed`` reads)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

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
    env = {"SHOAL_DEVICES": ",".join(d.key for d in ordered)}
    vendor = vendors[0]
    if vendor == "nvidia":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or str(d.vendor_index) for d in ordered)
    elif vendor == "amd":
        env["ROCR_VISIBLE_DEVICES"] = ",".join(str(d.vendor_index) for d in ordered)
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(ordered)))
    elif vendor == "intel":
        env["ZE_AFFINITY_MASK"] = ",".join(str(d.vendor_index) for d in ordered)
    return env


def job_env(
    devices: Sequence[DeviceStatic],
    *,
    job_id: str,
    attempt: int,
    checkpoint_dir: str | None = None,
    gang: GangRank | None = None,
) -> dict[str, str]:
    """Every variable Shoal sets for one attempt of a job; these override the job's own ``env``."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    env = device_env(devices)
    env["SHOAL_JOB_ID"] = job_id
    env["SHOAL_ATTEMPT"] = str(attempt)
    if checkpoint_dir is not None:
        env["SHOAL_CHECKPOINT_DIR"] = checkpoint_dir
    if gang is not None:
        env["RANK"] = str(gang.rank)
        env["WORLD_SIZE"] = str(gang.world_size)
        env["LOCAL_RANK"] = str(gang.local_rank)
        env["MASTER_ADDR"] = gang.master_addr
        env["MASTER_PORT"] = str(gang.master_port)
    return env
