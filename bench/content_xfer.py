"""The content transfer's throughput on loopback: one dataset staged from 1 holder, then from 3.

``python -m bench.content_xfer --mib 64 --json`` starts real agents (``LocalMesh``: processes,
mutual TLS on 127.0.0.1), puts a dataset of ``--mib`` MiB of random 4 MiB chunks into the stores
of the first holders before they start, has the last agent stage it (the operator's signed
``stage`` command) and times it from the command to the stage's end, for each holder count. One
JSON object: ``mib``, ``chunk_bytes``, ``runs`` (per holder count: ``holders``, ``wall_s``,
``mb_per_s``, ``served_chunks`` per holder) and ``cores``. A building block for ``bench.data``;
loopback on a shared machine measures CPU (TLS, hashing, SQLite), not a network.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import ssl
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from agent.content.manifest import DEFAULT_CHUNK_BYTES, ContentFile, ContentManifest
from agent.content.store import DiskStore
from agent.sandbox.localmesh import AgentProcess, LocalMesh
from gossip import envelope
from gossip.certtrust import CertSigner
from gossip.tls import client_context


def _dataset(mib: int, chunk_bytes: int, root: Path) -> tuple[ContentManifest, Path]:
    """A file of ``mib`` MiB of random bytes under ``root``, and its manifest."""
    path = root / "blob.bin"
    digests: list[str] = []
    with open(path, "wb") as f:
        for _ in range((mib << 20) // chunk_bytes):
            data = os.urandom(chunk_bytes)
            f.write(data)
            digests.append(hashlib.sha256(data).hexdigest())
    size = len(digests) * chunk_bytes
    m = ContentManifest(
        "dataset", "bench", chunk_bytes, (ContentFile("blob.bin", size, 0o644, tuple(digests)),)
    )
    return m, path


def _preload(a: AgentProcess, m: ContentManifest, blob: Path) -> None:
    store = DiskStore(a.directory / "store")
    try:
        store.add_manifest(m)
        with open(blob, "rb") as f:
            for c in store.missing(m.digest):
                f.seek(c.offset_bytes)
                store.put_chunk(m.digest, c, f.read(c.length_bytes))
    finally:
        store.close()


def _get(ctx: ssl.SSLContext, a: AgentProcess, path: str) -> Any:
    with urllib.request.urlopen(f"https://{a.address}{path}", context=ctx, timeout=30) as r:
        return json.loads(r.read())


def _metric(ctx: ssl.SSLContext, a: AgentProcess, what: str) -> float:
    with urllib.request.urlopen(f"https://{a.address}/metrics", context=ctx, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'shoal_content_total{{what="{what}"}}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def run(holders: int, m: ContentManifest, blob: Path, root: Path) -> dict[str, Any]:
    mesh = LocalMesh(root, holders + 1, profiles=("h100:1",))
    mesh.create()
    assert mesh.operator is not None
    ctx = client_context(mesh.operator, mesh.operator.ca_certificate)
    signer = CertSigner(mesh.operator)
    for a in mesh.agents[:holders]:
        _preload(a, m, blob)
    stager = mesh.agents[-1]
    mesh.start()
    try:
        asyncio.run(mesh.wait_converged(timeout_s=60))
        body = {"name": m.name, "digest": m.digest, "nodes": [stager.node_id]}
        sealed = envelope.seal(signer, "stage", json.dumps(body).encode(), time.time())
        request = urllib.request.Request(
            f"https://{stager.address}/v1/commands",
            data=sealed,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        started = time.monotonic()
        with urllib.request.urlopen(request, context=ctx, timeout=30) as r:
            assert r.status == 200
        state: dict[str, Any] = {}
        while time.monotonic() - started < 600:
            (state,) = _get(ctx, stager, "/v1/content/stages")["stages"]
            if state["state"] != "staging":
                break
            time.sleep(0.05)
        wall = time.monotonic() - started
        if state.get("state") != "done":
            raise SystemExit(f"the stage did not end done: {state}")
        served = [_metric(ctx, a, "served_chunks") for a in mesh.agents[:holders]]
    finally:
        mesh.stop(grace_s=20.0)
    return {
        "holders": holders,
        "wall_s": round(wall, 3),
        "mb_per_s": round(m.total_bytes / wall / 1e6, 1),
        "served_chunks": served,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="dataset size (default 64 MiB)")
    parser.add_argument("--holders", default="1,3", help="holder counts to run (default 1,3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    counts = [int(x) for x in args.holders.split(",")]
    with tempfile.TemporaryDirectory(prefix="shoal-xfer-") as tmp:
        root = Path(tmp)
        m, blob = _dataset(args.mib, DEFAULT_CHUNK_BYTES, root)
        runs = [run(n, m, blob, root / f"mesh-{n}") for n in counts]
    out = {
        "mib": args.mib,
        "chunk_bytes": DEFAULT_CHUNK_BYTES,
        "cores": os.cpu_count(),
        "runs": runs,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for r in runs:
            print(f"{r['holders']} holder(s): {r['mb_per_s']} MB/s ({r['wall_s']} s)")


if __name__ == "__main__":
    main()
