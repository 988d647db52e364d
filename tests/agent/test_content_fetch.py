"""Real agents on loopback stage content from each other: three holders at once, a holder that
serves corrupt chunks dropped, a holder killed and the stager restarted mid-fetch (it resumes and
never fetches a held chunk again), and a certificate that is not an agent's refused."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agent.cli.stage_args import add_stage_parser
from agent.cli.stage_cmd import cmd_stage
from agent.common.errors import UserError
from agent.content.fetch import distinct_chunks
from agent.content.manifest import MIN_CHUNK_BYTES, ContentFile, ContentManifest
from agent.content.store import DiskStore
from agent.sandbox.localmesh import AgentProcess
from gossip.identity import load_identity
from tests.agent.agents import Mesh
from tests.agent.test_attacks import metric

pytestmark = pytest.mark.slow

CHUNK = MIN_CHUNK_BYTES
WAIT_S = 90.0


def make_dataset(name: str, sizes: dict[str, int]) -> tuple[ContentManifest, dict[str, bytes]]:
    files: list[ContentFile] = []
    chunks: dict[str, bytes] = {}
    for path, size in sorted(sizes.items()):
        data = os.urandom(size)
        pieces = [data[i : i + CHUNK] for i in range(0, size, CHUNK)] or [b""]
        digests = tuple(hashlib.sha256(p).hexdigest() for p in pieces)
        chunks.update(zip(digests, pieces, strict=True))
        files.append(ContentFile(path, size, 0o644, digests))
    return ContentManifest("dataset", name, CHUNK, tuple(files)), chunks


def preload(a: AgentProcess, m: ContentManifest, chunks: dict[str, bytes]) -> None:
    """Put the whole dataset into agent ``a``'s store, as it stands before the agent starts."""
    store = DiskStore(a.directory / "store")
    try:
        store.add_manifest(m)
        for c in store.missing(m.digest):
            store.put_chunk(m.digest, c, chunks[c.digest])
        assert not store.missing(m.digest)
    finally:
        store.close()


def held_bytes(a: AgentProcess, m: ContentManifest) -> tuple[int, int]:
    """(bytes held, chunks missing) of ``m`` in the store of stopped agent ``a``."""
    store = DiskStore(a.directory / "store")
    try:
        if store.manifest(m.digest) is None:
            return 0, len(m.chunk_digests())
        return store.held_bytes(m.digest), len(store.missing(m.digest))
    finally:
        store.close()


def stage(mesh: Mesh, via: AgentProcess, m: ContentManifest, *nodes: AgentProcess) -> Any:
    status, answer = mesh.command(
        via, "stage", {"name": m.name, "digest": m.digest, "nodes": [n.node_id for n in nodes]}
    )
    assert status == 200, answer
    return answer


def stage_of(mesh: Mesh, a: AgentProcess, m: ContentManifest) -> dict[str, Any]:
    for s in mesh.get(a, "/v1/content/stages")["stages"]:
        if s["digest"] == m.digest:
            return dict(s)
    return {}


def staged(mesh: Mesh, a: AgentProcess, m: ContentManifest) -> dict[str, Any]:
    mesh.wait(
        f"{m.name} staged on agent {a.index}",
        lambda: stage_of(mesh, a, m).get("state") in ("done", "failed"),
        WAIT_S,
    )
    s = stage_of(mesh, a, m)
    assert s["state"] == "done", (s, mesh.logs())
    return s


def content(mesh: Mesh, a: AgentProcess, what: str) -> float:
    return metric(mesh, a, "shoal_content_total", what=what)


