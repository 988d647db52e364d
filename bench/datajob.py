"""The job ``python -m bench.data`` submits: get the dataset, read it whole, check it, compute.

Run by the agents as ``python /path/to/datajob.py LEDGER PLAN MODE DATASET COMPUTE_S`` (a file,
so that it needs nothing but the standard library in the job's clean environment). ``PLAN`` is
the benchmark's JSON: each dataset's files with their SHA-256, and where a user without Shoal
would copy it from (each holder's plain HTTP server, and the holder's agent folder).

- ``none``: the job copies its dataset itself from a holder's HTTP server into its working folder
  (from its own host's server when its host holds it; else from the holder its job id picks),
  as users do without Shoal;
- ``stage``, ``shoal``: the agent has put the dataset in place before the job starts; the job
  reads it where ``SHOAL_DATA_<NAME>`` says.

Then it reads every file whole, hashing as it reads, and checks each against the plan: a job on
an incomplete or corrupt copy says so (``verified`` with ``ok`` false) and fails. Then it
computes (sleeps) ``COMPUTE_S``. Each line it appends to the ledger (``O_APPEND``, one ``write``
each): ``start``, ``ready`` (its data is there), ``verified``, ``end``; ``failed`` when its own
copy failed (``none``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import urllib.request
from typing import Any

BLOCK_BYTES = 1 << 20
HTTP_TIMEOUT_S = 60.0


def env_name(dataset: str) -> str:
    """``SHOAL_DATA_<NAME>``: the name upper-cased, ``.`` and ``-`` made ``_`` (as the runner
    names it: ``agent.running.datastage.env_name``)."""
    return "SHOAL_DATA_" + dataset.upper().replace(".", "_").replace("-", "_")


def copy_from_holder(plan: dict[str, Any], dataset: str, job: str) -> str:
    """Copy ``dataset`` over HTTP into ``./copy/<dataset>``; the folder."""
    sources = plan["datasets"][dataset]["sources"]
    here = os.getcwd()
    own = [s for s in sources if any(here.startswith(d.rstrip("/") + "/") for d in s["dirs"])]
    source = (
        own[0] if own else sources[int(hashlib.sha256(job.encode()).hexdigest(), 16) % len(sources)]
    )
    target = os.path.join(here, "copy", dataset)
    for path in plan["datasets"][dataset]["files"]:
        out_path = os.path.join(target, path)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        url = f"{source['url'].rstrip('/')}/{dataset}/{path}"
        with (
            urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer,
            open(out_path, "wb") as out,
        ):
            shutil.copyfileobj(answer, out, BLOCK_BYTES)
    return target


def check(folder: str, files: dict[str, str]) -> tuple[bool, int, str]:
    """Read every file of the plan under ``folder`` whole; (all match, bytes read, why not)."""
    read = 0
    for path, digest in sorted(files.items()):
        h = hashlib.sha256()
        try:
            with open(os.path.join(folder, path), "rb") as f:
                while block := f.read(BLOCK_BYTES):
                    h.update(block)
                    read += len(block)
        except OSError as exc:
            return False, read, f"{path}: {exc.strerror or exc}"
        if h.hexdigest() != digest:
            return False, read, f"{path}: its bytes do not match"
    return True, read, ""


def main() -> int:
    ledger, plan_path, mode, dataset, compute_s = sys.argv[1:6]
    job, attempt = os.environ["SHOAL_JOB_ID"], int(os.environ["SHOAL_ATTEMPT"])
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def line(kind: str, **fields: object) -> None:
        doc = {"job": job, "attempt": attempt, "pid": os.getpid(), "kind": kind, "t": time.time()}
        os.write(fd, (json.dumps({**doc, **fields}) + "\n").encode())

    with open(plan_path) as f:
        plan = json.load(f)
    line("start", mode=mode, dataset=dataset, cwd=os.getcwd())
    copied = None
    try:
        if mode == "none":
            folder = copied = copy_from_holder(plan, dataset, job)
        else:
            folder = os.environ.get(env_name(dataset), "")
            if not folder:
                line("verified", ok=False, bytes=0, why=f"{env_name(dataset)} is not set")
                return 3
    except OSError as exc:  # the copy failed: no data, so nothing read (not a bad copy)
        line("failed", why=f"copy failed: {exc}")
        return 4
    line("ready", folder=folder)
    ok, read, why = check(folder, plan["datasets"][dataset]["files"])
    line("verified", ok=ok, bytes=read, why=why)
    if copied is not None:
        shutil.rmtree(os.path.dirname(copied), ignore_errors=True)
    if not ok:
        return 3
    time.sleep(float(compute_s))
    line("end", how="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
