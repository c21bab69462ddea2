"""PNG figures of the search-efficiency and temporal-dynamics analyses (matplotlib, Agg backend)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import polars as pl

__all__ = ["plot_efficiency", "plot_temporal"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _title(fig, text: str, note: str) -> None:
    fig.suptitle(f"{text}\n{note}" if note else text, fontsize=10, color="darkred" if note else "black")


def plot_efficiency(table: pl.DataFrame, out: str | os.PathLike, *, title: str = "", note: str = "") -> None:
    """Grouped bars: searches per valid entity found, one group per dataset, one bar per method.

    Args:
        table: :func:`spader.evaluation.tables.efficiency_table` output.
        out: PNG path. note: a warning line under the title (tiny random model).
    """
    plt = _pyplot()
    methods = list(dict.fromkeys(table["method"].to_list()))
    datasets = list(dict.fromkeys(table["dataset"].to_list()))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(datasets) * max(1, len(methods)) / 2), 4.2))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        sub = table.filter(pl.col("method") == m)
        values = {
            d: v for d, v in zip(sub["dataset"].to_list(), sub["searches_per_entity"].to_list(), strict=True)
        }
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(datasets))]
        heights = [values.get(d) or 0.0 for d in datasets]
        bars = ax.bar(xs, heights, width=width, label=m)
        for bar, d in zip(bars, datasets, strict=True):
            if values.get(d) is None:  # no entity found: the ratio is undefined, say so
                ax.annotate(
                    "n/a", (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom", fontsize=7
                )
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("search steps per valid entity found")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _title(fig, title or "Search efficiency (lower is better)", note)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_temporal(
    table: pl.DataFrame,
    out: str | os.PathLike,
    *,
    datasets: Sequence[str] | None = None,
    title: str = "",
    note: str = "",
) -> None:
    """One panel per dataset: mean cumulative distinct valid entities found by turn, per method.

    Args:
        table: :func:`spader.evaluation.tables.temporal_table` output.
        out: PNG path. datasets: panels to draw (default: all in the table, in order).
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    datasets = list(datasets or dict.fromkeys(table["dataset"].to_list()))
    methods = list(dict.fromkeys(table["method"].to_list()))
    cols = min(3, max(1, len(datasets)))
    rows = (len(datasets) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for k, d in enumerate(datasets):
        ax = axes[k // cols][k % cols]
        for m in methods:
            sub = table.filter((pl.col("method") == m) & (pl.col("dataset") == d)).sort("turn")
            ax.plot(
                sub["turn"].to_list(), sub["cumulative_entities"].to_list(), marker="o", markersize=3, label=m
            )
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("interaction turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("distinct valid entities (cumulative)")
        ax.grid(alpha=0.3)
    for k in range(len(datasets), rows * cols):
        axes[k // cols][k % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    _title(fig, title or "Temporal dynamics of entity discovery", note)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
