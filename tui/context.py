"""What screens and palette providers read of the app they run in.

They type ``self.app`` as :class:`ShoalContext` and never import the app: the app assembles them,
sets these attributes, and takes their requests as messages (:mod:`tui.messages`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tui.model import History, MeshSnapshot
from tui.operations import Operations
from tui.source import MeshSource
from tui.widgets.render import Glyphs, Palette


class ShoalContext(Protocol):
    """The app as its screens see it: read, never set."""

    @property
    def source(self) -> MeshSource:
        """The mesh (the screens use its identity, its clock and its job logs)."""

    @property
    def readonly(self) -> bool:
        """``--readonly``: every mutating key is hidden and refused."""

    @property
    def identity_dir(self) -> Path | None:
        """The cluster directory of ``shoal init``, which adding hosts needs."""

    @property
    def bootstrap_args(self) -> tuple[str, ...]:
        """Extra ``shoal bootstrap`` flags for every host added from the TUI."""

    @property
    def snapshot(self) -> MeshSnapshot:
        """The mesh as shown now."""

    @property
    def history(self) -> History:
        """Utilization over the last minutes, for the sparklines."""

    @property
    def palette(self) -> Palette:
        """The theme's colours by level."""

    @property
    def glyphs(self) -> Glyphs:
        """Unicode or ASCII drawing characters."""

    @property
    def connection(self) -> str:
        """``connecting``, ``connected`` or ``unreachable``."""

    @property
    def connection_error(self) -> str | None:
        """Why the mesh is unreachable, when it is."""

    @property
    def operations(self) -> Operations:
        """What runs now, every outcome, and whether hosts can be added."""

    def key_display(self) -> dict[str, str]:
        """Binding id -> the key it is on now (after the keymap), for the help screen."""
        ...
