"""``python -m bench.stageonly agent ...``: ``shoal agent`` that refuses every pre-fetch.

The data benchmark's ``stage`` mode (Shoal stages when the job starts, no pre-fetch) runs its
agents this way: the agent has no setting that turns pre-fetch off, so this wraps
``python -m agent.cli`` with :meth:`agent.running.prefetch.Prefetches` refusing each ask, as it
refuses one over its bounds (counted ``prefetch_refused``; the owner asks again later, and is
refused again). Nothing else differs.
"""

from __future__ import annotations

import sys

from agent.running import prefetch

REFUSAL = "pre-fetch is off on this agent (bench.data's stage mode)"


def _refuse_all(self: prefetch.Prefetches, job_id: str) -> str | None:
    return REFUSAL


def main() -> int:
    prefetch.Prefetches._refusal = _refuse_all  # type: ignore[method-assign]
    from agent.cli import main as agent_main

    return agent_main()


if __name__ == "__main__":
    sys.exit(main())
