"""Data that moves: ``python -m bench.data [--hosts N] [--scale X] [--link-mbit M] --seed K``.

Real agents, each in its own network namespace on one bridge (:class:`bench.netlab.Lab`), every
host's link throttled by ``tc`` to ``--link-mbit`` each way. A seeded workload
(:mod:`bench.dataload`): a few datasets of a few hundred MB to a few GB (times ``--scale``), each
held at first by one or two hosts, with Zipf popularity; jobs arriving over ``--window-s``, each
naming one dataset, reading it whole while hashing it (``bench/datajob.py``: a job on an
incomplete or corrupt copy is caught and counted), then computing for a few seconds. The same
workload runs in each mode, on a fresh mesh (new agents, empty stores) on the same lab:

- ``none``: the jobs do not name their dataset to Shoal; each copies it itself from a holder's
  plain HTTP server when it starts (what users do without Shoal);
- ``stage``: the jobs name their dataset; the runner stages it before the job starts, with no
  pre-fetch and no cache kept between jobs;
- ``shoal``: the same with pre-fetch while a job waits and the cache.

A mode whose parts this checkout lacks is reported with ``null`` figures and a ``missing``
reason, never with invented ones.

Bytes on the network are the kernel's interface counters: the bytes every host's ``eth0``
received while the mode ran (this process talks to the agents from the bridge's own address; it
polls nothing while jobs run, it watches the jobs' ledger on disk). Every namespace, process and
folder it made is removed at the end, also on Ctrl-C or SIGTERM (``--keep`` keeps the folder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil

from agent.cli.demo import _Signals
from agent.job.jobspec import JobSpec, new_job_id
from agent.operator.client import ApiError
from bench import dataload, datastaging
from bench.dataload import JobOutcome, Workload
from bench.datamesh import PROFILE, DataMesh, lay_out, write_dataset, write_plan
from bench.netlab import Lab

MODES: Final = ("none", "stage", "shoal")
HTTP_PORT: Final = 8080
SETTLE_S: Final = 600.0
"""The longest a mode waits for its last job once all are submitted."""
BACKGROUND_S: Final = 3.0
THROUGHPUT_S: Final = 20.0
"""The staging probe's dataset: this many seconds of one link at full scale."""
FAULT_S: Final = 4.0
"""Each fault's dataset: this many seconds of one link at full scale."""
"""How long the idle mesh's own traffic (gossip) is measured before each mode."""


def mode_missing(mode: str) -> str | None:
    """Why this checkout cannot run ``mode`` at all, or ``None``."""
    if mode == "none":
        return None
    if importlib.util.find_spec("agent.running.datastage") is None:
        return "the runner does not stage a job's datasets before it starts on this checkout"
    return None


def mode_lacks(mode: str) -> str | None:
    """What ``mode`` runs without on this checkout (its figures are real, of less), or ``None``."""
    if mode == "shoal" and importlib.util.find_spec("agent.running.prefetch") is None:
        return "pre-fetch while a job waits is not on this checkout: the cache alone"
    return None


def mode_config(mode: str, workload: Workload) -> str:
    """The agents' config file for ``mode``.

    ``stage``: the store may hold the largest dataset and no more, and evicts what no job here
    reads at its next scan (every second): nothing is kept between jobs. ``shoal``: the
    defaults (half the disk, evicting from 90% of it to 70%).
    """
    if mode != "stage":
        return ""
    largest = max(d.total_bytes for d in workload.datasets)
    budget = largest + largest // 20 + (16 << 20)
    return (
        f"store_budget_bytes = {budget}\n"
        "store_high = 0.02\nstore_low = 0.01\ndatasets_rescan_s = 1.0\n"
    )


# -- one mode -------------------------------------------------------------------------------------


