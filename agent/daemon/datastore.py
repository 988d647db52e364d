"""This node's content store and the datasets it holds: what the agent wires together.

The store (``agent.content.store``, ``<data_dir>/store/``) keeps every manifest this node knows.
Datasets come from two places on this host, both indexed in place (never copied into the store):
the entries of ``datasets_dir`` (``agent.daemon.datasets``: its safety rules) and the folders an
operator added with ``shoal data add`` (remembered in the store, so across restarts). Each scan,
off the event loop, builds each one's manifest (the hash cache makes an unchanged folder cost one
``lstat`` per file): a changed folder is a new version, and the version it replaces, of the same
origin, is forgotten here (its files are gone). Every version held, whole or in part, is
published in the ``place`` record.

The operator's commands (``data_add``, ``data_evict``, ``data_pin``, ``data_unpin``) are checked
here; what running jobs read is never evicted, nor a pinned version.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from agent.content.build import build_manifest
from agent.content.cache import CacheRules, budget_from_share
from agent.content.manifest import ContentError
from agent.content.store import DiskStore
from agent.content.storeindex import Held
from agent.daemon.config import AgentConfig
from agent.daemon.datasets import DatasetScanner
from agent.storage.sqlitefile import StoreError
from agent.wire.place import HeldVersion, dataset_name_problem, parse_dataset_ref

log = logging.getLogger("shoal.agent")

DATASET: Final = "dataset"


class DataRefused(ValueError):
    """A data command refused; the message (one line) says why. ``status``: its HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def store_rules(config: AgentConfig, disk_total_bytes: int) -> CacheRules:
    budget = config.store_budget_bytes or budget_from_share(
        config.store_budget_share, disk_total_bytes
    )
    return CacheRules(budget, config.store_high, config.store_low)


