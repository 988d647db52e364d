"""Developer tools run from a checkout (never installed with Shoal).

Each is an entry point a person starts (``python -m tools.screenshots``): a library's warnings at
import (asyncssh's about DSA) are kept off the terminal as ``shoal`` keeps them
(:mod:`agent.common.quiet`), before the tool's own imports load that library."""

from agent.common.quiet import quiet_third_party_warnings

quiet_third_party_warnings()