@dataclass
class ModeRun:
    mode: str
    mesh: DataMesh
    workload: Workload
    ledger: Path
    plan: Path
    script: Path
    rng: random.Random
    submitted: dict[str, tuple[str, float]] = field(default_factory=dict)
    """job id -> (dataset, when submitted)."""
    submit_failures: list[str] = field(default_factory=list)

    async def submit_all(self) -> None:
        python = self.mesh.job_python().executable
        t0 = time.monotonic()
        clients = [self.mesh.client(i) for i in range(self.mesh.nodes)]
        try:
            for job in self.workload.jobs:
                delay = job.at_s - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                command = [python, str(self.script), str(self.ledger), str(self.plan)]
                command += [self.mode, job.dataset, f"{job.compute_s:.3f}"]
                fields: dict[str, Any] = {
                    "command": command,
                    "resources": {"gpus_per_node": 1},
                    "max_runtime_s": 3600,
                }
                if self.mode != "none":
                    fields["datasets"] = [job.dataset]
                spec = JobSpec.from_human(fields)
                job_id, at = new_job_id(), time.time()
                through = clients[self.rng.randrange(len(clients))]
                try:
                    await through.submit(spec, job_id)
                    self.submitted[job_id] = (job.dataset, at)
                except (ApiError, OSError, TimeoutError) as exc:
                    self.submit_failures.append(f"{job_id}: {exc}")
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    def ledger_lines(self) -> list[dict[str, Any]]:
        lines = []
        with contextlib.suppress(OSError), self.ledger.open() as f:
            for raw in f:
                with contextlib.suppress(ValueError):
                    lines.append(json.loads(raw))
        return lines

    def ended(self) -> set[str]:
        """Jobs whose last line says they are done: ``end``, a failed check, a failed copy."""
        return {
            line["job"]
            for line in self.ledger_lines()
            if line["kind"] in ("end", "failed") or (line["kind"] == "verified" and not line["ok"])
        }

    async def records(self) -> dict[str, dict[str, Any]]:
        """The newest record of each job any agent lists."""
        newest: dict[str, dict[str, Any]] = {}
        for i in range(self.mesh.nodes):
            client = self.mesh.client(i)
            try:
                listing = await client.jobs()
            except (ApiError, OSError, TimeoutError):
                continue
            finally:
                await client.close()
            for rec in listing:
                old = newest.get(rec["job_id"])
                if old is None or int(rec.get("gen") or 0) >= int(old.get("gen") or 0):
                    newest[rec["job_id"]] = rec
        return newest

    def outcomes(self, records: dict[str, dict[str, Any]]) -> list[JobOutcome]:
        index = {a.node_id: a.index for a in self.mesh.agents}
        lines: dict[str, list[dict[str, Any]]] = {}
        for line in self.ledger_lines():
            lines.setdefault(line["job"], []).append(line)
        out = []
        for job_id, (dataset, at) in self.submitted.items():
            rec = records.get(job_id, {})
            mine = lines.get(job_id, [])
            last = max((line["attempt"] for line in mine), default=None)
            mine = [line for line in mine if line["attempt"] == last]
            ready = next((line["t"] for line in mine if line["kind"] == "ready"), None)
            verified = next((line["ok"] for line in mine if line["kind"] == "verified"), None)
            out.append(
                JobOutcome(
                    job_id=job_id,
                    dataset=dataset,
                    state=str(rec.get("state", "unknown")),
                    runner=index.get(rec.get("runner") or ""),
                    submitted_at=float(rec.get("submitted_at") or at),
                    started_at=rec.get("started_at"),
                    finished_at=rec.get("finished_at"),
                    ready_at=ready,
                    verified=verified,
                )
            )
        return out


def network_bytes(lab: Lab) -> int:
    """What every host's link has received so far."""
    return sum(lab.link_bytes(i).rx_bytes for i in range(lab.hosts))


async def _run_mode(run: ModeRun, lab: Lab) -> dict[str, Any]:
    mesh = run.mesh
    converged_s = await mesh.wait_converged()
    idle_from = network_bytes(lab)
    await asyncio.sleep(BACKGROUND_S)
    background_per_s = (network_bytes(lab) - idle_from) / BACKGROUND_S
    before, started = network_bytes(lab), time.monotonic()
    await run.submit_all()
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and not set(run.submitted) <= run.ended():
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # the last ends reach their owners
    on_network = network_bytes(lab) - before
    seconds = time.monotonic() - started
    records = await run.records()
    job_data = await asyncio.to_thread(mesh.counters, "shoal_job_data_total")
    prefetch = await asyncio.to_thread(mesh.counters, "shoal_prefetch_total")
    figures = dataload.mode_figures(
        run.workload, run.outcomes(records), on_network, len(run.workload.jobs)
    )
    figures.update(
        converged_s=round(converged_s, 3),
        mode_s=round(seconds, 1),
        bytes_background=int(background_per_s * seconds),
        store_hit_rate=(
            round(job_data["hits"] / looked, 3)
            if (looked := job_data["hits"] + job_data["misses"])
            else None
        ),
        agents_job_data=dict(sorted(job_data.items())),
        agents_prefetch=dict(sorted(prefetch.items())),
        submit_failures=run.submit_failures[:5],
    )
    return figures


