"""The analysis figures: every method drawn with its own colour and marker, the same for a method
in both figures and whatever the other methods are; 14 methods (the paper's) stay apart."""

from __future__ import annotations

import polars as pl
import pytest
from matplotlib.colors import to_hex

from spader.evaluation.plots import (
    KNOWN_METHODS,
    efficiency_figure,
    method_styles,
    plot_temporal,
    temporal_figure,
)

DATASETS = ["qampari", "mintaka", "webqsp", "quest", "all"]
METHODS = list(KNOWN_METHODS)  # 14: rag, react, the ten SPADER variants and ablations, 2 step baselines


def _efficiency(methods=METHODS) -> pl.DataFrame:
    rows = [
        {"method": m, "dataset": d, "searches_per_entity": None if (i, d) == (0, "quest") else 1.0 + i * 0.1}
        for i, m in enumerate(methods)
        for d in DATASETS
    ]
    return pl.DataFrame(
        rows, schema={"method": pl.String, "dataset": pl.String, "searches_per_entity": pl.Float64}
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
    full = method_styles(METHODS)
    demo = method_styles(["react", "spader", "rag", "grpo"])
    assert all(demo[m] == full[m] for m in demo)


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