class NodeData:
    """The store, the datasets scan and the data commands of one agent."""

    def __init__(
        self,
        config: AgentConfig,
        in_use: Callable[[], Iterable[tuple[str, str]]] = tuple,
        kept: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        """``in_use``: (job id, dataset ref: ``NAME`` or ``NAME@DIGEST``) for each dataset of
        each job that runs here; ``kept``: other content never evicted (the working folders of
        the jobs not ended: they are durable with their job, as its submission is)."""
        root = config.data_dir / "store"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.store = DiskStore(root, store_rules(config, shutil.disk_usage(root).total))
        self.store.protected = self.protected
        self.scanner = DatasetScanner(config.datasets_dir, config.datasets)
        self.named = config.datasets
        self._private = tuple(os.path.realpath(p) for p in (config.data_dir, config.identity_path))
        """The agent's own folders: never a dataset (its key would be served to the mesh)."""
        self._in_use = in_use
        self._kept = kept
        self._scan_lock = threading.Lock()
        self.refused: Counter[str] = Counter()
        """Datasets that could not be indexed (over the limits, unreadable), by reason."""
        self._said: set[tuple[str, str]] = set()
        self._used: set[tuple[str, str]] = set()
        """(job id, digest) already counted as a use."""
        self.changed: Callable[[], None] = lambda: None
        """Called after a command changed what is held (the agent republishes)."""

    # -- the scan (blocking: run it in a thread) ----------------------------------------------

    def scan(self) -> tuple[dict[str, int], tuple[HeldVersion, ...]]:
        """Index every dataset of this host; the sizes by name (for older readers) and the
        versions held, whole or in part."""
        with self._scan_lock:
            found = self.scanner.scan_paths()
            for name, path in self.store.sources().items():
                found.setdefault(name, path)
            for name, path in sorted(found.items()):
                self._index(name, path)
            self._forget_gone(found)
            self.count_uses()
            self.store.evict_over_budget(self.protected())
            return self.sizes(), self.versions()

    def _index(self, name: str, path: Path) -> None:
        try:
            built = build_manifest(path, name, DATASET, self.store)
        except (ContentError, StoreError, OSError) as exc:
            self._say(name, "unreadable", f"dataset {name!r} at {path}: not indexed: {exc}")
            return
        base = path if path.is_dir() else path.parent
        self.store.add_local(built.manifest, base)
        for h in self.store.all_held():
            if (
                h.kind == DATASET
                and h.name == name
                and h.origin == str(base)
                and h.digest != built.manifest.digest
            ):
                self.store.forget(name, h.digest)  # that version's files are no longer there

    def _forget_gone(self, found: dict[str, Path]) -> None:
        origins = {str(p if p.is_dir() else p.parent) for p in found.values()}
        for h in self.store.all_held():
            gone = h.name not in found or h.origin not in origins
            if h.kind == DATASET and h.origin is not None and gone:
                self.store.forget(h.name, h.digest)

    def _say(self, name: str, reason: str, line: str) -> None:
        if (name, reason) not in self._said:
            self._said.add((name, reason))
            self.refused[reason] += 1
            log.warning("%s", line)

    def sizes(self) -> dict[str, int]:
        out = dict.fromkeys(self.named, 0)
        newest: dict[str, Held] = {}
        for h in self.store.all_held():
            older = h.name not in newest or h.created_s > newest[h.name].created_s
            if h.kind == DATASET and h.complete and older:
                newest[h.name] = h
        out.update({n: h.total_bytes for n, h in newest.items()})
        return out

    def versions(self) -> tuple[HeldVersion, ...]:
        return tuple(
            HeldVersion(h.name, h.digest, h.total_bytes, h.held_bytes, h.created_s)
            for h in self.store.all_held()
            if h.kind == DATASET and dataset_name_problem(h.name) is None
        )

    def protected(self) -> set[str]:
        """The versions held here that jobs running here read, and what ``kept`` names (never
        evicted)."""
        return {digest for _job, digest in self._reading()} | set(self._kept())

    def _reading(self) -> set[tuple[str, str]]:
        """(job id, digest) of each version held here that a job running here reads."""
        pairs = list(self._in_use())
        out: set[tuple[str, str]] = set()
        for h in self.store.all_held():
            for job_id, ref in pairs:
                name, _, digest = ref.partition("@")
                if h.kind == DATASET and h.name == name and digest in ("", h.digest):
                    out.add((job_id, h.digest))
        return out

    def count_uses(self) -> None:
        """Each version a job running here reads is used once per job: the most recently used,
        and once more popular (the cache rules keep it longer)."""
        reading = self._reading()
        for _job, digest in sorted(reading - self._used):
            self.store.use(digest)
        self._used = reading

    # -- the operator's commands (blocking: run them in a thread) -----------------------------

    def add(self, name: str, path_text: str) -> dict[str, Any]:
        """``shoal data add``: check, remember and index ``path_text`` as dataset ``name``."""
        problem = dataset_name_problem(name)
        if problem is not None:
            raise DataRefused(problem)
        path = Path(path_text)
        if not path.is_absolute():
            raise DataRefused(f"{path_text!r}: the path must be absolute (on the agent's host)")
        if not path.exists():
            raise DataRefused(f"{path}: no such file or folder on this host")
        real = os.path.realpath(path)
        for private in self._private:
            if os.path.commonpath((real, private)) in (real, private):
                raise DataRefused(
                    f"{path}: holds or is inside the agent's own folder {private}: never a dataset"
                )
        if not (path.is_dir() or path.is_file()) or not os.access(
            path, os.R_OK | (os.X_OK if path.is_dir() else 0)
        ):
            raise DataRefused(f"{path}: not a folder or file the agent can read")
        with self._scan_lock:
            self.store.add_source(name, path)
            self._index(name, path)
        held = [h for h in self.store.all_held() if h.name == name and h.origin is not None]
        if not held:
            raise DataRefused(f"dataset {name!r} at {path}: could not be indexed (see the log)")
        newest = max(held, key=lambda h: h.created_s)
        return {"name": name, "digest": newest.digest, "total_bytes": newest.total_bytes}

    def matching(self, ref_text: str) -> list[Held]:
        try:
            ref = parse_dataset_ref(ref_text)
        except ValueError as exc:
            raise DataRefused(str(exc)) from None
        held = [
            h
            for h in self.store.all_held()
            if h.kind == DATASET and h.name == ref.name and ref.digest in (None, h.digest)
        ]
        if not held:
            raise DataRefused(f"{ref}: not held on this node", 404)
        return held

    def evict(self, ref_text: str) -> dict[str, Any]:
        held = self.matching(ref_text)
        protected = self.protected()
        for h in held:
            if h.pinned:
                raise DataRefused(f"{h.name}@{h.digest[:12]} is pinned here: unpin it first", 409)
            if h.digest in protected:
                raise DataRefused(f"{h.name}@{h.digest[:12]} is read by a job running here", 409)
            if h.origin is not None:
                raise DataRefused(
                    f"{h.name}@{h.digest[:12]} is this host's own folder ({h.origin}), not a"
                    " cached copy: remove it there",
                    409,
                )
        for h in held:
            self.store.forget(h.name, h.digest)
        return {"evicted": [h.digest for h in held]}

    def pin(self, ref_text: str, pinned: bool) -> dict[str, Any]:
        held = self.matching(ref_text)
        for h in held:
            self.store.pin(h.digest, pinned)
        return {"pinned" if pinned else "unpinned": [h.digest for h in held]}

    def metrics(self) -> dict[str, Any]:
        s = self.store.stats
        return {
            "hits": s.hits,
            "misses": s.misses,
            "evictions": s.evictions,
            "refused_chunks": s.refused_chunks,
            "corrupt": s.corrupt,
            "held_bytes": self.store.store_bytes(),
            "budget_bytes": self.store.rules.budget_bytes,
            "refused": dict(self.refused),
        }