def run_mode(
    mode: str, lab: Lab, root: Path, workload: Workload, plan: Path, script: Path
) -> dict[str, Any]:
    folder = root / mode
    folder.mkdir()
    folder.chmod(0o711)
    ledger = folder / "ledger.jsonl"
    ledger.touch()
    ledger.chmod(0o666)
    config = mode_config(mode, workload)
    mesh = DataMesh(
        folder,
        lab.hosts,
        profiles=(PROFILE,),
        lab=lab,
        config_text=config,
        prefetch=mode != "stage",
    )
    mesh.create()
    for agent in mesh.agents:
        held = [d.name for d in workload.datasets if agent.index in d.holders]
        lay_out(root / "data", agent.datasets_dir, held)
    run = ModeRun(mode, mesh, workload, ledger, plan, script, random.Random(workload.seed))
    try:
        mesh.start()
        return asyncio.run(_run_mode(run, lab))
    finally:
        mesh.stop()
        _kill_jobs(run)


def _kill_jobs(run: ModeRun) -> None:
    """Any job process still alive once its agent is gone (none should be)."""
    for line in run.ledger_lines():
        if line["kind"] == "start":
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(line["pid"])
                if abs(p.create_time() - line["t"]) < 5:
                    p.kill()


def missing_mode(reason: str, jobs: int) -> dict[str, Any]:
    """A mode this checkout cannot run: its figures ``null``, and why."""
    return {**dict.fromkeys(dataload.MODE_FIELDS), "jobs": jobs, "missing": reason}


# -- one stream, the plain servers ----------------------------------------------------------------

_GET = """
import sys, time, urllib.request
t = time.monotonic(); n = 0
with urllib.request.urlopen(sys.argv[1], timeout=60) as r:
    while b := r.read(1 << 20):
        n += len(b)
print(n, time.monotonic() - t)
"""


