"""``training``: verl's hyperparameters, the divergences from the paper and the time limit."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat, StrictInt, model_validator

from spader.config.sections.base import MAX_COUNT, MAX_SECONDS, MAX_SEED, Section

__all__ = [
    "CostWarmup",
    "DivergencesConfig",
    "TimeLimitConfig",
    "TrainingConfig",
]


class CostWarmup(Section):
    """Tool-cost warm-up schedule of the authors' code."""

    free_steps: StrictInt = Field(100, ge=0, le=MAX_COUNT, description="steps with zero tool cost")
    ramp_steps: StrictInt = Field(
        100, ge=0, le=MAX_COUNT, description="steps of linear ramp to the full cost"
    )


class DivergencesConfig(Section):
    """Options reproducing the authors' published code (docs/method.md, "Known divergences")."""

    novelty: Literal["inverse", "exp_decay"] = Field(
        "inverse", description="inverse: beta/N (paper); exp_decay: beta*exp(-(N-1)) (code)"
    )
    aliases: Literal["aware", "blind"] = Field(
        "aware",
        description="training reward's gold entities: aware (any alias matches, paper) or blind (the "
        "authors' code: each alias list becomes one string, so an entity with two or more aliases "
        "never matches, in the F1 and in step discovery; the F1 then is their reward's, the set of "
        "predictions against the set of those strings, both through their normalize_answer)",
    )
    discovery: Literal["passages", "substring"] = Field(
        "passages",
        description="how the training reward finds an entity at a search step: passages (an alias "
        "occurs as whole words in the normalised text of the passages shown, paper) or substring (the "
        "authors' code: an alias, normalised by their normalize_answer, occurs anywhere in the whole "
        "observation text, which echoes the queries; each distinct gold entry, by its exact text, is "
        "an entity of its own)",
    )
    denominator: Literal["distinct", "entries"] = Field(
        "distinct",
        description="|E_GT| of the search-step rewards: distinct (each gold entity once, as recall "
        "counts them, paper; each distinct entry with discovery: substring) or entries (every entry of "
        "the gold list, duplicates included, as the authors' reward divides)",
    )
    cost_warmup: CostWarmup | None = Field(
        None, description="tool-cost warm-up by training step (code); null: none"
    )
    epsilon: Literal["outside", "inside_sqrt"] = Field(
        "outside", description="SPA spread: sigma + eps (paper) or sqrt(var + eps) (code)"
    )


class TimeLimitConfig(Section):
    """How a training job lives with a scheduler's time limit (docs/cluster.md): it asks SLURM for
    a warning signal, stops at the next step boundary after a checkpoint and exits with a status
    the workflow retries; the retry resumes. Operational: editing these keys retrains nothing."""

    hours: dict[
        str,
        Annotated[
            StrictFloat, Field(gt=0, le=24 * 365, description="hours of one training run of this variant")
        ],
    ] = Field(
        default_factory=lambda: {"default": 40.0},
        description="wall-time estimate of one training run per variant, in hours (rule train_policy's "
        "runtime, capped by the SLURM profile's max_runtime for train_policy); `default` for variants "
        "not listed",
    )
    warning_s: StrictInt = Field(
        1800,
        ge=60,
        le=MAX_SECONDS,
        description="seconds before the time limit at which SLURM signals the job (SIGURG) to stop at "
        "its next step boundary; must cover the rest of a step plus a checkpoint save",
    )
    retries: StrictInt = Field(
        5,
        ge=0,
        le=100,
        description="automatic reruns of a training job (Snakemake retries); each resumes from the newest "
        "checkpoint, so a run longer than the time limit spans up to retries + 1 allocations",
    )
    failure_retries: StrictInt = Field(
        1,
        ge=0,
        le=100,
        description="how many of those reruns may follow an attempt that failed for another reason than a "
        "stop signal or a time limit (0: such a failure waits for a rerun by hand)",
    )

    @model_validator(mode="after")
    def _default_hours(self) -> TimeLimitConfig:
        if "default" not in self.hours:
            raise ValueError("hours: needs a `default` entry (variants not listed take it)")
        return self

    def estimate_minutes(self, variant: str) -> int:
        """The variant's wall-time estimate in whole minutes (SLURM's ``--time``)."""
        return max(1, round(60 * self.hours.get(variant, self.hours["default"])))


