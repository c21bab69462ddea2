"""The step baselines' sections: ``stepsearch`` (its evidence) and ``judge`` (R3-RAG's LLM judge)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat, StrictInt, StringConstraints

from spader.config.sections.base import MAX_INITIAL_K, MAX_SECONDS, Section

__all__ = [
    "JUDGE_CLIENT_KEYS",
    "EvidenceConfig",
    "JudgeConfig",
    "StepSearchConfig",
]


class EvidenceConfig(Section):
    """Rule build_evidence, one evidence passage per gold entity of the training mix."""

    depth: StrictInt = Field(
        50, ge=1, le=MAX_INITIAL_K, description="passages per query kept after reranking"
    )
    queries_per_request: StrictInt = Field(
        128, ge=1, le=2**20, description="queries per request to the retrieval service"
    )
    concurrency: StrictInt = Field(2, ge=1, le=1024, description="requests in flight")
    qampari_proof_text: bool = Field(
        False, description="QAMPARI entities take the release's proof_text instead"
    )
    gpus: StrictInt = Field(1, ge=0, le=1024, description="GPUs of the job (the reranker's)")


class StepSearchConfig(Section):
    """StepSearch (docs/baselines.md): its evidence and reward computation."""

    evidence: EvidenceConfig = Field(
        default_factory=EvidenceConfig,
        description="Rule build_evidence, one evidence passage per gold entity of the training mix.",
    )
    workers: StrictInt = Field(
        4, ge=0, le=1024, description="processes computing the per-passage TF-IDF in training (0: none)"
    )


#: The judge settings the trainer's judge client reads (besides ``model`` and ``url``).
JUDGE_CLIENT_KEYS = ("timeout_s", "retries", "concurrency", "max_tokens", "temperature", "unparsable")


class JudgeConfig(Section):
    """R3-RAG's LLM judge (variants with judge llm)."""

    model: str = Field(
        "Qwen/Qwen2.5-14B-Instruct", min_length=1, description="hub id or local path of the judge model"
    )
    revision: str | None = Field(None, description="hub commit of the judge weights")
    url: Annotated[str, StringConstraints(pattern=r"^https?://")] | None = Field(
        None,
        description="OpenAI-compatible base URL of a running judge (null: serve one on the training node)",
    )
    gpus: StrictInt = Field(
        4, ge=1, le=1024, description="GPUs of the training node set aside for the judge server"
    )
    tensor_parallel: StrictInt = Field(1, ge=1, le=1024, description="GPUs per judge replica")
    mem_fraction: StrictFloat = Field(0.85, gt=0, le=1, description="sglang mem_fraction_static of the judge")
    max_tokens: StrictInt = Field(
        4096, ge=1, le=2**24, description="reply budget of the judge (R3-RAG's original: 4,096 tokens)"
    )
    temperature: StrictFloat | None = Field(
        0.0, ge=0, le=10, description="judge sampling temperature; null: the server's default (R3-RAG's code)"
    )
    unparsable: Literal["zero", "raise"] = Field(
        "zero",
        description="a reply without a Relevance verdict: zero (scores 0 and is logged) or raise (an "
        "error, as R3-RAG's code)",
    )
    startup_timeout_s: StrictFloat = Field(
        1800, ge=1, le=MAX_SECONDS, description="how long the judge server may take to load"
    )
    timeout_s: StrictFloat = Field(120, gt=0, le=MAX_SECONDS, description="timeout per judge request")
    retries: StrictInt = Field(
        3, ge=0, le=100, description="retries on connection errors, timeouts, 429 and 5xx"
    )
    concurrency: StrictInt = Field(64, ge=1, le=2**16, description="judge requests in flight")