def one_stream(lab: Lab, url: str, to: int) -> float:
    """Bytes per second of one HTTP download into host ``to``."""
    out = subprocess.run(
        lab.command(to, [sys.executable, "-c", _GET, url]),
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout.split()
    return int(out[0]) / float(out[1])


@contextlib.contextmanager
def plain_servers(lab: Lab, root: Path, data: Path, workload: Workload) -> Any:
    """Each holder's plain HTTP server (``python -m http.server``) on its own address, serving
    the datasets it holds; yields each holder's base URL."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: dict[int, str] = {}
    try:
        for i in range(lab.hosts):
            held = [d.name for d in workload.datasets if i in d.holders]
            if not held:
                continue
            folder = root / "served" / f"h{i}"
            lay_out(data, folder, held)
            argv = [sys.executable, "-m", "http.server", str(HTTP_PORT)]
            argv += ["--bind", lab.address(i), "--directory", str(folder)]
            procs.append(
                subprocess.Popen(
                    lab.command(i, argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
            urls[i] = f"http://{lab.address(i)}:{HTTP_PORT}"
        _wait_serving(lab, urls)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def _wait_serving(lab: Lab, urls: dict[int, str]) -> None:
    probe = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)"
    for i, url in urls.items():
        for _ in range(100):
            done = subprocess.run(lab.command(i, [sys.executable, "-c", probe, url + "/"]),
                                  capture_output=True, timeout=10)  # fmt: skip
            if done.returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"the plain server of host {i} did not answer")


# -- the run ---------------------------------------------------------------------------------------


def run(
    *,
    hosts: int,
    datasets: int,
    jobs: int,
    scale: float,
    window_s: float,
    link_mbit: float,
    seed: int,
    modes: tuple[str, ...] = MODES,
    faults: bool = False,
    throughput: bool = True,
    keep: bool = False,
) -> dict[str, Any]:
    workload = dataload.draw(
        seed, hosts=hosts, datasets=datasets, jobs=jobs, scale=scale, window_s=window_s
    )
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="shoal-data-"))
    root.chmod(0o711)  # jobs run as the job user when the agents run as root
    lab = Lab(hosts, prefix=f"sd{os.getpid() % 100000}", subnet=100 + os.getpid() % 100)
    link_rate = link_mbit * 1e6 / 8
    figures: dict[str, Any] = {"modes": {}}
    staging_missing = mode_missing("stage")
    with _Signals() as signals:
        try:
            data = root / "data"
            hashes = {
                d.name: write_dataset(data / d.name, f"{seed}/{d.name}", d.file_bytes)
                for d in workload.datasets
            }
            script = root / "datajob.py"
            shutil.copyfile(Path(__file__).with_name("datajob.py"), script)
            script.chmod(0o644)
            lab.open()
            for i in range(hosts):
                lab.shape(i, link_mbit)
            with plain_servers(lab, root, data, workload) as urls:
                plan = write_plan(root / "plan.json", _plan(workload, hashes, urls, root))
                first = workload.datasets[0]
                reader = next(i for i in range(hosts) if i not in first.holders)
                stream_url = f"{urls[first.holders[0]]}/{first.name}/part-00.bin"
                figures["link_bytes_per_s"] = round(one_stream(lab, stream_url, reader))
                figures["link_rate_bytes_per_s"] = round(link_rate)
                with lab.inside_switch():
                    for mode in modes:
                        reason = mode_missing(mode)
                        if reason is not None:
                            figures["modes"][mode] = missing_mode(reason, len(workload.jobs))
                            continue
                        out = run_mode(mode, lab, root, workload, plan, script)
                        if (lacks := mode_lacks(mode)) is not None:
                            out["without"] = lacks
                        figures["modes"][mode] = out
            probe = datastaging.Probe(lab, root, link_mbit, seed)
            with lab.inside_switch():
                figures["stage_throughput_bytes_per_s"] = {"1": None, "3": None}
                if staging_missing is not None:
                    figures["stage_throughput_missing"] = staging_missing
                elif throughput:
                    size = max(8 << 20, int(link_rate * THROUGHPUT_S * min(1.0, scale)))
                    figures.update(datastaging.throughput(probe, size))
                if faults:
                    size = max(8 << 20, int(link_rate * FAULT_S * min(1.0, scale)))
                    figures["faults"] = (
                        {"missing": staging_missing}
                        if staging_missing is not None
                        else datastaging.faults(probe, size, script)
                    )
        finally:
            signals.hold()
            lab.close()
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
    figures["jobs_on_bad_copy"] = sum(
        m.get("jobs_on_bad_copy") or 0 for m in figures["modes"].values()
    )
    figures.update(
        seed=seed,
        hosts=hosts,
        scale=scale,
        link_mbit=link_mbit,
        window_s=window_s,
        datasets=[
            {
                "name": d.name,
                "bytes": d.total_bytes,
                "holders": list(d.holders),
                "popularity": round(d.popularity, 3),
            }
            for d in workload.datasets
        ],
        cores=os.cpu_count(),
        wall_s=round(time.monotonic() - started, 1),
    )
    if keep:
        figures["kept"] = str(root)
    return figures


def _plan(
    workload: Workload, hashes: dict[str, dict[str, str]], urls: dict[int, str], root: Path
) -> dict[str, Any]:
    """What the jobs read: each dataset's files and SHA-256, and its holders' servers."""
    return {
        d.name: {
            "files": hashes[d.name],
            "sources": [
                {"url": urls[h], "dirs": [str(root / m / f"agent-{h:02d}") for m in MODES]}
                for h in d.holders
            ],
        }
        for d in workload.datasets
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.data", description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=5)
    p.add_argument("--datasets", type=int, default=4)
    p.add_argument("--jobs", type=int, default=24)
    p.add_argument("--scale", type=float, default=1.0, help="dataset sizes times this")
    p.add_argument("--window-s", type=float, default=60.0, help="jobs arrive over this")
    p.add_argument("--link-mbit", type=float, default=200.0, help="each host's link, each way")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES), help="which modes, comma-separated")
    p.add_argument("--faults", action="store_true", help="also the fault scenarios")
    p.add_argument("--no-throughput", action="store_true", help="skip staging from 1 and 3 holders")
    p.add_argument("--keep", action="store_true", help="keep the folder (agent logs, ledgers)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if any(m not in MODES for m in modes):
        p.error(f"--modes takes {', '.join(MODES)}")
    if args.hosts < 2 or args.hosts > 200 or args.jobs < 1 or args.datasets < 1:
        p.error("--hosts must be 2..200, --jobs and --datasets at least 1")
    if args.scale <= 0 or args.link_mbit <= 0 or args.window_s < 0:
        p.error("--scale and --link-mbit must be positive, --window-s not negative")
    try:
        figures = run(
            hosts=args.hosts,
            datasets=args.datasets,
            jobs=args.jobs,
            scale=args.scale,
            window_s=args.window_s,
            link_mbit=args.link_mbit,
            seed=args.seed,
            modes=modes,
            faults=args.faults,
            throughput=not args.no_throughput,
            keep=args.keep,
        )
    except KeyboardInterrupt:
        print("stopped; every namespace, agent and job process it started is gone", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:32} {value}")
    return 0 if figures["jobs_on_bad_copy"] == 0 else 1


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
