"""``python -m bench.sched``: see :mod:`bench.sched.cli`."""

from __future__ import annotations

from bench.sched.cli import main

raise SystemExit(main())