class TrainingConfig(Section):
    """verl training hyperparameters (docs/method.md, "Training setup")."""

    epochs: StrictInt = Field(1, ge=1, le=10**4, description="passes over the training mix")
    train_batch_size: StrictInt = Field(32, ge=1, le=2**20, description="prompts per step")
    ppo_mini_batch_size: StrictInt = Field(32, ge=1, le=2**20, description="prompts per PPO mini-batch")
    ppo_micro_batch_size_per_gpu: StrictInt = Field(4, ge=1, le=2**20, description="micro-batch per GPU")
    lr: StrictFloat = Field(1.0e-5, gt=0, le=1, description="AdamW learning rate")
    lr_warmup_ratio: StrictFloat = Field(0.05, ge=0, le=1, description="warm-up fraction of steps")
    rollout_n: StrictInt = Field(16, ge=1, le=2**16, description="rollouts per prompt (G)")
    temperature: StrictFloat = Field(1.0, ge=0, le=10, description="rollout temperature")
    top_p: StrictFloat = Field(1.0, gt=0, le=1, description="rollout top-p")
    kl_loss_coef: StrictFloat = Field(0.001, ge=0, le=100, description="KL loss coefficient")
    kl_loss_type: str = Field("low_var_kl", description="verl KL loss type")
    policy_ratio: Literal["token", "step"] = Field(
        "token",
        description="importance ratio of the clipped objective: token (verl's, one ratio per token "
        "averaged over tokens, as the authors' code trains) or step (the paper's eq. 3, one ratio per "
        "decision step, the product of its tokens' ratios, summed over steps and averaged over "
        "trajectories; a verl policy loss of the plug-in)",
    )
    gamma: StrictFloat = Field(
        0.9,
        ge=0,
        le=1,
        description="discount over decision steps of the step rewards (variants with reward step only; "
        "the other rewards are trained with their own: terminal has one step, stepsearch and r3rag use 1.0)",
    )
    max_prompt_length: StrictInt = Field(512, ge=1, le=2**24, description="prompt tokens")
    max_response_length: StrictInt = Field(
        8192, ge=1, le=2**24, description="response tokens, tool text included"
    )
    gpu_memory_utilization: StrictFloat = Field(
        0.6,
        gt=0,
        le=1,
        description="sglang's mem_fraction_static: its share, for weights and KV cache, of the GPU memory "
        "free when it starts (after verl's models and the reranker; sglang 0.5.14)",
    )
    save_freq: StrictInt = Field(
        100,
        ge=1,
        le=MAX_COUNT,
        description="checkpoint every N steps at most; a GPU training saves more often when its plan says "
        "so, to bound the work a time limit can lose (max_work_lost_minutes; a CPU training saves every N)",
    )
    test_freq: StrictInt = Field(50, ge=1, le=MAX_COUNT, description="validate every N steps")
    val_before_train: bool = Field(
        True, description="validate once before the first step (verl's trainer.val_before_train)"
    )
    max_actor_ckpt_to_keep: StrictInt | None = Field(
        2, ge=1, le=10**4, description="actor checkpoints kept, the newest (null: all)"
    )
    max_critic_ckpt_to_keep: StrictInt | None = Field(
        2, ge=1, le=10**4, description="critic checkpoints kept, the newest (null: all)"
    )
    max_work_lost_minutes: StrictFloat = Field(
        60.0,
        gt=0,
        le=10**6,
        description="most minutes of training a GPU training may lose when its allocation ends without a "
        "save (a time limit whose warning the step and its save do not fit, a lost node): its plan saves "
        "every N steps with N x step + save within this, and refuses a run whose one step and save exceed "
        "it (operational: retrains nothing)",
    )
    keep_checkpoints: bool = Field(
        False,
        description="keep a training's intermediate checkpoints once its export is written (false: the "
        "export step deletes every checkpoint of the work directory but the final one, which a re-export "
        "reads; operational: retrains nothing)",
    )
    seed: StrictInt = Field(
        1,
        ge=0,
        le=MAX_SEED,
        description="training seed: prompt order, mini-batch shuffling, rollout sampling",
    )
    shuffle: bool = Field(
        True,
        description="shuffle the training prompts each epoch (verl's data.shuffle; the authors' code: "
        "false, the file's order)",
    )
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="where verl trains: GPUs, or the CPU (verl's trainer through the project's CPU platform)",
    )
    rollout_backend: Literal["sglang", "transformers"] = Field(
        "sglang", description="rollout engine: sglang (cuda) or the transformers replica (cpu)"
    )
    cpu_workers: StrictInt = Field(
        1, ge=1, le=1024, description="training processes (FSDP ranks) when device is cpu"
    )
    max_steps: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="stop after this many steps (null: the epochs decide)"
    )
    divergences: DivergencesConfig = Field(
        default_factory=DivergencesConfig,
        description='Options reproducing the authors\' published code (docs/method.md, "Known divergences").',
    )
    remove_padding: bool = Field(
        False,
        description="packed micro-batches (verl's remove-padding path) for the actor's, reference's and "
        "critic's passes instead of padded ones with an attention mask: the real tokens only, through "
        "PyTorch's variable-length attention (the project's `spader_varlen` attention; docs/gpu.md)",
    )
    max_token_len_per_gpu: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="token-capped micro-batches (verl's use_dynamic_bsz): each micro-batch holds as many "
        "sequences as fit in this many real tokens, instead of ppo_micro_batch_size_per_gpu sequences; "
        "needs remove_padding (the padded path pads every sequence to the longest, which a token cap does "
        "not bound) and at least max_prompt_length + max_response_length; null: fixed micro-batches",
    )
    nodes: StrictInt = Field(
        1,
        ge=1,
        le=1024,
        description="nodes per training job, each with the backbone's GPUs: a Ray cluster spans them "
        "and verl trains with trainer.nnodes (an LLM-judged R3-RAG variant keeps the last node for its "
        "judge); the default of every variant, variants.<name>.nodes overrides it for one; more than one "
        "needs a cluster executor (docs/cluster.md)",
    )
    time_limit: TimeLimitConfig = Field(
        default_factory=TimeLimitConfig,
        description="How a training job lives with a scheduler's time limit (docs/cluster.md).",
    )
    rollout_timeout_s: StrictFloat = Field(
        1800.0,
        ge=10,
        le=86400,
        description="a training job stops with an error when the rollout engine (sglang, or the CPU replica) "
        "leaves one generation request of a turn unanswered this long, or its server died: a hung or dead "
        "engine would otherwise score every later episode 0; one turn of the paper's sizes takes minutes at most",
    )
    max_search_error_rate: StrictFloat = Field(
        0.2,
        ge=0,
        le=1,
        description="a training job stops with an error when more than this share of the search queries "
        "of a check interval (30 s, at least 50 queries) failed in the retrieval service",
    )
    over_plan_factor: StrictFloat = Field(
        1.5,
        ge=1,
        le=100,
        description="a training job names on the console, in one line, a measured step time (so its run time), GPU "
        "peak or host peak above its plan's by more than this factor (after its first step; docs/gpu.md)",
    )
    stop_when_over_plan: bool = Field(
        False,
        description="a training job over its plan by training.over_plan_factor stops at its next step boundary, "
        "after a checkpoint (a rerun resumes), instead of training on",
    )

    @model_validator(mode="after")
    def _device_runs_backend(self) -> TrainingConfig:
        if (self.device, self.rollout_backend) not in (("cuda", "sglang"), ("cpu", "transformers")):
            raise ValueError(
                f"rollout_backend: {self.rollout_backend!r} cannot serve device {self.device!r} "
                "(cuda trains with sglang, cpu with transformers)"
            )
        return self

    @model_validator(mode="after")
    def _token_cap_on_the_packed_path(self) -> TrainingConfig:
        if self.max_token_len_per_gpu is None:
            return self
        if not self.remove_padding:
            raise ValueError(
                "max_token_len_per_gpu: token-capped micro-batches need remove_padding: true (the padded "
                "path pads every sequence of a micro-batch to its longest, so a cap on real tokens does not "
                "bound the tokens computed)"
            )
        longest = self.max_prompt_length + self.max_response_length
        if self.max_token_len_per_gpu < longest:
            raise ValueError(
                f"max_token_len_per_gpu: {self.max_token_len_per_gpu} is below the longest sequence "
                f"(max_prompt_length + max_response_length = {longest}), which must fit in one micro-batch"
            )
        return self

    @property
    def trajectories_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n
