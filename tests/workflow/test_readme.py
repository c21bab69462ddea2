"""README and CI stay in step: .ci/run runs the README's set-up and test commands verbatim."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _section_command(readme: str, heading: str) -> str:
    section = readme.split(f"\n## {heading}\n", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.DOTALL).group(1).strip()


def test_ci_runs_readme_commands_verbatim():
    readme = (REPO / "README.md").read_text()
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    for heading in ("Set up", "Test"):
        command = _section_command(readme, heading)
        assert "\n" not in command, f"the README's {heading} command must be one line"
        assert command in ci_lines, f".ci/run does not run the README's {heading} command: {command}"


def test_readme_order():
    readme = (REPO / "README.md").read_text()
    marks = [
        "## Set up",
        "## Test",
        "## CPU demo",
        "snakemake --cores all results/qwen3_8b/f1.tsv",
        "snakemake --profile slurm results/qwen3_8b/f1.tsv",
        "## Outputs",
    ]
    positions = [readme.index(m) for m in marks]
    assert positions == sorted(positions)


def test_demo_command_uses_the_demo_config():
    readme = (REPO / "README.md").read_text()
    demo = _section_command(readme, "CPU demo (no network, 2 cores)")
    assert "--configfile config/demo.yaml" in demo
