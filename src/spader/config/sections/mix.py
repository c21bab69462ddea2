"""``mix``: the training mix, one count per dataset of the registry."""

from __future__ import annotations

from pydantic import Field, StrictInt, create_model

from spader.config.sections.base import DATASETS, MAX_COUNT, MAX_SEED, Section
from spader.datasets import registry

__all__ = [
    "MixConfig",
    "MixCounts",
]

#: ``mix.counts``: training instances per dataset, by default the paper's (the registry's).
MixCounts = create_model(
    "MixCounts",
    __base__=Section,
    __doc__="Training instances per dataset.",
    **{
        name: (
            StrictInt,
            Field(entry.paper_count, ge=0, le=MAX_COUNT, description=f"{entry.title} instances"),
        )
        for name, entry in registry().items()
    },
)


class MixConfig(Section):
    """The training mix (docs/data.md, "Training mix")."""

    seed: StrictInt = Field(42, ge=0, le=MAX_SEED, description="sampling seed")
    counts: MixCounts = Field(default_factory=MixCounts, description="Training instances per dataset.")
    min_answers: StrictInt = Field(
        1, ge=1, le=MAX_COUNT, description="fewest answers a training question may have"
    )
    max_answers: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="most answers a training question may have"
    )
    val_per_dataset: StrictInt = Field(
        50,
        ge=0,
        le=MAX_COUNT,
        description="validation instances per dataset (from the train pools, disjoint from the mix)",
    )
    eval_limit: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="cap on instances per evaluation set"
    )

    @property
    def drawn(self) -> list[str]:
        """The datasets the mix draws from (a count above 0), in table order."""
        return [d for d in DATASETS if getattr(self.counts, d) > 0]
