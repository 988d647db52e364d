"""``shoal bootstrap``: install, certify, start and verify Shoal agents on hosts over SSH.

One module per concern: :mod:`.hosts` (targets and the hosts file), :mod:`.ssh` (connections and
the host-key policy), :mod:`.probe` (what a host has: OS, architecture, Python, GPU drivers),
:mod:`.install` (venv and Shoal itself), :mod:`.keygen` and :mod:`.certify` (the node key made on
the host, its certificate signed here), :mod:`.agentconfig` (the agent's TOML), :mod:`.service`
(systemd, launchd or a supervised process), :mod:`.mesh` (join confirmation, drain),
:mod:`.wheelhouse` (offline installs), :mod:`.shipping` (this checkout's build and its
dependencies, shipped when the index does not have them), :mod:`.runner` (one host, end to end,
undoing what it created on failure), :mod:`.wiring` (the seeds of each host, and the check that
every host sees every other), :mod:`.fleetrun` (many hosts at once, remembered in fleet.toml)
and :mod:`.display` (progress and summary).
"""

from __future__ import annotations
