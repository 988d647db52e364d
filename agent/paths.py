"""Where Shoal keeps its files on the operator's machine and on nodes."""

from __future__ import annotations

import os
from pathlib import Path


def config_home() -> Path:
    """``$SHOAL_HOME``, else ``$XDG_CONFIG_HOME/shoal``, else ``~/.config/shoal``."""
    explicit = os.environ.get("SHOAL_HOME")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "shoal"


def default_cluster_dir() -> Path:
    """The operator's cluster directory: the CA and the operator's own identity."""
    return config_home() / "cluster"


def cache_home() -> Path:
    """``$XDG_CACHE_HOME/shoal``, else ``~/.cache/shoal``: what can be made again (wheels)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "shoal"
