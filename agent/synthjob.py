"""``python -m agent.synthjob``, as job specs stored before the rooms name it: the synthetic job
now lives in :mod:`agent.sandbox.synthjob`."""

import sys

from agent.sandbox.synthjob import main

if __name__ == "__main__":
    sys.exit(main())
