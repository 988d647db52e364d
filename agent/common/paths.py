"""Where Shoal keeps its files on the operator's machine and on nodes."""

from __future__ import annotations

import importlib.util
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


def source_root() -> Path:
    """The folder that holds Shoal's top-level packages (a checkout, or site-packages): where
    local meshes find the code their agents and jobs import, wherever this module lives."""
    spec = importlib.util.find_spec("agent")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).resolve().parents[1]
