"""The accelerator catalog: what each model can do, from its vendor's published figures.

The data lives in ``catalog.toml`` next to this module (read with :mod:`tomllib` through
:mod:`importlib.resources`, so it works from a wheel too). Figures are per device as the operating
system enumerates it: for boards that carry several devices (Tesla K80, Instinct MI250X) the data
file keeps the datasheet's board figures and :func:`load_catalog` divides them.

The scheduler's throughput model starts from these numbers; a figure the vendor does not publish is
``None``, never a guess.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, cast, get_args

from probers.records import Backend, Vendor

GIB = 1024**3

_VENDORS = frozenset(get_args(Vendor))
_BACKENDS = frozenset(get_args(Backend))


@dataclass(frozen=True, slots=True)
class AcceleratorModel:
    """One accelerator model. Rates and sizes are per device the OS shows (see the module doc)."""

    key: str
    """The catalog key (``h100``, ``mi300x``, ``m2-ultra``): what sim profiles and lookups take."""
    name: str
    vendor: Vendor
    backend: Backend
    source_name: str
    """The vendor datasheet or specification page this row comes from."""
    source_url: str
    arch: str | None = None
    """Microarchitecture (``Hopper``, ``CDNA 3``, ``Xe-HPG``); Apple: the Metal GPU family."""
    compute_capability: str | None = None
    """NVIDIA ``major.minor`` or the AMD gfx target, as in :class:`probers.records.DeviceStatic`."""
    form_factor: str | None = None
    """``sxm``, ``oam``, ``pcie`` or ``soc``."""
    devices_per_board: int = 1
    compute_units: int | None = None
    """SMs (NVIDIA), CUs (AMD), Xe-cores (Intel), GPU cores (Apple)."""
    mem_bytes: int | None = None
    mem_bandwidth_gbps: float | None = None
    """Memory bandwidth in GB/s (gigabytes per second)."""
    fp32_tflops: float | None = None
    fp16_tflops: float | None = None
    """Dense FP16 matrix peak (GeForce: with FP32 accumulate)."""
    bf16_tflops: float | None = None
    """Dense BF16 matrix peak; ``None`` where unsupported or unpublished."""
    fp8_tflops: float | None = None
    """Dense FP8 matrix peak; ``None`` where unsupported or unpublished."""
    tdp_w: float | None = None
    interconnect: str | None = None
    """GPU-to-GPU link (``nvlink4``, ``xgmi``, ``xelink``), else the host link (``pcie4``)."""
    interconnect_gbps: float | None = None
    """Aggregate interconnect bandwidth per device in GB/s, both directions."""
    interconnect_links: int | None = None
    """How many GPU-to-GPU links each device has, where the vendor says."""
    unified_memory: bool = False
    aliases: tuple[str, ...] = ()
    note: str | None = None

    @property
    def mem_gib(self) -> float | None:
        return None if self.mem_bytes is None else self.mem_bytes / GIB

    @property
    def peer_link_gbps(self) -> float | None:
        """Bandwidth of one GPU-to-GPU link in GB/s, when the model has such links."""
        if self.interconnect_gbps is None or self.interconnect_links is None:
            return None
        return self.interconnect_gbps / self.interconnect_links


_TFLOPS_FIELDS = ("fp32_tflops", "fp16_tflops", "bf16_tflops", "fp8_tflops")
_SPLIT_FIELDS = ("compute_units", "mem_bytes", "mem_bandwidth_gbps", "tdp_w", *_TFLOPS_FIELDS)
_WHOLE_FIELDS = ("compute_units", "mem_bytes")
_FLOAT_FIELDS = (
    "mem_bandwidth_gbps",
    "fp32_tflops",
    "fp16_tflops",
    "bf16_tflops",
    "fp8_tflops",
    "tdp_w",
    "interconnect_gbps",
)
_STR_FIELDS = ("arch", "compute_capability", "form_factor", "interconnect", "note")
_INT_FIELDS = ("compute_units", "interconnect_links")


def _model_from_table(key: str, table: dict[str, Any]) -> AcceleratorModel:
    """Build one model from its TOML table, checking types, units and the per-board split."""

    def fail(why: str) -> ValueError:
        return ValueError(f"catalog.toml [{key}]: {why}")

    vendor, backend = table.get("vendor"), table.get("backend")
    if vendor not in _VENDORS:
        raise fail(f"vendor {vendor!r} is not one of {sorted(_VENDORS)}")
    if backend not in _BACKENDS:
        raise fail(f"backend {backend!r} is not one of {sorted(_BACKENDS)}")
    source = table.get("source")
    if not isinstance(source, dict) or not source.get("name") or not source.get("url"):
        raise fail("source = { name = ..., url = ... } is required")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise fail("name is required")

    values: dict[str, Any] = {}
    for field in _STR_FIELDS:
        if field in table:
            values[field] = str(table[field])
    for field in _INT_FIELDS:
        if field in table:
            values[field] = int(table[field])
    for field in _FLOAT_FIELDS:
        if field in table:
            values[field] = float(table[field])
    if "mem_bytes" in table:
        values["mem_bytes"] = int(table["mem_bytes"])
    elif "mem_gib" in table:
        values["mem_bytes"] = round(float(table["mem_gib"]) * GIB)
    for field, value in values.items():
        if isinstance(value, int | float) and value <= 0:
            raise fail(f"{field} must be positive, not {value}")

    per_board = int(table.get("devices_per_board", 1))
    if per_board < 1:
        raise fail("devices_per_board must be at least 1")
    if per_board > 1:
        for field in _SPLIT_FIELDS:
            if field in values:
                split = values[field] / per_board
                values[field] = round(split) if field in _WHOLE_FIELDS else split

    aliases = table.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise fail("aliases must be a list of strings")
    return AcceleratorModel(
        key=key,
        name=name,
        vendor=cast(Vendor, vendor),
        backend=cast(Backend, backend),
        source_name=str(source["name"]),
        source_url=str(source["url"]),
        devices_per_board=per_board,
        unified_memory=bool(table.get("unified_memory", False)),
        aliases=tuple(aliases),
        **values,
    )


@cache
def load_catalog() -> dict[str, AcceleratorModel]:
    """Every model in ``catalog.toml`` by key, in file order. Read once, then cached."""
    text = resources.files("probers").joinpath("catalog.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    return {key: _model_from_table(key, table) for key, table in data.items()}


def _compact(text: str) -> str:
    """Lowercase with everything but letters and digits removed: ``"H100-SXM"`` -> ``"h100sxm"``."""
    text = re.sub(r"\((r|tm)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]", "", text)


@cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for model in load_catalog().values():
        for spelling in (model.key, model.name, *model.aliases):
            index.setdefault(_compact(spelling), model.key)
    return index


def lookup(name_or_alias: str) -> AcceleratorModel:
    """The model a key, name or alias names, ignoring case and punctuation; else ``KeyError``.

    ``lookup("h100")``, ``lookup("NVIDIA H100 80GB HBM3")`` and ``lookup("M2 Ultra")`` all work.
    A real device name the aliases do not list is still found through :func:`match_device_name`.
    """
    key = _alias_index().get(_compact(name_or_alias))
    if key is not None:
        return load_catalog()[key]
    model = match_device_name(name_or_alias)
    if model is None:
        raise KeyError(f"no accelerator model {name_or_alias!r} in the catalog")
    return model


# Words in a real device name that, when present, must agree with the model.
_FORM_WORDS = {"pcie": "pcie", "sxm": "sxm", "sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm"}
_VARIANT_WORDS = frozenset(
    {"nvl", "max", "pro", "ultra", "ti", "super", "xt", "xtx", "d", "mobile", "laptop"}
)
_MEM_WORD = re.compile(r"^(\d+)gb$")


@cache
def model_key(name: str) -> str:
    """The catalog key of a device name (a key, a name or an alias) where the catalog knows it,
    else the name itself."""
    if name in load_catalog():
        return name
    try:
        return lookup(name).key
    except KeyError:
        return name


def device_model(name: str, backend: str) -> str:
    """The model a device is known by, to the policy and to the jobs it runs
    (``SHOAL_DEVICE_MODELS``): ``cpu`` for a CPU device, else :func:`model_key` of its name."""
    return "cpu" if backend == "cpu" else model_key(name)


def _words(text: str) -> list[str]:
    text = re.sub(r"\((r|tm)\)", " ", text.lower())
    return [w for w in re.split(r"[^a-z0-9]+", text) if w]


@cache
def _signatures() -> dict[str, frozenset[str]]:
    """The words a device name must contain to be each model: its name minus the vendor words."""
    generic = {"nvidia", "amd", "intel", "apple", "tesla", "geforce", "radeon", "instinct", "arc"}
    generic |= {"sxm", "sxm2", "pcie", "data", "center", "gpu", "graphics", "rx"}
    signatures: dict[str, frozenset[str]] = {}
    for model in load_catalog().values():
        words = [w for w in _words(model.name) if w not in generic and not _MEM_WORD.match(w)]
        signatures[model.key] = frozenset(words)
    return signatures


def match_device_name(name: str) -> AcceleratorModel | None:
    """The catalog model a real device name (from NVML, sysfs, Level Zero or Metal) is, if any.

    Every distinguishing word of the model's name must appear (``h100``; ``m2`` and ``ultra``),
    and nothing in the device name may contradict the model: a different memory size
    (``A100-SXM4-40GB`` is not the 80 GB model), a different form factor (``H100 PCIe`` is not the
    SXM part) or a variant word the model lacks (``M2 Max``, ``RTX 4090 Ti``). When several models
    fit, the one with the most matching words wins.
    """
    words = _words(name)
    present = set(words)
    best: AcceleratorModel | None = None
    best_score = 0
    for key, signature in _signatures().items():
        if not signature or not signature <= present:
            continue
        model = load_catalog()[key]
        if _contradicts(model, words, signature):
            continue
        if len(signature) > best_score:
            best, best_score = model, len(signature)
    return best


def _contradicts(model: AcceleratorModel, words: list[str], signature: frozenset[str]) -> bool:
    for word in words:
        form = _FORM_WORDS.get(word)
        if form is not None and model.form_factor is not None and form != model.form_factor:
            return True
        if word in _VARIANT_WORDS and word not in signature:
            return True
        size = _MEM_WORD.match(word)
        if size and model.mem_bytes is not None:
            stated_bytes = int(size.group(1)) * GIB
            sizes = (model.mem_bytes, model.mem_bytes * model.devices_per_board)
            if all(abs(stated_bytes - known) > GIB for known in sizes):
                return True
    return False
