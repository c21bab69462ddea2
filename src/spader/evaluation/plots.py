"""PNG figures of the results (F1 with intervals), the search-efficiency and temporal-dynamics
analyses and the training runs' learning curves (matplotlib, Agg backend).

Every method gets one style, a colour and a marker (and, in line plots, a dash pattern), chosen
from its place among the configured methods by :func:`method_styles`: the same method looks the same in both figures and for
every backbone, and 12+ methods stay distinguishable (20 colours x 16 markers, no pair repeated
below 80 methods).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl

__all__ = [
    "MethodStyle",
    "curves_figure",
    "efficiency_figure",
    "f1_figure",
    "method_styles",
    "plot_curves",
    "plot_efficiency",
    "plot_f1",
    "plot_temporal",
    "temporal_figure",
]

# matplotlib's tab20 palette, dark shades first, so that the first ten methods differ in hue.
_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d", "H", "8", "+")
_DASHES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class MethodStyle:
    """How one method is drawn."""

    colour: str
    marker: str
    linestyle: str


def method_styles(methods: Iterable[str]) -> dict[str, MethodStyle]:
    """A distinct style per method, by its position in ``methods``: given every method of the
    configuration in one order (the prompting methods, then ``variants``), each method keeps its
    style in every figure and for every backbone.

    Args:
        methods: method names (duplicates ignored).
    Returns:
        ``{method: MethodStyle}``; no two methods share a colour-marker pair.
    """
    methods = list(dict.fromkeys(methods))
    return {
        m: MethodStyle(
            _COLOURS[slot % len(_COLOURS)],
            _MARKERS[slot % len(_MARKERS)],
            _DASHES[(slot // len(_COLOURS)) % len(_DASHES)],
        )
        for slot, m in enumerate(methods)
    }


def _styles(methods: Iterable[str], styles: dict[str, MethodStyle] | None) -> dict[str, MethodStyle]:
    """``styles`` with a style for each of ``methods`` it lacks (after the given ones)."""
    styles = dict(styles or {})
    extra = [m for m in dict.fromkeys(methods) if m not in styles]
    if extra:
        styles = method_styles([*styles, *extra])
    return styles


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _title(fig, text: str, note: str) -> None:
    fig.suptitle(f"{text}\n{note}" if note else text, fontsize=10, color="darkred" if note else "black")


def _legend(fig, handles, labels) -> None:
    """One legend for the figure, right of the plots, in as many columns as it needs."""
    fig.legend(
        handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), ncols=1 + len(labels) // 16
    )


def _save(fig, out: str | os.PathLike) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # the legend sits outside the axes
    _pyplot().close(fig)


def plot_efficiency(
    table: pl.DataFrame,
    out: str | os.PathLike,
    *,
    title: str = "",
    note: str = "",
    styles: dict[str, MethodStyle] | None = None,
) -> None:
    """Write :func:`efficiency_figure` to ``out`` (PNG)."""
    _save(efficiency_figure(table, title=title, note=note, styles=styles), out)


def plot_temporal(
    table: pl.DataFrame,
    out: str | os.PathLike,
    *,
    datasets: Sequence[str] | None = None,
    title: str = "",
    note: str = "",
    styles: dict[str, MethodStyle] | None = None,
) -> None:
    """Write :func:`temporal_figure` to ``out`` (PNG)."""
    _save(temporal_figure(table, datasets=datasets, title=title, note=note, styles=styles), out)


def efficiency_figure(
    table: pl.DataFrame, *, title: str = "", note: str = "", styles: dict[str, MethodStyle] | None = None
):
    """Dot plot of the authors' search efficiency (queries per correctly predicted entity, mean
    over instances, ``search_efficiency``), one column per dataset, one marker per method (on a
    stem from zero, so the value reads like a bar), with error bars from the bootstrap interval
    when the table has ``search_efficiency_lo``/``_hi``.

    Args:
        table: :func:`spader.evaluation.tables.efficiency_table` output.
        title: figure title. note: a warning line under the title (tiny random model).
    Returns:
        The matplotlib figure (open; the caller saves and closes it).
    """
    methods, datasets, styles, fig, ax, width = _grouped_axes(table, styles)
    handles = []
    for i, m in enumerate(methods):
        style = styles[m]
        sub = table.filter(pl.col("method") == m)
        values = dict(zip(sub["dataset"].to_list(), sub["search_efficiency"].to_list(), strict=True))
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(datasets))]
        heights = [values.get(d) for d in datasets]
        shown = [(x, h) for x, h in zip(xs, heights, strict=True) if h is not None]
        ax.vlines([x for x, _ in shown], 0, [h for _, h in shown], colors=style.colour, linewidth=1.2)
        (handle,) = ax.plot(
            [x for x, _ in shown], [h for _, h in shown], linestyle="none", marker=style.marker,
            color=style.colour, markersize=6,
        )  # fmt: skip
        handles.append(handle)
        if {"search_efficiency_lo", "search_efficiency_hi"} <= set(sub.columns):
            bounds = {r["dataset"]: r for r in sub.iter_rows(named=True)}
            bars = [
                (x, h, bounds[d]["search_efficiency_lo"], bounds[d]["search_efficiency_hi"])
                for x, h, d in zip(xs, heights, datasets, strict=True)
                if h is not None and d in bounds and bounds[d]["search_efficiency_lo"] is not None
            ]
            if bars:
                ax.errorbar(
                    [x for x, *_ in bars], [h for _, h, *_ in bars],
                    yerr=[[max(0.0, h - lo) for _, h, lo, _ in bars], [max(0.0, hi - h) for _, h, _, hi in bars]],
                    fmt="none", ecolor=style.colour, elinewidth=1.0, capsize=2.5,
                )  # fmt: skip
        for x, h in zip(xs, heights, strict=True):
            if h is None:  # no entity found: the ratio is undefined, say so
                ax.annotate("n/a", (x, 0), ha="center", va="bottom", fontsize=6, color=style.colour)
    ax.set_xticks(range(len(datasets)), datasets)
    for j in range(1, len(datasets)):
        ax.axvline(j - 0.5, color="0.85", linewidth=0.8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("queries per correctly predicted entity\n(mean over instances)")
    _legend(fig, handles, methods)
    _title(fig, title or "Search efficiency (lower is better)", note)
    return fig


def temporal_figure(
    table: pl.DataFrame,
    *,
    datasets: Sequence[str] | None = None,
    title: str = "",
    note: str = "",
    styles: dict[str, MethodStyle] | None = None,
):
    """One panel per dataset: mean cumulative distinct valid entities found by turn, per method,
    with the bootstrap interval of each turn's mean as a band (when the table has ``ci_lo``/``ci_hi``).

    Args:
        table: :func:`spader.evaluation.tables.temporal_table` output.
        datasets: panels to draw (default: all in the table, in order).
        title: figure title. note: a warning line under the title (tiny random model).
    Returns:
        The matplotlib figure (open; the caller saves and closes it).
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    datasets = list(datasets or dict.fromkeys(table["dataset"].to_list()))
    methods = list(dict.fromkeys(table["method"].to_list()))
    styles = _styles(methods, styles)
    cols = min(3, max(1, len(datasets)))
    rows = (len(datasets) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    handles = {}
    for k, d in enumerate(datasets):
        ax = axes[k // cols][k % cols]
        for m in methods:
            style = styles[m]
            sub = table.filter((pl.col("method") == m) & (pl.col("dataset") == d)).sort("turn")
            (handles[m],) = ax.plot(
                sub["turn"].to_list(), sub["cumulative_entities"].to_list(), color=style.colour,
                marker=style.marker, linestyle=style.linestyle, markersize=4, linewidth=1.2,
            )  # fmt: skip
            if {"ci_lo", "ci_hi"} <= set(sub.columns):  # the bootstrap interval of each turn's mean
                ax.fill_between(
                    sub["turn"].to_list(), sub["ci_lo"].to_list(), sub["ci_hi"].to_list(),
                    color=style.colour, alpha=0.12, linewidth=0,
                )  # fmt: skip
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("interaction turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("distinct valid entities (cumulative)")
        ax.grid(alpha=0.3)
    for k in range(len(datasets), rows * cols):
        axes[k // cols][k % cols].axis("off")
    _legend(fig, [handles[m] for m in methods if m in handles], [m for m in methods if m in handles])
    _title(fig, title or "Temporal dynamics of entity discovery", note)
    return fig


def plot_f1(
    table: pl.DataFrame,
    out: str | os.PathLike,
    *,
    reference: str = "",
    title: str = "",
    note: str = "",
    styles: dict[str, MethodStyle] | None = None,
) -> None:
    """Write :func:`f1_figure` to ``out`` (PNG)."""
    _save(f1_figure(table, reference=reference, title=title, note=note, styles=styles), out)


def f1_figure(
    table: pl.DataFrame,
    *,
    reference: str = "",
    title: str = "",
    note: str = "",
    styles: dict[str, MethodStyle] | None = None,
):
    """F1 of every method on every dataset and their average, with error bars from the bootstrap
    interval; a method that does not differ significantly from ``reference`` has a hollow marker.

    Args:
        table: long form with ``method, dataset, f1, f1_lo, f1_hi`` and optionally ``significant``
            (:func:`spader.evaluation.tables.prf_table` rows, plus ``avg`` rows).
        reference: the method the others are tested against (named in the axis label).
        title: figure title. note: a warning line under the title (tiny random model).
    Returns:
        The matplotlib figure (open; the caller saves and closes it).
    """
    methods, datasets, styles, fig, ax, width = _grouped_axes(table, styles)
    handles = []
    for i, m in enumerate(methods):
        style = styles[m]
        rows = {r["dataset"]: r for r in table.filter(pl.col("method") == m).iter_rows(named=True)}
        xs, ys, lo, hi, hollow = [], [], [], [], []
        for j, d in enumerate(datasets):
            if d not in rows:
                continue
            r = rows[d]
            xs.append(j + (i - (len(methods) - 1) / 2) * width)
            ys.append(r["f1"])
            lo.append(max(0.0, r["f1"] - r["f1_lo"]))
            hi.append(max(0.0, r["f1_hi"] - r["f1"]))
            hollow.append(r.get("significant") is False)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor=style.colour, elinewidth=1.1, capsize=2.5)
        filled = [(x, y) for x, y, h in zip(xs, ys, hollow, strict=True) if not h]
        empty = [(x, y) for x, y, h in zip(xs, ys, hollow, strict=True) if h]
        (handle,) = ax.plot(
            [x for x, _ in filled], [y for _, y in filled], linestyle="none", marker=style.marker,
            color=style.colour, markersize=6,
        )  # fmt: skip
        if empty:
            ax.plot(
                [x for x, _ in empty], [y for _, y in empty], linestyle="none", marker=style.marker,
                markerfacecolor="white", markeredgecolor=style.colour, markersize=6,
            )  # fmt: skip
        handles.append(handle)
    ax.set_xticks(range(len(datasets)), datasets)
    for j in range(1, len(datasets)):
        ax.axvline(j - 0.5, color="0.85", linewidth=0.8)
    ax.set_ylim(bottom=0)
    label = "macro F1 (95% bootstrap interval)"
    if reference:
        label += f"\nhollow: not significantly different from {reference}"
    ax.set_ylabel(label, fontsize=8)
    _legend(fig, handles, methods)
    _title(fig, title or "F1 per test set", note)
    return fig


def plot_curves(
    table: pl.DataFrame,
    out: str | os.PathLike,
    *,
    title: str = "",
    note: str = "",
    styles: dict[str, MethodStyle] | None = None,
) -> None:
    """Write :func:`curves_figure` to ``out`` (PNG)."""
    _save(curves_figure(table, title=title, note=note, styles=styles), out)


def curves_figure(
    table: pl.DataFrame, *, title: str = "", note: str = "", styles: dict[str, MethodStyle] | None = None
):
    """Learning curves: one panel per curve (answer F1, SPADER's search-step reward, valid-format
    rate, searches, entities, response length, KL), one line per training run, by training step.
    Every panel holds one quantity measured the same way for every run in it: the answer F1 of all
    variants in one panel, the step rewards of the variants that have them in another (never a
    step-plus-terminal reward beside a terminal-only one). A run without a curve is named in
    that panel.

    Args:
        table: :func:`spader.evaluation.curves.curves_table` output (``run, curve, label, step,
            value``; all curves listed in :data:`spader.evaluation.curves.CURVES` get a panel).
        title: figure title (the backbone). note: a warning line under the title.
    Returns:
        The matplotlib figure (open; the caller saves and closes it).
    """
    from matplotlib.ticker import MaxNLocator

    from spader.evaluation.curves import CURVES

    plt = _pyplot()
    runs = list(dict.fromkeys(table["run"].to_list()))
    styles = _styles([r.split(" ", 1)[0] for r in runs], styles)
    cols = 3
    rows = (len(CURVES) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.1 * rows), squeeze=False)
    handles = {}
    for k, curve in enumerate(CURVES):
        ax = axes[k // cols][k % cols]
        missing = []
        for run in runs:
            sub = table.filter((pl.col("run") == run) & (pl.col("curve") == curve.name)).sort("step")
            if sub.height == 0:
                missing.append(run)
                continue
            style = styles[run.split(" ", 1)[0]]
            (handles[run],) = ax.plot(
                sub["step"].to_list(), sub["value"].to_list(), color=style.colour, marker=style.marker,
                linestyle=style.linestyle, markersize=3, linewidth=1.2,
            )  # fmt: skip
        if missing:
            ax.text(
                0.02, 0.98, f"{curve.absent}: " + ", ".join(missing), transform=ax.transAxes, fontsize=6,
                va="top", color="0.4",
            )  # fmt: skip
        if not runs:
            ax.text(0.5, 0.5, "no trained variant", transform=ax.transAxes, ha="center", fontsize=8)
        ax.set_title(curve.label, fontsize=9)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for k in range(len(CURVES), rows * cols):
        axes[k // cols][k % cols].axis("off")
    if handles:
        _legend(fig, list(handles.values()), list(handles))
    _title(fig, title or "Learning curves", note)
    return fig


def _grouped_axes(table: pl.DataFrame, styles: dict[str, MethodStyle] | None = None):
    """A figure with one group per dataset and one slot per method in each group: the methods and
    datasets in table order, their styles, the figure, its axes and a slot's width."""
    plt = _pyplot()
    methods = list(dict.fromkeys(table["method"].to_list()))
    datasets = list(dict.fromkeys(table["dataset"].to_list()))
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.22 * len(datasets) * max(1, len(methods)))), 4.2))
    return methods, datasets, _styles(methods, styles), fig, ax, 0.8 / max(1, len(methods))
