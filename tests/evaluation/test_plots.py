"""The figures: every method drawn with its own colour and marker, the same for a method in every
figure and whatever the other methods are; 14 methods (the paper's) stay apart. F1 carries error
bars from its intervals, the temporal curves carry bands, and the learning curves have a panel
per curve that names the runs that did not log it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from matplotlib.colors import to_hex

from spader.config import PROMPTING, resolved_config
from spader.evaluation.plots import (
    curves_figure,
    efficiency_figure,
    f1_figure,
    method_styles,
    plot_curves,
    plot_f1,
    plot_temporal,
    temporal_figure,
)

DATASETS = ["qampari", "mintaka", "webqsp", "quest", "all"]
# 14: rag, react, then the paper config's variants (SPADER, its ablations and beta sweep, GRPO, PPO,
# the 2 step baselines) in config order, the order every figure's styles follow
METHODS = [*PROMPTING, *resolved_config(Path(__file__).parents[2] / "config" / "config.yaml")["variants"]]


def _efficiency(methods=METHODS) -> pl.DataFrame:
    rows = [
        {"method": m, "dataset": d, "search_efficiency": None if (i, d) == (0, "quest") else 1.0 + i * 0.1}
        for i, m in enumerate(methods)
        for d in DATASETS
    ]
    return pl.DataFrame(
        rows, schema={"method": pl.String, "dataset": pl.String, "search_efficiency": pl.Float64}
    )


def _temporal(methods=METHODS) -> pl.DataFrame:
    rows = [
        {"method": m, "dataset": d, "turn": t, "cumulative_entities": t * (1 + i / 10)}
        for i, m in enumerate(methods)
        for d in DATASETS
        for t in (1, 2, 3)
    ]
    return pl.DataFrame(rows)


def _drawn(fig) -> dict[str, tuple[str, str, str]]:
    """{legend label: (colour, marker, line style)} as the figure's legend shows them."""
    (legend,) = fig.legends
    return {
        text.get_text(): (to_hex(h.get_color()), h.get_marker(), h.get_linestyle())
        for text, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }


def test_every_method_has_its_own_colour_and_marker():
    styles = method_styles([*METHODS, "extra_1", "extra_2"])
    assert len({s.colour for s in styles.values()}) == len(styles)
    assert len({s.marker for s in styles.values()}) == len(styles)
    many = method_styles(f"m{i}" for i in range(80))
    assert len({(s.colour, s.marker, s.linestyle) for s in many.values()}) == 80


def test_a_method_keeps_its_style_whatever_else_is_plotted():
    import matplotlib.pyplot as plt

    full = method_styles(METHODS)
    fig = efficiency_figure(_efficiency(["react", "spader", "rag", "grpo"]), styles=full)
    try:
        demo = _drawn(fig)
    finally:
        plt.close(fig)
    assert all(demo[m][:2] == (full[m].colour, full[m].marker) for m in demo)


@pytest.mark.parametrize("build, table", [(efficiency_figure, _efficiency), (temporal_figure, _temporal)])
def test_figures_draw_fourteen_methods_apart(build, table):
    import matplotlib.pyplot as plt

    fig = build(table())
    try:
        drawn = _drawn(fig)
    finally:
        plt.close(fig)
    assert list(drawn) == METHODS
    assert len({(c, m) for c, m, _ in drawn.values()}) == len(METHODS)
    assert len({c for c, _, _ in drawn.values()}) == len(METHODS)
    styles = method_styles(METHODS)
    assert all(drawn[m][:2] == (styles[m].colour, styles[m].marker) for m in METHODS)


def test_temporal_png_is_written(tmp_path):
    out = tmp_path / "temporal.png"
    plot_temporal(_temporal(["rag", "spader"]), out, note="TINY RANDOM MODEL")
    assert out.read_bytes()[:4] == b"\x89PNG"


def _f1(methods=METHODS) -> pl.DataFrame:
    rows = [
        {"method": m, "dataset": d, "f1": 0.3 + i / 100, "f1_lo": 0.25 + i / 100, "f1_hi": 0.4 + i / 100,
         "significant": None if m == "spader" else i % 2 == 0}
        for i, m in enumerate(methods)
        for d in [*DATASETS[:4], "avg"]
    ]  # fmt: skip
    return pl.DataFrame(rows)


