"""The deviation tables of the step-level baselines say the same in docs/baselines.md and the report's
caption, and list what differs from each original code base."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEADERS = ("deviation from StepSearch's code", "deviation from R3-RAG's code")


def markdown_rows(text: str, header: str) -> list[tuple[str, str]]:
    """Rows of the Markdown table whose first header cell is ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 2, f"{header}: a row without two cells: {line!r}"
        rows.append((cells[0], cells[1]))
    return rows


def rst_rows(text: str, title: str) -> list[tuple[str, str]]:
    """Rows of the simple reST table after ``title``, inline literals written as in Markdown."""
    lines = text[text.index(title) :].splitlines()
    borders = [i for i, line in enumerate(lines) if re.fullmatch(r"=+  =+", line)]
    width = len(lines[borders[0]].split("  ")[0])
    rows = []
    for line in lines[borders[1] + 1 : borders[2]]:
        first, second = line[:width].strip(), line[width + 2 :].strip()
        rows.append((first.replace("``", "`"), second.replace("``", "`")))
    return rows


@pytest.mark.parametrize("header", HEADERS)
def test_the_report_carries_the_tables_of_docs(header):
    docs = markdown_rows((REPO / "docs/baselines.md").read_text(), header)
    title = "Deviations from " + header.removeprefix("deviation from ") + ":"
    assert docs == rst_rows((REPO / "workflow" / "report" / "baselines.rst").read_text(), title)


def test_every_difference_from_the_originals_is_listed():
    docs = (REPO / "docs/baselines.md").read_text()
    stepsearch = " ".join(d for d, _ in markdown_rows(docs, HEADERS[0]))
    r3rag = " ".join(d for d, _ in markdown_rows(docs, HEADERS[1]))
    assert "lambda_s: 1.6" in stepsearch  # the scale its code applies, an option
    for point in (
        "regenerates it up to 3 times",
        "agent.regenerations: 3",
        "not judged",
        "first `Relevance:`",
    ):
        assert point in r3rag
    # what now matches the originals is said where the method is described
    assert "no step rewards" in docs and "no step reward at all" in docs and "4,096 tokens" in docs


def test_known_divergences_name_the_authors_effective_run_and_each_option():
    method = (REPO / "docs/method.md").read_text()
    known = method[method.index("## Known divergences") :]
    for point in (
        "effective tool cost was 0 for the whole run",
        "`variants.<v>.cost: 0` reproduces the authors' effective run",
        "tool cost per query",
        "a malformed call",
        "the last search of an episode the budget cut off",
        "importance ratio per token",
        "truncate_side: left",
        "temperature 1.0 with 5,096 new tokens per turn",
        "`evaluation.temperature: 0` (greedy)",
    ):
        assert point in known, point
