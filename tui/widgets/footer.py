"""The footer: the keys that work here, on one line, redrawn (not rebuilt) when they change.

Textual's own footer mounts a widget per key and rebuilds them all whenever the bindings change,
which is on every change of focus (opening the filter bar, closing a dialog): tens of
milliseconds each time. This one is a single line of text drawn from the screen's active
bindings; a binding its screen disables is dimmed, one it refuses (``--readonly``) is absent.
"""

from __future__ import annotations

from rich.text import Text
from textual.screen import Screen
from textual.widget import Widget

from tui.widgets.render import DEFAULT_PALETTE, Palette


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

    def render(self) -> Text:
        palette: Palette = getattr(self.app, "palette", DEFAULT_PALETTE)
        key_style = palette.accent
        dim = palette.muted
        line = Text(no_wrap=True, overflow="crop", end="")
        seen: set[str] = set()
        palette_key: str | None = None
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if binding.action == "command_palette":
                palette_key = self.app.get_key_display(binding)
                continue
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            line.append(f" {self.app.get_key_display(binding)}", key_style if enabled else dim)
            line.append(f" {binding.description} ", None if enabled else dim)
        if palette_key is not None:
            tail = Text(no_wrap=True, end="")
            tail.append(f"{palette_key}", key_style)
            tail.append(" Palette ")
            room = self.size.width - line.cell_len - tail.cell_len
            if room >= 1:
                line.append(" " * room)
                line.append_text(tail)
        return line
