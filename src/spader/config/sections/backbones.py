"""``backbones.<name>``: a policy backbone, its warm start (tiny models) and the methods it runs."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, StrictFloat, StrictInt, ValidationInfo, model_validator

from spader.config.sections.base import MAX_COUNT, MAX_SEED, PROMPTING, Section, _unique, model_kind

__all__ = [
    "BackboneConfig",
    "WarmstartConfig",
]


class WarmstartConfig(Section):
    """Supervised warm start of a tiny policy (CPU demo only): fine-tuning on scripted episodes of
    the demo world (search with the question, then with the name in it if nothing, or not
    everything, was found, answer with the gold entities the passages showed), so that a random tiny model writes valid
    actions."""

    steps: StrictInt = Field(300, ge=1, le=MAX_COUNT, description="optimizer steps")
    lr: StrictFloat = Field(
        3.0e-3, gt=0, le=1, description="peak AdamW learning rate (linear warm-up, cosine decay to 10%)"
    )
    batch_size: StrictInt = Field(4, ge=1, le=2**20, description="scripted episodes per step")
    warmup_ratio: StrictFloat = Field(0.05, ge=0, lt=1, description="fraction of the steps spent warming up")
    weight_decay: StrictFloat = Field(0.0, ge=0, le=1, description="AdamW weight decay")
    max_searches: StrictInt = Field(
        2,
        ge=1,
        le=2,
        description="search steps a scripted episode may take (the second as `retry` says)",
    )
    retry: Literal["none_found", "incomplete"] = Field(
        "none_found",
        description="when a scripted episode searches a second time (with `max_searches` 2): "
        "`none_found`, when its first search showed no gold entity; `incomplete`, when it did not "
        "show every gold entity (a list question searched again for the rest)",
    )
    world_questions: bool = Field(
        True,
        description="besides the training mix, script the bundled demo world's questions about topics "
        "no evaluation question asks about or answers",
    )
    first_turn_examples: bool = Field(
        True,
        description="also train on each multi-turn episode's first turn alone (prompt and first search)",
    )
    generated_worlds: StrictInt = Field(
        0,
        ge=0,
        le=1000,
        description="also script this many demo-like worlds generated with other seeds (names the demo "
        "world never uses), searched over their own passages, so that the policy learns to copy "
        "names from what it reads",
    )
    copy_weight: StrictFloat = Field(
        0.0,
        ge=0,
        le=1000,
        description="weight of a copying task trained beside the episodes at every step (random spans of "
        "name pieces repeated after noise), so that the policy can write a name it has only read; 0: none",
    )
    copy_batch_size: StrictInt = Field(16, ge=1, le=2**20, description="copying sequences per step")
    copy_length: StrictInt = Field(64, ge=8, le=2**20, description="longest copying sequence (tokens)")
    copy_attention_weight: StrictFloat = Field(
        1.0,
        ge=0,
        le=1000,
        description="weight of the copying task's attention targets (the first layer's first head on the "
        "previous token, the last layer's first head on the current token's earlier occurrence)",
    )
    seed: StrictInt = Field(0, ge=0, le=MAX_SEED, description="seed of the batches and of torch")


class BackboneConfig(Section):
    """One policy backbone and the methods it runs."""

    model: str = Field(
        min_length=1, description="hub id, local path, or tiny:qwen3 (a tiny random model built locally)"
    )
    revision: str | None = Field(
        None,
        description="hub revision (a commit) the weights are downloaded at, when `model` is a hub id; "
        "null: the repository's main branch",
    )
    gpus: StrictInt = Field(8, ge=0, le=1024, description="GPUs per training job (resources: gpu)")
    warmstart: WarmstartConfig | None = Field(
        None,
        description="tiny:qwen3 backbones only: warm-start the policy by supervised fine-tuning (rule "
        "warmstart_policy) before training and the prompting methods use it; null: the model as "
        "built or released",
    )
    max_context_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="the token budget of this backbone's evaluation episodes, replacing "
        "evaluation.max_context_tokens: the context its serving engine holds (the authors' evaluation "
        "served Llama-3.1-8B with --max-model-len 32768 and Qwen3-8B at its own 40,960); null: "
        "evaluation.max_context_tokens",
    )
    variants: list[str] = Field(default_factory=list, description="trained variants (keys of `variants`)")
    prompting: list[Literal["rag", "react"]] = Field(
        default_factory=lambda: list(PROMPTING),
        description="prompting methods evaluated with the backbone as released (or warm-started)",
    )

    @model_validator(mode="after")
    def _model_rules(self, info: ValidationInfo) -> BackboneConfig:
        _unique(self.variants, "variants")
        _unique(self.prompting, "prompting")
        if self.model.startswith("tiny:") and self.model != "tiny:qwen3":
            raise ValueError(f"model: tiny backbones are 'tiny:qwen3', got '{self.model}'")
        if self.warmstart is not None and not self.model.startswith("tiny:"):
            raise ValueError(
                f"warmstart: only tiny backbones (tiny:qwen3) are warm-started, '{self.model}' is used "
                "as released; set it to null"
            )
        if (info.context or {}).get("check_paths") and model_kind(self.model) == "path":
            if not os.path.exists(self.model):
                raise ValueError(f"model: local path '{self.model}' does not exist")
        return self

    @property
    def is_tiny(self) -> bool:
        return self.model.startswith("tiny:")
