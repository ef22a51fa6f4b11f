"""Charts for the benchmark suite's docs/*.png (matplotlib, from the `bench` extra).

matplotlib is imported lazily: the package and `make test` do not need it, only the
benchmark scripts that draw (`make bench` installs it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# One colour per series, in series order, shared by every chart so that "the
# baseline" looks the same everywhere (first series = the side of interest).
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend."""
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise SystemExit(
            "drawing the charts needs matplotlib: pip install -e '.[bench]' (make bench does)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, caption: str, *, title: str | None = None) -> None:
    """Title on top, caption (the command and machine) at the bottom, then write the PNG."""
    plt = pyplot()
    if title:
        fig.suptitle(title)
    fig.text(0.01, 0.01, caption, fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def grouped_bars(
    ax: Any,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    title: str,
    log: bool = False,
    value_label: Callable[[float], str] = lambda v: f"{v:,.0f}",
    group_notes: Sequence[str] | None = None,
) -> None:
    """Vertical bars: one cluster per group, one bar per series (same order, same
    colours), each bar labelled with its value; `group_notes` (e.g. a ratio) go
    under each cluster's name."""
    n = max(len(series), 1)
    width = 0.8 / n
    xs = range(len(groups))
    tops = [0.0] * len(groups)
    for k, (name, values) in enumerate(series.items()):
        offsets = [x - 0.4 + width * (k + 0.5) for x in xs]
        bars = ax.bar(offsets, values, width, label=name, color=COLORS[k % len(COLORS)])
        ax.bar_label(bars, [value_label(v) for v in values], fontsize=7, padding=2)
        tops = [max(t, v) for t, v in zip(tops, values, strict=True)]
    if log:
        ax.set_yscale("log")
    peak = max(tops) if tops and max(tops) > 0 else 1.0
    if log:
        positive = [v for values in series.values() for v in values if v > 0]
        ax.set_ylim(min(positive, default=1.0) / 2, peak * 6)
    else:
        ax.set_ylim(0, peak * 1.2)
    # Notes go under the group names: above the bars they collide with the value labels.
    ticks = list(groups)
    if group_notes is not None:
        ticks = [f"{g}\n{note}" if note else g for g, note in zip(groups, group_notes, strict=True)]
    ax.set_xticks(list(xs), ticks)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
