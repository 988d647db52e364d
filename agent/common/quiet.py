"""What users see of warnings: Shoal's own, never a library's.

A library's warning (asyncssh's ``CryptographyDeprecationWarning`` about DSA when cryptography is
newer than it, say) tells the person at the terminal nothing they can act on, and shows above a
command's one-line answer. Every entry point a user or a service starts (``shoal``, the TUI it
loads, the bootstrap helpers run on a host) calls :func:`quiet_third_party_warnings` first. A user
who asks for warnings with ``-W`` or ``PYTHONWARNINGS`` gets exactly what they asked for. The test
suite does the opposite: every warning is an error there unless ``pyproject.toml`` accepts it by
name, with its reason.
"""

from __future__ import annotations

import sys
import warnings

OUR_PACKAGES = ("agent", "gossip", "probers", "tui", "bench")
"""Top-level packages whose warnings are Shoal's own, and still shown."""


def quiet_third_party_warnings() -> None:
    """Ignore warnings raised from any module outside :data:`OUR_PACKAGES`; keep ours shown."""
    if sys.warnoptions:  # -W or PYTHONWARNINGS: the user's choice wins
        return
    warnings.filterwarnings("ignore")
    ours = "|".join(OUR_PACKAGES)
    warnings.filterwarnings("default", module=rf"({ours})(\.|$)")
