"""One PNG of what a builder made: a row of histograms or bar charts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Panel:
    """One chart: a histogram of `values`, or bars when `counts` is given."""

    title: str
    xlabel: str
    values: tuple[float, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()
    bins: int | tuple[float, ...] = 20
    log_x: bool = False


def save_panels(path: Path, panels: list[Panel], title: str) -> None:
    """Draw the panels side by side into `path` (no display needed: the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        _draw(ax, panel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _draw(ax: object, panel: Panel) -> None:
    if panel.counts:
        labels = [label for label, _ in panel.counts]
        ax.bar(labels, [count for _, count in panel.counts], color="tab:orange")
        ax.tick_params(axis="x", labelrotation=30)
    elif panel.values:
        ax.hist(panel.values, bins=panel.bins, color="tab:blue")
    else:
        ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes)
    if panel.log_x:
        ax.set_xscale("log")
    ax.set_title(panel.title)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel("count")
