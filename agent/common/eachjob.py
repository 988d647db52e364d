"""One job's failure stops no loop over many jobs.

A loop over many jobs (the member-gone sweep, the periodic sweep of stored copies, the owner's
placement pass, a restart's resume) runs each job's step inside :func:`one_job`: an error in it
is logged with its traceback and counted by step (``shoal_job_step_errors_total``), and the loop
goes on with the next job. A cancellation is not an error: it goes through.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator

log = logging.getLogger("shoal.owner")


@contextlib.contextmanager
def one_job(errors: Counter[str], step: str, job_id: str) -> Iterator[None]:
    """Run one job's ``step``; an ``Exception`` in it is logged and counted in ``errors``."""
    try:
        yield
    except Exception:
        errors[step] += 1
        log.exception("job %s: %s failed; the other jobs go on", job_id[:8], step)
