"""The content store on one node's disk: ``<data_dir>/store/`` (the agent's own, 0700).

A manifest's files are kept by their content: a file's *key* is the SHA-256 of its chunk size,
size and chunk digests, so the same file in two versions or two datasets is one file here. While
a file is filled it is ``partial/<key>`` (sparse, the chunks held recorded in the index); once
every chunk is in, it is checked whole and becomes ``objects/ab/<sha256>`` (read-only; a
manifest's tree, :meth:`DiskStore.tree`, is hardlinks to objects, never a second copy).

The index (``index.db``, SQLite through :func:`~agent.storage.sqlitefile.open_database`) holds
the manifests (digest, kind, name, created, total and held bytes, last use, uses, pinned), the
names each is known by (two datasets of equal bytes are one manifest under two names, each with
its own local origin), each manifest's files, and every place a chunk sits (file key, chunk
number) with whether it is held: a chunk put for one manifest is written at every place it
sits, in every manifest, and a manifest added later takes what is held already, so nothing held
is fetched twice. What is recorded held was written and flushed first, so a restart resumes
where it was.

A manifest of *local origin* (a dataset in the agent's datasets folder) keeps its bytes where
they are: its files are read at their offset, and checked, when a chunk is served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from agent.content.cache import CacheEntry, CacheRules, plan_eviction
from agent.content.manifest import (
    ChunkAt,
    ContentError,
    ContentManifest,
    check_chunk,
)
from agent.content.storefiles import StoreFiles
from agent.content.storefolders import FolderIndex
from agent.content.storeindex import (
    BATCH,
    HELD_SELECT,
    MIGRATIONS,
    Held,
    StoreStats,
    digests_of,
    file_key,
    held_row,
    point_local,
    recount,
)
from agent.storage.sqlitefile import StoreError, StoreFull, migrate, open_database, transaction

log = logging.getLogger("shoal.agent")

_PARSED_KEPT: Final = 16
RESERVE_FRACTION: Final = 0.05
RESERVE_MAX_BYTES: Final = 1 << 30
"""What the store leaves free on its disk, as the agent's disk guard does: 5%, at most 1 GiB."""


