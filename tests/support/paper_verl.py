"""The overrides config/config.yaml gives a variant's verl config, for tests that compose a
variant as the training launcher does (the project YAMLs carry structure only, no number)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@cache
def _config():
    from spader.config import load_config

    return load_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")


def paper_overrides(variant: str = "spader") -> list[str]:
    """:func:`spader.integrations.verl.overrides.config_overrides` of config.yaml's ``variant``, and
    for an LLM-judged variant the judge settings the launcher adds (its endpoint comes at run time)."""
    from spader.integrations.verl.overrides import config_overrides
    from spader.training.scorer_launch import scorer_launch

    config = _config()
    spec = config.variants[variant]
    judge = scorer_launch(spec, judge=config.judge).overrides if spec.serves_judge else []
    return [
        *config_overrides(
            spec.model_dump(mode="json"),
            config.training.model_dump(mode="json"),
            config.agent.model_dump(mode="json"),
        ),
        *judge,
    ]
