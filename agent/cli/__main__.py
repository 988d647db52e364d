"""``python -m agent.cli``: what service units run (``python -m agent.cli agent``)."""

import sys

from agent.cli import main

sys.exit(main())
