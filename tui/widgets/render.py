"""Small renderers shared by the views: bars, sparklines, levels, units and ages.

Bars use eighth blocks (``▏▎▍▌▋▊▉█``) or, with :data:`ASCII`, ``#`` and ``.``; sparklines use
``▁▂▃▄▅▆▇█`` or ``_.-=+*#``. Colours come from a :class:`Palette` built from the app's theme
variables (``$success``, ``$warning``, ``$error``), so the colour-blind-safe theme changes them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

Level = Literal["ok", "warn", "bad", "muted"]
Part = tuple[str, Style | None]
"""A run of text and its style (``None``: the widget's own): lines are drawn from these."""
NA: Final = "N/A"
_EIGHTHS: Final = " ▏▎▍▌▋▊▉█"
_SPARK: Final = "▁▂▃▄▅▆▇█"
_SPARK_ASCII: Final = "_.-=+*#"
_GIB: Final = 1024**3


@dataclass(frozen=True, slots=True)
class Glyphs:
    """The characters bars and sparklines are drawn with."""

    ascii: bool = False

    def bar(self, frac: float | None, width: int) -> tuple[str, str]:
        """``(filled, empty)`` parts of a bar ``width`` cells wide; unknown is all empty."""
        if width <= 0:
            return "", ""
        if frac is None:
            return "", ("?" if self.ascii else "·") * width
        frac = min(1.0, max(0.0, frac))
        if self.ascii:
            full = round(frac * width)
            return "#" * full, "." * (width - full)
        eighths = round(frac * width * 8)
        full, part = divmod(eighths, 8)
        filled = "█" * full + (_EIGHTHS[part] if part and full < width else "")
        return filled, " " * (width - len(filled))

    def spark(self, values: Sequence[float], width: int) -> str:
        """The last values (0..100) squeezed into ``width`` cells; each cell shows its peak."""
        if width <= 0:
            return ""
        chars = _SPARK_ASCII if self.ascii else _SPARK
        if not values:
            return " " * width
        seq = list(values)
        n = len(seq)
        if n > width:
            step = n / width
            picked = [
                max(seq[int(i * step) : max(int(i * step) + 1, int((i + 1) * step))])
                for i in range(width)
            ]
        else:
            picked = seq
        top = len(chars) - 1
        out = "".join(chars[min(top, max(0, round(v / 100.0 * top)))] for v in picked)
        return out.rjust(width)


UNICODE_GLYPHS: Final = Glyphs()


@dataclass(frozen=True, slots=True)
class Palette:
    """Styles for each level, resolved from the theme's variables."""

    ok: Style
    warn: Style
    bad: Style
    muted: Style
    accent: Style
    track: Style
    selected: Style
    group: Style
    header: Style

    def of(self, level: Level) -> Style:
        style: Style = getattr(self, level)
        return style

    @classmethod
    def from_variables(cls, variables: Mapping[str, str]) -> Palette:
        """Styles from theme variables; a variable that is not a plain colour is skipped."""

        def get(*names: str) -> str:
            for name in names:
                value = variables.get(name, "")
                if _plain_colour(value):
                    return value[:7]
            return "default"

        return cls(
            ok=Style(color=get("success")),
            warn=Style(color=get("warning")),
            bad=Style(color=get("error"), bold=True),
            muted=Style(color=get("foreground-darken-3", "foreground-darken-2")),
            accent=Style(color=get("accent"), bold=True),
            track=Style(bgcolor=get("surface-lighten-1", "panel")),
            selected=Style(bgcolor=get("panel-lighten-1", "panel")),
            group=Style(color=get("primary"), bold=True),
            header=Style(color=get("foreground"), bgcolor=get("panel"), bold=True),
        )


def _plain_colour(value: str) -> bool:
    return len(value) in (7, 9) and value.startswith("#")


DEFAULT_PALETTE: Final = Palette.from_variables(
    {
        "success": "#7FD17F",
        "warning": "#E4C07B",
        "error": "#EF616D",
        "foreground-darken-3": "#9AA0AA",
        "accent": "#5FD7D7",
        "surface-lighten-1": "#272C36",
        "panel-lighten-1": "#323946",
        "primary": "#4EA1FF",
        "foreground": "#D8DEE9",
        "panel": "#222936",
    }
)


def load_level(frac: float | None) -> Level:
    """Utilization or memory: calm below 60 %, busy below 90 %, full above."""
    if frac is None:
        return "muted"
    if frac < 0.6:
        return "ok"
    return "warn" if frac < 0.9 else "bad"


def temp_level(temp_c: float | None, slowdown_c: float | None) -> Level:
    """Temperature against this GPU's own slowdown threshold (else a generic 85 °C)."""
    if temp_c is None:
        return "muted"
    limit = slowdown_c if slowdown_c is not None else 85.0
    if temp_c < limit - 15.0:
        return "ok"
    return "warn" if temp_c < limit - 5.0 else "bad"


def state_level(state: str) -> Level:
    levels: dict[str, Level] = {
        "alive": "ok",
        "schedulable": "ok",
        "running": "ok",
        "succeeded": "ok",
        "suspect": "warn",
        "cordoned": "warn",
        "draining": "warn",
        "pending": "warn",
        "placing": "warn",
        "migrating": "warn",
        "drained": "muted",
        "left": "muted",
        "cancelled": "muted",
        "dead": "bad",
        "failed": "bad",
        "lost": "bad",
    }
    return levels.get(state, "muted")


def bar_parts(
    frac: float | None, width: int, glyphs: Glyphs, palette: Palette, level: Level
) -> tuple[Part, Part]:
    """A bar as two runs: the filled part in the level's colour, the rest on the track."""
    filled, empty = glyphs.bar(frac, width)
    return (
        (filled, palette.of(level) + palette.track),
        (empty, palette.track if not glyphs.ascii else palette.muted),
    )


def line_strip(parts: Iterable[Part], width: int, base: Style) -> Strip:
    """One line of exactly ``width`` cells from runs of text, cropped or padded with spaces.

    ``base`` (the widget's style) goes under every run, so colours from the theme show through.
    No rich ``Text`` is built: a line on screen costs a few segments.
    """
    segments: list[Segment] = []
    used = 0
    for text, style in parts:
        if not text:
            continue
        n = len(text) if text.isascii() else cell_len(text)
        if used + n > width:
            text, n = set_cell_size(text, width - used), width - used
        segments.append(Segment(text, base + style if style is not None else base))
        used += n
        if used >= width:
            break
    if used < width:
        segments.append(Segment(" " * (width - used), base))
    return Strip(segments, width)


# -- units -----------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def temp(value_c: float | None) -> str:
    return NA if value_c is None else f"{value_c:.0f}°C"


def gib(value: int | None) -> str:
    if value is None:
        return "?"
    g = value / _GIB
    return f"{g:.0f}" if g >= 10 else f"{g:.1f}"


def mem_pair(used: int | None, total: int | None) -> str:
    """``66/80G``; a side unknown is ``?``; both unknown is ``N/A``."""
    if used is None and total is None:
        return NA
    return f"{gib(used)}/{gib(total)}G"


def watts(power_mw: int | None, limit_mw: int | None) -> str:
    if power_mw is None and limit_mw is None:
        return NA
    now = "?" if power_mw is None else f"{power_mw / 1000:.0f}"
    cap = "?" if limit_mw is None else f"{limit_mw / 1000:.0f}"
    return f"{now}/{cap}W"


def duration(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3.5h``, ``2d``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.0f}d"


def bandwidth(mbps: int | None) -> str:
    if mbps is None:
        return "?"
    gbytes = mbps / 8000
    return f"{gbytes / 1000:.1f}TB/s" if gbytes >= 1000 else f"{gbytes:.0f}GB/s"


_ONE_LINE: Final = str.maketrans({"\n": "↵", "\r": "", "\t": " "})


def oneline(text: str) -> str:
    """``text`` fit for one line of a table: newlines shown as ``↵``, other controls dropped."""
    text = text.translate(_ONE_LINE)
    return text if text.isprintable() else "".join(c for c in text if c.isprintable())


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