class DiskStore(FolderIndex):
    """The :class:`~agent.content.store_api.ContentStore` of one node. Thread-safe: every
    method may block on the disk (async callers run it in a thread)."""

    def __init__(
        self,
        root: Path,
        rules: CacheRules | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.files = StoreFiles(root)
        self.root = root
        self.path = root / "index.db"
        self.clock = clock
        self._lock = threading.RLock()
        self._db = open_database(self.path, "NORMAL")
        try:
            with self._tx() as db:
                migrate(db, self.path, MIGRATIONS, "store schema")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        _free, disk_total = self.files.disk_free()
        self.rules = rules or CacheRules(budget_bytes=max(1, disk_total // 2))
        self.stats = StoreStats()
        self.protected: Callable[[], Iterable[str]] = tuple
        """The digests jobs running or queued here need (never evicted); set by the agent."""
        self._parsed: OrderedDict[str, ContentManifest] = OrderedDict()
        row = self._db.execute(
            "SELECT COALESCE(SUM(p.length), 0) FROM places p JOIN files f USING (fkey)"
            " WHERE p.held = 1 AND f.local IS NULL"
        ).fetchone()
        self._store_bytes = int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db, self._lock, self.path)

    # ---- the ContentStore protocol --------------------------------------------------------

    def manifest(self, digest: str) -> ContentManifest | None:
        with self._lock:
            held = self._parsed.get(digest)
            if held is not None:
                self._parsed.move_to_end(digest)
                return held
            row = self._db.execute(
                "SELECT body FROM manifests WHERE digest = ?", (digest,)
            ).fetchone()
            if row is None:
                return None
            manifest = ContentManifest.from_wire(json.loads(row[0]))
            self._parsed[digest] = manifest
            while len(self._parsed) > _PARSED_KEPT:
                self._parsed.popitem(last=False)
            return manifest

    def add_manifest(self, manifest: ContentManifest) -> None:
        self._add(manifest, origin=None)

    def missing(self, digest: str) -> Sequence[ChunkAt]:
        manifest = self.manifest(digest)
        if manifest is None:
            return ()
        with self._lock:
            if self.held_bytes(digest) >= manifest.total_bytes:
                return ()  # whole: what a holder answers most, without reading every place
            empty = self._empty_chunks(digest)
            if empty:
                # held for another file, version or dataset: filled from there, no transfer
                with contextlib.suppress(StoreFull):  # then it is fetched, and put says full
                    self._spread(empty)
                empty = self._empty_chunks(digest)
        first: dict[str, ChunkAt] = {}
        for at in manifest.chunk_places():
            if at.digest in empty:
                first.setdefault(at.digest, at)
        return tuple(first.values())

    def _empty_chunks(self, digest: str) -> set[str]:
        """The chunk digests with a place in manifest ``digest`` not filled yet."""
        return {
            r[0]
            for r in self._db.execute(
                "SELECT DISTINCT p.chunk FROM entries e JOIN places p ON p.fkey = e.fkey"
                " WHERE e.digest = ? AND p.held = 0",
                (digest,),
            )
        }

    def put_chunk(self, digest: str, chunk: ChunkAt, data: bytes) -> None:
        self.put_chunks(digest, ((chunk, data),))

    def put_chunks(self, digest: str, items: Sequence[tuple[ChunkAt, bytes]]) -> None:
        for chunk, data in items:
            try:
                check_chunk(chunk.digest, data, chunk.length_bytes)
            except ContentError:
                self.stats.refused_chunks += 1
                raise
        with self._lock:
            marks = ",".join("?" * len(items))
            known = {
                r[0]
                for r in self._db.execute(
                    "SELECT DISTINCT p.chunk FROM entries e JOIN places p USING (fkey) WHERE"
                    f" e.digest = ? AND p.chunk IN ({marks})",
                    (digest, *(chunk.digest for chunk, _ in items)),
                )
            }
            for chunk, _ in items:
                if chunk.digest not in known:
                    self.stats.refused_chunks += 1
                    raise ContentError(
                        f"chunk {chunk.digest[:12]}: not a chunk of manifest {digest[:12]} held"
                        " here"
                    )
            self._fill({chunk.digest: data for chunk, data in items})

    def read_chunk(self, chunk_digest: str) -> bytes | None:
        with self._lock:
            rows = self._db.execute(
                "SELECT p.fkey, p.n, p.length, f.chunk_bytes, f.object, f.local FROM places p"
                " JOIN files f USING (fkey) WHERE p.chunk = ? AND p.held = 1 LIMIT 8",
                (chunk_digest,),
            ).fetchall()
            for fkey, n, length, chunk_bytes, obj, local in rows:
                if local is not None:
                    path = Path(local)
                elif obj is not None:
                    path = self.files.object_path(obj)
                else:
                    path = self.files.partial_path(fkey)
                data = self.files.read_at(path, n * chunk_bytes, length)
                if data is not None and hashlib.sha256(data).hexdigest() == chunk_digest:
                    self.stats.hits += 1
                    return data
                self._found_bad(fkey, n, local is not None)
            self.stats.misses += 1
            return None

    def held_bytes(self, digest: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT held_bytes FROM manifests WHERE digest = ?", (digest,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    # ---- what the node does with it -------------------------------------------------------

    def add_local(self, manifest: ContentManifest, folder: Path) -> None:
        """Remember ``manifest`` as built from ``folder`` (:mod:`agent.content.build`): held
        whole, its bytes read from ``folder`` when served."""
        self._add(manifest, origin=str(folder))

    def held(self, digest: str) -> Held | None:
        with self._lock:
            row = self._db.execute(
                HELD_SELECT + " WHERE m.digest = ? ORDER BY n.origin IS NULL, n.created_s",
                (digest,),
            ).fetchone()
        return None if row is None else held_row(row)

    def names_of(self, digest: str) -> tuple[str, ...]:
        """The names manifest ``digest`` is known by here (a checkpoint's: its jobs)."""
        with self._lock:
            rows = self._db.execute("SELECT name FROM names WHERE digest = ?", (digest,))
            return tuple(sorted(str(r[0]) for r in rows))

    def all_held(self) -> tuple[Held, ...]:
        with self._lock:
            rows = self._db.execute(HELD_SELECT + " ORDER BY n.name, n.created_s").fetchall()
        return tuple(held_row(r) for r in rows)

    def store_bytes(self) -> int:
        """Bytes of chunks the store keeps on its own disk (local origins not counted)."""
        with self._lock:
            return self._store_bytes

    def use(self, digest: str) -> None:
        """A job used manifest ``digest``: it is the most recently used, and once more popular."""
        with self._tx() as db:
            db.execute(
                "UPDATE manifests SET last_use_s = ?, uses = uses + 1 WHERE digest = ?",
                (self.clock(), digest),
            )

    def pin(self, digest: str, pinned: bool = True) -> bool:
        """Pin (never evicted) or unpin ``digest``; whether it is held here."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE manifests SET pinned = ? WHERE digest = ?", (int(pinned), digest)
            )
            return cur.rowcount > 0

    def tree(self, digest: str) -> Path | None:
        """The folder of a complete manifest: its origin, or hardlinks to its objects."""
        with self._lock:
            held = self.held(digest)
            if held is None or not held.complete:
                return None
            if held.origin is not None:
                return Path(held.origin)
            rows = self._db.execute(
                "SELECT e.path, f.object FROM entries e JOIN files f USING (fkey)"
                " WHERE e.digest = ? ORDER BY e.idx",
                (digest,),
            ).fetchall()
            if any(obj is None for _p, obj in rows):
                return None
            return self.files.link_tree(digest, [(p, o) for p, o in rows])

    def evict(self, digest: str) -> bool:
        """Forget manifest ``digest`` and delete what no other manifest uses; whether it was
        held. Pinned or not: the caller decides (:meth:`evict_over_budget` skips pinned)."""
        with self._lock:
            known = self._db.execute("SELECT 1 FROM manifests WHERE digest = ?", (digest,))
            if known.fetchone() is None:
                return False
            gone = [
                r[0]
                for r in self._db.execute(
                    "SELECT DISTINCT fkey FROM entries WHERE digest = ? AND fkey NOT IN"
                    " (SELECT fkey FROM entries WHERE digest != ?)",
                    (digest, digest),
                ).fetchall()
            ]
            objects: list[str] = []
            freed = 0
            with self._tx() as db:
                for fkey in gone:
                    obj, local = db.execute(
                        "SELECT object, local FROM files WHERE fkey = ?", (fkey,)
                    ).fetchone()
                    if local is None:
                        freed += int(
                            db.execute(
                                "SELECT COALESCE(SUM(length), 0) FROM places WHERE fkey = ?"
                                " AND held = 1",
                                (fkey,),
                            ).fetchone()[0]
                        )
                    db.execute("DELETE FROM places WHERE fkey = ?", (fkey,))
                    db.execute("DELETE FROM files WHERE fkey = ?", (fkey,))
                    if obj is not None:
                        objects.append(obj)
                db.execute("DELETE FROM entries WHERE digest = ?", (digest,))
                db.execute("DELETE FROM names WHERE digest = ?", (digest,))
                db.execute("DELETE FROM manifests WHERE digest = ?", (digest,))
            self._store_bytes -= freed
            self._parsed.pop(digest, None)
            self.files.drop_tree(digest)
            for fkey in gone:
                self.files.drop_partial(fkey)
            for obj in objects:
                still = self._db.execute(
                    "SELECT 1 FROM files WHERE object = ? LIMIT 1", (obj,)
                ).fetchone()
                if still is None:
                    self.files.drop_object(obj)
            self.stats.evictions += 1
            return True

    def forget(self, name: str, digest: str) -> bool:
        """Forget ``digest`` under ``name`` (a version replaced, a folder gone, an operator's
        evict); the manifest and what only it holds go with its last name. Whether it was
        held under that name."""
        with self._lock:
            with self._tx() as db:
                gone = db.execute(
                    "DELETE FROM names WHERE name = ? AND digest = ?", (name, digest)
                ).rowcount
                left = db.execute(
                    "SELECT origin FROM names WHERE digest = ? ORDER BY origin IS NULL",
                    (digest,),
                ).fetchone()
                if left is not None and left[0] is not None:
                    point_local(db, digest, left[0])  # its files are in that folder
            if gone and left is None:
                self.evict(digest)
            return bool(gone)

    def evict_over_budget(
        self, protected: Iterable[str] | None = None, force: bool = False
    ) -> list[str]:
        """Apply the cache rules (:func:`~agent.content.cache.plan_eviction`), never evicting
        ``protected`` (default: :attr:`protected`); the digests evicted."""
        if protected is None:
            protected = self.protected()
        with self._lock:
            local = {h.digest for h in self.all_held() if h.origin is not None}
            entries = [
                CacheEntry(
                    h.digest,
                    0 if h.digest in local else h.held_bytes,
                    h.last_use_s,
                    h.uses,
                    h.pinned,
                    h.digest in local,
                )
                for h in {h.digest: h for h in self.all_held()}.values()
            ]
            plan = plan_eviction(
                entries, self._store_bytes, self.rules, self.clock(), protected, force
            )
            done = [d for d in plan if self.evict(d)]
        for d in done:
            log.info("store: evicted %s (cache rules)", d[:12])
        return done

    # ---- inside -----------------------------------------------------------------------------

    def _add(self, manifest: ContentManifest, origin: str | None) -> None:
        digest = manifest.digest
        with self._lock:
            row = self._db.execute("SELECT 1 FROM manifests WHERE digest = ?", (digest,)).fetchone()
            named = self._db.execute(
                "SELECT origin FROM names WHERE name = ? AND digest = ?", (manifest.name, digest)
            ).fetchone()
            if row is not None and named is not None and origin in (None, named[0]):
                return
            now = self.clock()
            newly_held: set[str] = set()
            with self._tx() as db:
                if row is None:
                    db.execute(
                        "INSERT INTO manifests VALUES (?, ?, ?, ?, ?, ?, 0, ?, 0, 0)",
                        (
                            digest,
                            manifest.kind,
                            manifest.name,
                            json.dumps(manifest.to_wire(), separators=(",", ":")),
                            now,
                            manifest.total_bytes,
                            now,
                        ),
                    )
                db.execute(
                    "INSERT INTO names VALUES (?, ?, ?, ?) ON CONFLICT (name, digest) DO UPDATE"
                    " SET origin = COALESCE(excluded.origin, origin)",
                    (manifest.name, digest, origin, now),
                )
                if row is not None and origin is None:
                    return  # the same bytes under another name: nothing more to hold
                for i, f in enumerate(manifest.files):
                    fkey = file_key(manifest.chunk_bytes, f)
                    local = None if origin is None else str(Path(origin) / f.path)
                    db.execute(
                        "INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?)",
                        (digest, i, fkey, f.path),
                    )
                    had = db.execute(
                        "SELECT local, object FROM files WHERE fkey = ?", (fkey,)
                    ).fetchone()
                    if had is None:
                        db.execute(
                            "INSERT INTO files VALUES (?, ?, ?, NULL, ?)",
                            (fkey, f.size_bytes, manifest.chunk_bytes, local),
                        )
                        db.executemany(
                            "INSERT INTO places VALUES (?, ?, ?, ?, ?)",
                            [
                                (
                                    fkey,
                                    n,
                                    d,
                                    max(
                                        0,
                                        min(
                                            manifest.chunk_bytes,
                                            f.size_bytes - n * manifest.chunk_bytes,
                                        ),
                                    ),
                                    int(local is not None),
                                )
                                for n, d in enumerate(f.chunks)
                            ],
                        )
                        if local is not None:
                            newly_held.update(f.chunks)
                    elif local is not None and had[0] is None and had[1] is None:
                        # a file being filled is here, whole, in the operator's folder
                        kept = db.execute(
                            "SELECT COALESCE(SUM(length), 0) FROM places WHERE fkey = ? AND"
                            " held = 1",
                            (fkey,),
                        ).fetchone()[0]
                        self._store_bytes -= int(kept)
                        self.files.drop_partial(fkey)
                        db.execute("UPDATE files SET local = ? WHERE fkey = ?", (local, fkey))
                        db.execute("UPDATE places SET held = 1 WHERE fkey = ?", (fkey,))
                        newly_held.update(f.chunks)
                recount(db, [digest])
            self._parsed.pop(digest, None)
            # what others hold already fills this one; what this one holds fills others
            wanted = {d for f in manifest.files for d in f.chunks}
            try:
                self._spread(wanted | newly_held)
            except StoreFull as exc:  # what did not fit is fetched (missing() lists it)
                log.info("store: %s not filled from what is held: %s", digest[:12], exc)

    def _held_chunks(self, digests: Sequence[str]) -> set[str]:
        out: set[str] = set()
        with self._lock:
            for i in range(0, len(digests), BATCH):
                part = digests[i : i + BATCH]
                marks = ",".join("?" * len(part))
                out.update(
                    r[0]
                    for r in self._db.execute(
                        f"SELECT DISTINCT chunk FROM places WHERE held = 1 AND chunk IN ({marks})",
                        part,
                    )
                )
        return out

    def _spread(self, chunks: Iterable[str]) -> None:
        """Fill every place still empty of a chunk held somewhere."""
        todo = sorted(set(chunks))
        held = self._held_chunks(todo)
        for chunk in todo:
            if chunk not in held:
                continue
            empty = self._db.execute(
                "SELECT 1 FROM places WHERE chunk = ? AND held = 0 LIMIT 1", (chunk,)
            ).fetchone()
            if empty is None:
                continue
            data = self.read_chunk(chunk)
            if data is not None:
                self._fill({chunk: data})

    def _fill(self, chunks: Mapping[str, bytes]) -> None:
        """Write each chunk's bytes (checked) at every empty place of it, in one transaction;
        finish the files they complete."""
        places: list[tuple[str, int, int, int, bytes]] = []
        digests = list(chunks)
        for i in range(0, len(digests), BATCH):
            part = digests[i : i + BATCH]
            places += [
                (fkey, n, size_bytes, chunk_bytes, chunks[chunk])
                for fkey, n, size_bytes, chunk_bytes, chunk in self._db.execute(
                    "SELECT p.fkey, p.n, f.size_bytes, f.chunk_bytes, p.chunk FROM places p JOIN"
                    f" files f USING (fkey) WHERE p.chunk IN ({','.join('?' * len(part))})"
                    " AND p.held = 0",
                    part,
                )
            ]
        if not places:
            return
        need = sum(len(p[4]) for p in places)
        if self._store_bytes + need > self.rules.budget_bytes:
            keep = set(self.protected()) | set(digests_of(self._db, [p[0] for p in places]))
            self.evict_over_budget(keep, force=True)
        if self._store_bytes + need > self.rules.budget_bytes:
            self.stats.by_reason["budget"] = self.stats.by_reason.get("budget", 0) + 1
            raise StoreFull(
                f"store {self.root}: its budget of {self.rules.budget_bytes} bytes is full"
                f" ({self._store_bytes} held)"
            )
        free, total = self.files.disk_free()
        if free - need < min(RESERVE_MAX_BYTES, int(total * RESERVE_FRACTION)):
            self.stats.by_reason["disk"] = self.stats.by_reason.get("disk", 0) + 1
            raise StoreFull(f"store {self.root}: the disk is full ({free} bytes free)")
        self.files.write_many(
            [
                (fkey, size_bytes, n * chunk_bytes, data)
                for fkey, n, size_bytes, chunk_bytes, data in places
            ]
        )
        fkeys = sorted({p[0] for p in places})
        with self._tx() as db:
            db.executemany(
                "UPDATE places SET held = 1 WHERE fkey = ? AND n = ?",
                [(p[0], p[1]) for p in places],
            )
            self._store_bytes += need
            recount(db, digests_of(db, fkeys))
        objects = [(sha, fkey) for fkey in fkeys if (sha := self._maybe_finish(fkey))]
        if objects:  # one transaction for the files this fill completed
            with self._tx() as db:
                db.executemany("UPDATE files SET object = ? WHERE fkey = ?", objects)

    def _maybe_finish(self, fkey: str) -> str | None:
        """The SHA-256 of partial file ``fkey`` once every chunk of it is held and checked
        again, moved under ``objects/`` (the caller records it); else None."""
        empty = self._db.execute(
            "SELECT 1 FROM places WHERE fkey = ? AND held = 0 LIMIT 1", (fkey,)
        ).fetchone()
        if empty is not None:
            return None
        row = self._db.execute(
            "SELECT chunk_bytes, object, local FROM files WHERE fkey = ?", (fkey,)
        ).fetchone()
        if row is None or row[1] is not None or row[2] is not None:
            return None
        chunks = [
            r[0]
            for r in self._db.execute(
                "SELECT chunk FROM places WHERE fkey = ? ORDER BY n", (fkey,)
            ).fetchall()
        ]
        sha, bad = self.files.finish(fkey, int(row[0]), chunks)
        for n in bad:
            self._found_bad(fkey, n, False)
        return sha

    def _found_bad(self, fkey: str, n: int, local: bool) -> None:
        """A held chunk read back did not match: no longer held (fetched again)."""
        self.stats.corrupt += 1
        log.warning("store: chunk %d of file %s no longer matches its digest", n, fkey[:12])
        with self._tx() as db:
            length = db.execute(
                "SELECT length FROM places WHERE fkey = ? AND n = ? AND held = 1", (fkey, n)
            ).fetchone()
            if length is None:
                return
            db.execute("UPDATE places SET held = 0 WHERE fkey = ? AND n = ?", (fkey, n))
            if not local:
                self._store_bytes -= int(length[0])
            recount(db, digests_of(db, [fkey]))
