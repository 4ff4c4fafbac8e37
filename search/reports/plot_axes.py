"""What every report plot shares: one colour per method, log axes labelled with plain numbers, saving.

Each plot returns its matplotlib Figure (built without pyplot: no global state, nothing to close) and saves it
when given a path; tests read axes, ticks and artists from the figure. matplotlib is imported only when a plot is
drawn, so that `compare`'s scoring and the light commands never pay for it.
"""

from __future__ import annotations

import math
from pathlib import Path

from longrope.search.reports.compare_result import base_method

TICK_MANTISSAS = (
    (1, 2, 5),
    (1, 2, 3, 5),
    (1, 1.5, 2, 3, 4, 5, 7),
    (1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9),
)


def method_colours(names) -> dict[str, str]:
    """One colour per method, shared by its (vLLM) twin: colours follow the order of the base names in the
    result, so the perplexity, factors and needle plots of one result agree. Grey is left out: it is the colour
    of the plots' reference lines."""
    from matplotlib import colormaps  # matplotlib: only when drawing
    from matplotlib.colors import to_hex  # matplotlib: only when drawing

    bases = list(dict.fromkeys(base_method(name) for name in names))
    if len(bases) <= 9:
        palette = [colormaps["tab10"](k) for k in range(10) if k != 7]
    else:
        palette = [colormaps["tab20"](k) for k in range(20) if k not in (14, 15)]
    return {name: to_hex(palette[bases.index(base_method(name)) % len(palette)]) for name in names}


def nice_ticks(low: float, high: float, most: int = 10) -> list[float]:
    """Ticks for a log axis as plain numbers: the finest 1-2-5-like series with at most `most` ticks in range."""
    decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
    chosen: list[float] = []
    for mantissas in TICK_MANTISSAS:
        ticks = sorted({float(f"{m * 10.0**d:.6g}") for d in decades for m in mantissas if low <= m * 10.0**d <= high})
        if len(ticks) > most and chosen:
            break
        chosen = ticks
    return chosen


# enclosing_log_ticks's series, coarse to fine: decades, TICK_MANTISSAS, then every tenth (a narrow range, 3.60 to 3.65)
ENCLOSING_MANTISSAS = ((1,), *TICK_MANTISSAS, tuple(k / 10 for k in range(10, 100)))


def enclosing_log_ticks(low: float, high: float, most: int = 10) -> list[float]:
    """Ticks for a log axis whose first is at or below `low` and last at or above `high`, so that every value drawn
    lies between two labelled ticks (an axis cut at the data's ends can leave a whole range unlabelled: final
    perplexities of 3.2-3.7 under a first label of 4), with a 1% margin so a dot at the end is drawn whole. The
    finest 1-2-5-like series with at most `most` ticks, and always two at least."""
    decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 2)
    chosen: list[float] = []
    for mantissas in ENCLOSING_MANTISSAS:
        series = sorted({float(f"{m * 10.0**d:.6g}") for d in decades for m in mantissas})
        below = max(t for t in series if t <= low / 1.01)
        above = min(t for t in series if t >= high * 1.01)
        ticks = [t for t in series if below <= t <= above]
        if len(ticks) > most and chosen:
            break
        chosen = ticks
    return chosen


def log_axis(axis, low: float, high: float, ticks: list[float] | None = None) -> None:
    """A log axis labelled with plain numbers (no 10^x, no unlabeled minor ticks): `ticks`, else `nice_ticks`."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # matplotlib: only when drawing

    axis.set_major_locator(FixedLocator(ticks if ticks is not None else nice_ticks(low, high)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(NullLocator())


def save_figure(fig, path: Path | None):
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