def test_f1_figure_draws_every_interval_and_hollows_what_is_not_significant():
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    fig = f1_figure(_f1(), reference="spader")
    try:
        drawn = _drawn(fig)
        ax = fig.axes[0]
        bars = [c for c in ax.collections if isinstance(c, LineCollection)]
        segments = [seg for c in bars for seg in c.get_segments()]
        hollow = [ln for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    finally:
        plt.close(fig)
    assert list(drawn) == METHODS
    assert len(segments) == len(METHODS) * 5  # one error bar per method and test set (with avg)
    assert all(seg[0][1] == pytest.approx(seg[1][1] - 0.15) for seg in segments)  # from f1_lo to f1_hi
    # methods 1, 3, 5, ... (odd index, not spader) differ significantly; even ones are hollow
    assert len(hollow) == sum(1 for i, m in enumerate(METHODS) if m != "spader" and i % 2 == 1)


def test_efficiency_figure_draws_error_bars_where_the_table_has_intervals():
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    table = _efficiency(["rag", "spader"]).with_columns(
        (pl.col("search_efficiency") - 0.2).alias("search_efficiency_lo"),
        (pl.col("search_efficiency") + 0.3).alias("search_efficiency_hi"),
    )
    fig = efficiency_figure(table)
    try:
        segments = [
            seg
            for c in fig.axes[0].collections
            if isinstance(c, LineCollection)
            for seg in c.get_segments()
            if seg[0][1] != 0  # the stems start at zero; error bars do not
        ]
    finally:
        plt.close(fig)
    # one error bar per method and column with a value (rag has none on quest)
    assert len(segments) == 2 * len(DATASETS) - 1
    assert all(seg[1][1] - seg[0][1] == pytest.approx(0.5) for seg in segments)


def test_temporal_figure_draws_interval_bands():
    import matplotlib.pyplot as plt

    table = _temporal(["rag", "spader"]).with_columns(
        (pl.col("cumulative_entities") - 0.5).alias("ci_lo"),
        (pl.col("cumulative_entities") + 0.5).alias("ci_hi"),
    )
    fig = temporal_figure(table)
    try:
        bands = sum(len(ax.collections) for ax in fig.axes)
    finally:
        plt.close(fig)
    assert bands == 2 * len(DATASETS)  # one band per method and panel


def test_learning_curves_figure_has_a_panel_per_curve_and_names_what_was_not_logged(tmp_path):
    """SPADER's training reward (step rewards plus the terminal F1) is never drawn beside GRPO's
    (the terminal reward alone): the answer F1 of both shares one panel, SPADER's step reward has
    its own, which says that GRPO has none."""
    import matplotlib.pyplot as plt

    from spader.evaluation.curves import CURVES, curves_table

    steps = {
        s: {"critic/score/mean": 3.0 + s, "episode/f1": s / 10, "spader/search_reward/mean": 0.2 * s,
            "episode/format_valid": 0.5, "response_length/mean": 90.0}
        for s in (1, 2)
    }  # fmt: skip
    grpo = {
        1: {"critic/score/mean": 0.1, "episode/f1": 0.1},
        2: {"critic/score/mean": 0.3, "episode/f1": 0.3},
    }
    table = curves_table({"spader": steps, "grpo": grpo}, backbone="demo")
    fig = curves_figure(table, title="Learning curves (demo)")
    try:
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
        titles = [ax.get_title() for ax in panels]
        texts = {ax.get_title(): " ".join(t.get_text() for t in ax.texts) for ax in panels}
        lines = {ax.get_title(): [list(ln.get_ydata()) for ln in ax.lines] for ax in panels}
        drawn = _drawn(fig)
    finally:
        plt.close(fig)
    assert titles == [c.label for c in CURVES]
    assert list(drawn) == ["spader", "grpo"]
    f1_panel, step_panel = (c.label for c in CURVES[:2])
    assert sorted(lines[f1_panel]) == [[0.1, 0.2], [0.1, 0.3]]  # the answer F1 of both runs
    assert lines[step_panel] == [[0.2, 0.4]] and texts[step_panel] == "no SPADER step reward: grpo"
    assert not any(3.0 + 1 in y for ys in lines.values() for y in ys)  # critic/score/mean: nowhere
    assert (
        "not logged: grpo" in texts["valid-format rate"]
        and "not logged: spader, grpo" in texts["KL to the reference"]
    )
    assert texts[f1_panel] == ""
    out = tmp_path / "curves.png"
    plot_curves(table, out)
    assert out.read_bytes()[:4] == b"\x89PNG"
    empty = curves_table({}, backbone="demo")
    plot_curves(empty, out)  # a backbone that trained nothing still gets its figure
    plot_f1(_f1(["rag"]), tmp_path / "f1.png")
    assert (tmp_path / "f1.png").read_bytes()[:4] == b"\x89PNG"