def refused_403(mesh: Mesh, a: AgentProcess, route: str) -> float:
    """``shoal_api_refused_total{route=..., status="403"}`` (the route has braces in it, which
    :func:`metric` does not parse)."""
    status, body = mesh.request(a, "GET", "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        ours = line.startswith("shoal_api_refused_total{") and f'route="{route}"' in line
        if ours and 'status="403"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def fetched(mesh: Mesh, a: AgentProcess, source: str = "peer") -> float:
    return metric(mesh, a, "shoal_content_fetched_bytes_total", source=source)


def test_three_holders_serve_a_share_each_and_a_non_member_is_refused(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1"] * 4)
    m, chunks = make_dataset("imagenet", {"train/a.bin": 40 * CHUNK + 17, "val/b.bin": 3 * CHUNK})
    holders, stager = mesh.agents[:3], mesh.agents[3]
    for a in holders:
        preload(a, m, chunks)
    mesh.start_all()
    try:
        # Sent to a holder, which forwards it to the node named.
        answer = stage(mesh, holders[0], m, stager)
        assert answer["nodes"][stager.node_id]["state"] in ("staging", "done"), answer
        s = staged(mesh, stager, m)
        assert s["held_bytes"] == s["total_bytes"] == m.total_bytes
        for a in holders:
            assert content(mesh, a, "served_chunks") >= 5, [
                content(mesh, h, "served_chunks") for h in holders
            ]
        assert fetched(mesh, stager) == m.total_bytes
        assert content(mesh, stager, "holders_dropped") == 0

        # The operator's certificate is not a member's: refused, and counted.
        route = "/v1/internal/content/{digest}"
        before = refused_403(mesh, stager, route)
        status, _ = mesh.request(stager, "GET", f"/v1/internal/content/{m.digest}")
        assert status == 403
        after = refused_403(mesh, stager, route)
        assert after == before + 1
        chunk = next(iter(m.chunk_digests()))
        status, _ = mesh.request(stager, "GET", f"/v1/internal/content/chunk/{chunk}?of={m.digest}")
        assert status == 403
        # A member gets the manifest, what is held, and the chunks of that content only.
        member = load_identity(holders[1].directory / "identity")
        status, body = mesh.request(
            stager, "GET", f"/v1/internal/content/{m.digest}", identity=member
        )
        assert status == 200 and json.loads(body)["digest"] == m.digest
        status, body = mesh.request(
            stager, "GET", f"/v1/internal/content/{m.digest}/have", identity=member
        )
        assert status == 200 and json.loads(body) == {"whole": True}
        status, body = mesh.request(
            stager, "GET", f"/v1/internal/content/chunk/{chunk}?of={m.digest}", identity=member
        )
        assert status == 200 and hashlib.sha256(body).hexdigest() == chunk
        # Small chunks, several to an ask, by their place among the distinct chunks.
        order = distinct_chunks(m)
        bundle = f"/v1/internal/content/{m.digest}/chunks?n="
        status, body = mesh.request(stager, "GET", bundle + "2,0,5", identity=member)
        assert status == 200 and body == b"".join(chunks[order[n]] for n in (2, 0, 5))
        for numbers, want in (("x", 400), ("", 400), (",".join(["0"] * 129), 400), ("99", 404)):
            status, _ = mesh.request(stager, "GET", bundle + numbers, identity=member)
            assert status == want, numbers
        status, _ = mesh.request(stager, "GET", bundle + "0")
        assert status == 403
        other = "0" * 64
        status, _ = mesh.request(
            stager, "GET", f"/v1/internal/content/chunk/{other}?of={m.digest}", identity=member
        )
        assert status == 404
        status, _ = mesh.request(
            stager, "GET", "/v1/internal/content/../../etc/passwd", identity=member
        )
        assert status in (400, 404)
    finally:
        mesh.stop_all()
    assert held_bytes(stager, m) == (m.total_bytes, 0)


def test_a_holder_serving_corrupt_chunks_is_dropped_and_the_dataset_ends_verified(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, ["h100:1"] * 3)
    m, chunks = make_dataset("corrupted", {"data.bin": 24 * CHUNK})
    liar, honest, stager = mesh.agents
    for a in (liar, honest):
        preload(a, m, chunks)
    plain = mesh.local.env

    def env(a: AgentProcess) -> dict[str, str]:
        extra = {"SHOAL_TEST_CORRUPT_CHUNKS": "1"} if a is liar else {}
        return {**plain(a), **extra}

    mesh.local.env = env  # type: ignore[method-assign]
    mesh.start_all()
    try:
        stage(mesh, stager, m, stager)
        staged(mesh, stager, m)
        assert content(mesh, liar, "served_chunks") >= 1
        assert content(mesh, stager, "holders_dropped") == 1
        assert content(mesh, stager, "chunks_refused") >= 1
        assert fetched(mesh, stager) == m.total_bytes  # only the good bytes are counted
    finally:
        mesh.stop_all()
    assert held_bytes(stager, m) == (m.total_bytes, 0)  # the store checks each chunk again


def test_a_holder_killed_and_the_stager_restarted_mid_fetch(tmp_path: Path) -> None:
    # Each link carries 256 KiB/s: 6 MiB from two holders takes about 12 s.
    mesh = Mesh(tmp_path, ["h100:1"] * 3, extra=("--content-link-bytes-per-s", "262144"))
    m, chunks = make_dataset("slow", {"a.bin": 64 * CHUNK, "b.bin": 32 * CHUNK})
    doomed, survivor, stager = mesh.agents
    for a in (doomed, survivor):
        preload(a, m, chunks)
    mesh.start_all()
    try:
        stage(mesh, stager, m, stager)
        mesh.wait(
            "a quarter held",
            lambda: stage_of(mesh, stager, m).get("held_bytes", 0) > m.total_bytes // 4,
            WAIT_S,
        )
        line = stage_of(mesh, stager, m)["line"]
        assert line.startswith("staging slow ") and "from 2 holders" in line, line
        mesh.kill(0)  # a holder dies mid-fetch: the other goes on
        mesh.wait(
            "half held",
            lambda: stage_of(mesh, stager, m).get("held_bytes", 0) > m.total_bytes // 2,
            WAIT_S,
        )
        mesh.kill(2)  # the stager crashes mid-fetch
        held, missing = held_bytes(stager, m)
        assert 0 < held < m.total_bytes and missing > 0
        mesh.start(2)
        stage(mesh, survivor, m, stager)  # the operator asks again
        s = staged(mesh, stager, m)
        assert s["held_bytes"] == m.total_bytes
        assert content(mesh, stager, "resumes") == 1
        # What was held before the crash was never fetched again.
        assert fetched(mesh, stager) == m.total_bytes - held
    finally:
        mesh.stop_all()
    assert held_bytes(stager, m) == (m.total_bytes, 0)


def test_a_dataset_staged_from_an_http_listing_is_content_members_fetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.content.test_external import http_server, tree

    served = tmp_path / "served"
    files = tree(served / "cifar", {"train/a.bin": 5 * CHUNK + 3, "test/b.bin": 1000})
    mesh = Mesh(tmp_path / "mesh", ["h100:1"] * 2)
    first, second = mesh.agents
    mesh.start_all()
    try:
        with http_server(served) as base:
            url = f"{base}/cifar/"
            status, answer = mesh.command(
                second, "stage", {"name": "cifar", "source": url, "nodes": [first.node_id]}
            )
            assert status == 200, answer
            mesh.wait(
                "cifar from http",
                lambda: any(
                    s["source"] == url and s["state"] in ("done", "failed")
                    for s in mesh.get(first, "/v1/content/stages")["stages"]
                ),
                WAIT_S,
            )
        (s,) = mesh.get(first, "/v1/content/stages")["stages"]
        assert s["state"] == "done" and s["held_bytes"] == sum(map(len, files.values())), s
        assert fetched(mesh, first, "http") == s["held_bytes"]
        digest = s["digest"]
        # The operator's command line: stage it on the second agent from the first, and wait.
        parser = argparse.ArgumentParser()
        add_stage_parser(parser.add_subparsers(dest="data_command"))
        flags = ["--agent", first.address, "--identity", str(mesh.cluster_dir)]
        mesh.wait(
            "the first agent's copy gossiped",
            lambda: any(
                v["digest"] == digest
                for n in mesh.get(second, "/v1/nodes")["nodes"]
                for v in n.get("dataset_versions", ())
            ),
        )
        # NAME alone: the newest version a node holds whole.
        args = parser.parse_args(
            ["stage", "cifar", "--nodes", f"{second.node_id[:12]},", "--wait", *flags]
        )
        assert cmd_stage(args) == 0
        out = capsys.readouterr().out
        listed = mesh.get(second, "/v1/nodes")["nodes"]
        host = next(n["host"]["hostname"] for n in listed if n["node_id"] == second.node_id)
        assert f"{host}: cifar done" in out, out  # each node by its host name
        args = parser.parse_args(
            ["stage", f"cifar@{digest}", "--nodes", second.node_id, "--json", *flags]
        )
        assert cmd_stage(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["nodes"][second.node_id]["state"] == "done", doc
        # A stage that fails is reported as failed (--wait polls, it does not start it over).
        args = parser.parse_args(
            ["stage", f"gone@{'ab' * 32}", "--nodes", second.node_id, "--wait", *flags]
        )
        assert cmd_stage(args) == 1
        out = capsys.readouterr().out
        assert f"{host}: staging gone failed: no holder serves" in out, out
        with pytest.raises(UserError, match="no node holds all of 'nothing'"):
            cmd_stage(parser.parse_args(["stage", "nothing", "--nodes", second.node_id, *flags]))
        assert fetched(mesh, second, "peer") == s["held_bytes"]
        status, answer = mesh.command(
            first, "stage", {"name": "cifar", "source": "file:///etc/passwd", "nodes": ["x"]}
        )
        assert status == 400 and "http" in answer["error"], answer
    finally:
        mesh.stop_all()


def test_the_transfer_benchmark_runs_on_a_tiny_size() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "bench.content_xfer", "--mib", "8", "--holders", "1,2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert {"mib", "chunk_bytes", "cores", "runs"} <= set(out)
    assert [r["holders"] for r in out["runs"]] == [1, 2]
    for r in out["runs"]:
        assert r["mb_per_s"] > 0 and sum(r["served_chunks"]) == 2


def test_a_stage_no_longer_wanted_is_cancelled_and_keeps_what_it_fetched(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1"] * 2, extra=("--content-link-bytes-per-s", "131072"))
    m, chunks = make_dataset("unwanted", {"a.bin": 32 * CHUNK})  # 2 MiB at 128 KiB/s: 16 s
    holder, stager = mesh.agents
    preload(holder, m, chunks)
    mesh.start_all()
    try:
        stage(mesh, holder, m, stager)
        mesh.wait("some held", lambda: stage_of(mesh, stager, m).get("held_bytes", 0) >= 4 * CHUNK)
        status, answer = mesh.command(
            holder, "stage", {"name": m.name, "nodes": [stager.node_id], "cancel": True}
        )
        assert status == 200, answer
        assert answer["nodes"][stager.node_id]["state"] == "cancelled", answer
        got = fetched(mesh, stager)
        assert 0 < got < m.total_bytes
        time.sleep(1.0)  # at this rate, a stage still running would have fetched 2 chunks more
        assert fetched(mesh, stager) == got
        assert stage_of(mesh, stager, m)["state"] == "cancelled"
        # Asked again, it goes on from what it holds.
        stage(mesh, holder, m, stager)
        staged(mesh, stager, m)
        assert fetched(mesh, stager) == m.total_bytes
        assert content(mesh, stager, "resumes") == 1
    finally:
        mesh.stop_all()
