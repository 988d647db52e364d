"""The footer: the keys that work here, on one line, redrawn (not rebuilt) when they change.

Textual's own footer mounts a widget per key and rebuilds them all whenever the bindings change,
which is on every change of focus (opening the filter bar, closing a dialog): tens of
milliseconds each time. This one is a single line of text drawn from the screen's active
bindings; a binding its screen disables is dimmed, one it refuses (``--readonly``) is absent.

The line never cuts a hint: on a narrow terminal (80 columns) the hints that do not fit whole
are left out, the last ones first, but the help key always stays (its screen lists every key);
the palette key is shown at the right when there is room for it.
"""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text
from textual.screen import Screen
from textual.widget import Widget

from tui.widgets.render import DEFAULT_PALETTE, Palette

ALWAYS_SHOWN = frozenset({"help"})
"""Actions whose hint is kept when others are left out for want of room."""


class Hint(NamedTuple):
    key: str
    description: str
    action: str
    enabled: bool

    @property
    def text(self) -> str:
        return f" {self.key} {self.description} "


def fitting(hints: list[Hint], width: int) -> list[Hint]:
    """``hints`` in order, without the last ones that do not fit ``width`` whole (those in
    :data:`ALWAYS_SHOWN` are kept)."""
    kept = list(hints)
    while sum(len(h.text) for h in kept) > width:
        droppable = [i for i, h in enumerate(kept) if h.action not in ALWAYS_SHOWN]
        if not droppable:
            break
        del kept[droppable[-1]]
    return kept


class KeyFooter(Widget):
    DEFAULT_CSS = """
    KeyFooter { dock: bottom; height: 1; background: $panel; color: $foreground; }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        self.refresh()

    def hints(self) -> tuple[list[Hint], Hint | None]:
        """Every hint of the keys that work here, in order, and the palette's (apart)."""
        out: list[Hint] = []
        seen: set[str] = set()
        palette: Hint | None = None
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            key = self.app.get_key_display(binding)
            if binding.action == "command_palette":
                palette = Hint(key, "Palette", binding.action, True)
                continue
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            out.append(Hint(key, binding.description, binding.action, enabled))
        return out, palette

    def shown(self) -> list[Hint]:
        """The hints drawn at the present width (the palette's last, when it fits)."""
        hints, palette = self.hints()
        kept = fitting(hints, self.size.width)
        if palette is not None:
            used = sum(len(h.text) for h in kept)
            if self.size.width - used >= len(palette.text):
                kept.append(palette)
        return kept

    def render(self) -> Text:
        colours: Palette = getattr(self.app, "palette", DEFAULT_PALETTE)
        dim = colours.muted
        line = Text(no_wrap=True, overflow="crop", end="")
        shown = self.shown()
        for hint in shown:
            if hint.action == "command_palette":
                line.append(" " * (self.size.width - line.cell_len - len(hint.text) + 1))
                line.append(f"{hint.key}", colours.accent)
                line.append(f" {hint.description} ")
                continue
            line.append(f" {hint.key}", colours.accent if hint.enabled else dim)
            line.append(f" {hint.description} ", None if hint.enabled else dim)
        return line
