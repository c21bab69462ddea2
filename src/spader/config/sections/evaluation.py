"""``evaluation``: agent inference for evaluation and the tables' statistics."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat, StrictInt, StringConstraints, model_validator

from spader.config.sections.base import MAX_SEED, Section

__all__ = [
    "EvaluationConfig",
]


class EvaluationConfig(Section):
    """Agent inference for evaluation (docs/method.md, "Evaluation")."""

    engine: Literal["sglang", "transformers"] = Field("sglang", description="generation engine")
    max_context_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="token budget of an episode (prompt and response); null: training's "
        "max_prompt_length + max_response_length",
    )
    max_response_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on the tokens after the prompt (generated and observations), as training's "
        "max_response_length caps a rollout; null: only max_context_tokens (whose prompt share a "
        "short prompt leaves to the response)",
    )
    max_turn_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on new tokens per assistant turn in evaluation only (the authors' evaluation: "
        "5,096); null: agent.max_turn_tokens",
    )
    overflow: Literal["shrink", "end_episode"] = Field(
        "shrink",
        description="a turn whose token cap (max_turn_tokens) does not fit in the room the context "
        "budget has left: shrink (the turn gets the room left) or end_episode (the request fails and "
        "the episode ends, scored on what it wrote, as the authors' vLLM server refuses a request whose "
        "prompt plus max_tokens exceed the model's length; an observation is then appended whatever its "
        "size, and the next request fails when it does not fit)",
    )
    temperature: StrictFloat = Field(
        1.0,
        ge=0,
        le=10,
        description="sampling temperature (the authors' evaluation: 1.0); 0 is greedy decoding",
    )
    top_p: StrictFloat = Field(1.0, gt=0, le=1, description="top-p when sampling")
    generation_config: bool = Field(
        False,
        description="fill top_k, top_p, min_p and repetition_penalty from the policy's "
        "generation_config.json (vLLM's default since 0.8, which the authors' evaluation served; verl "
        "copies the file into merged checkpoints); false: top_p as configured, no top-k",
    )
    loop: Literal["spader", "authors"] = Field(
        "spader",
        description="evaluation loop: spader (training's ids kept turn by turn, a call in the last turn "
        "is not run, every failure scores 0) or authors (their script: the history re-rendered "
        "through the chat template each turn, the last turn's call runs, an episode stopped by a "
        "generation error is scored on what it wrote, an episode that failed otherwise is left out "
        "of the means)",
    )
    metrics: Literal["spader", "authors"] = Field(
        "spader",
        description="precision, recall and F1 of an instance: spader (norm_v1, each gold entity matched "
        "once by one prediction) or authors (their script: their normalize_answer, a prediction is "
        "correct when it equals any gold alias, so two aliases of one entity are two correct "
        "predictions in precision)",
    )
    seed: StrictInt = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="sampling seed; each request samples with its own seed derived from it",
    )
    max_error_share: StrictFloat = Field(
        0.02,
        ge=0,
        le=1,
        description="an evaluation whose share of episodes lost to generation errors exceeds this fails "
        "instead of writing its records",
    )
    gpus: StrictInt = Field(1, ge=0, le=1024, description="GPUs per evaluation job")
    cpu_threads: StrictInt = Field(
        2,
        ge=1,
        le=1024,
        description="CPU threads of an evaluation job without GPUs (`gpus: 0`), shared by its policy and its "
        "search service; a GPU job's come from the node. Not a result setting: changing it reruns nothing",
    )
    gpu_memory_utilization: StrictFloat = Field(
        0.7,
        gt=0,
        le=1,
        description="sglang mem_fraction_static (the search service's reranker shares the GPU)",
    )
    batch_size: StrictInt = Field(
        64, ge=1, le=2**20, description="transformers engine: prompts per forward batch"
    )
    seeds: list[Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]] | None = Field(
        None,
        description="several sampling seeds: every question is evaluated once per seed and the tables "
        "report the mean over seeds and its spread (needs temperature > 0); null: `seed` alone",
    )
    bootstrap_samples: StrictInt = Field(
        10000,
        ge=100,
        le=10**7,
        description="bootstrap resamples of the questions for the tables' intervals, and random sign "
        "patterns of the paired permutation test",
    )
    bootstrap_seed: StrictInt = Field(
        0, ge=0, le=MAX_SEED, description="seed of the bootstrap resamples and permutations"
    )
    significance_level: StrictFloat = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="level of the paired tests against spader (significance.tsv); intervals are at 1 - level",
    )
    topics: Annotated[str, StringConstraints(min_length=1)] | None = Field(
        None,
        description="a TSV file naming the topics of the evaluation questions (header `id<TAB>topic`, one "
        "line per question and topic): the rows pooled over datasets (`avg`, `all`) resample and test "
        "clusters of questions that share a topic instead of single questions (a relative path resolves "
        "against the repository root); null: every question is its own unit (the paper's four datasets "
        "share no topic; the CPU demo's do)",
    )

    @model_validator(mode="after")
    def _seeds_sample(self) -> EvaluationConfig:
        if self.seeds is not None:
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"seeds: a non-empty list of distinct seeds, got {self.seeds}")
            if len(self.seeds) > 1 and self.temperature == 0:
                raise ValueError(
                    "seeds: greedy decoding (temperature 0) gives the same episodes for every seed; "
                    "set temperature > 0 or a single seed"
                )
        return self
