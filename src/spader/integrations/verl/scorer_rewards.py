"""StepSearch and R3-RAG in verl: their step rewards inside the ``spader_sync`` trainer mode.

A variant selects its step-reward function with ``algorithm.step_reward`` (``spader`` when the
key is absent). The trainer mode is the same for all (:mod:`.trainer`): before verl's advantage,
the chosen function reads the batch from TransferQueue and writes dense ``rm_scores``:

* ``stepsearch`` (``algorithm.stepsearch``: ``lambda_s``, ``evidence_path``, ``workers``):
  information gain against the question's evidence minus redundancy per search turn
  (:func:`spader.core.scorer_densify.stepsearch_dense_rewards`), verl's ``gae`` after it;
* ``r3rag`` (``algorithm.r3rag.judge``): outcome-scaled process scores from the LLM judge
  (:class:`spader.scorers.judge.JudgeClient`) or the reranker's scores
  (:func:`spader.core.r3rag.reranker_relevance`), the per-turn GAE of :mod:`.turn_gae` after it.

Both need the search tool to record turn details (tool config ``record_turns: true``, set by the
training launcher for these variants; :func:`turn_fields`).
"""

from __future__ import annotations

import logging
import multiprocessing
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.workers.utils.padding import response_to_nested

from spader.config.model import JUDGE_CLIENT_KEYS, JudgeConfig
from spader.core.methods import ADVANTAGES, REWARDS
from spader.core.parsing import final_answer
from spader.core.r3rag import classify_final_turn, judge_messages, reranker_relevance, turn_reasoning
from spader.core.scorer_densify import (
    TurnDetails,
    parse_turn_details,
    r3rag_dense_rewards,
    stepsearch_dense_rewards,
)
from spader.core.spader_densify import FINAL_TURN_KEY

__all__ = [
    "JUDGES",
    "STEP_REWARDS",
    "JudgeSettings",
    "R3RagRewards",
    "StepSearchRewards",
    "StepSearchSettings",
    "check_scorer_config",
    "make_step_rewards",
    "step_reward_kind",
    "turn_fields",
]

log = logging.getLogger(__name__)

#: ``algorithm.step_reward`` values: SPADER's own rewards and the two baselines' (the registry's).
STEP_REWARDS = tuple(r.step_reward for r in REWARDS.values() if r.step_reward is not None)
#: R3-RAG judges: an LLM behind an OpenAI-compatible endpoint, or the reranker's scores.
JUDGES = ("llm", "reranker")


def step_reward_kind(cfg: Any) -> str:
    """``algorithm.step_reward`` of a full verl config (``spader`` when absent)."""
    kind = str(cfg["algorithm"].get("step_reward") or REWARDS["step"].step_reward)
    if kind not in STEP_REWARDS:
        raise ValueError(f"algorithm.step_reward must be one of {STEP_REWARDS}, got {kind!r}")
    return kind


def _block(cfg: Any, name: str) -> Mapping[str, Any]:
    block = cfg["algorithm"].get(name)
    if block is None:
        raise ValueError(f"algorithm.{name} is missing: algorithm.step_reward={name} needs it")
    return block


@dataclass(frozen=True)
class StepSearchSettings:
    """``algorithm.stepsearch``: the step-reward scale (``variants.<name>.lambda_s``), the evidence
    artifact (rule build_evidence) and the TF-IDF processes (``stepsearch.workers``), all set at
    launch."""

    lambda_s: float
    evidence_path: str | None
    workers: int

    def __post_init__(self):
        if self.lambda_s < 0 or self.workers < 0:
            raise ValueError(f"algorithm.stepsearch: lambda_s and workers must be >= 0, got {self}")

    @classmethod
    def from_config(cls, cfg: Any) -> StepSearchSettings:
        b = _block(cfg, "stepsearch")
        try:
            path = b["evidence_path"]
            return cls(float(b["lambda_s"]), None if path is None else str(path), int(b["workers"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"algorithm.stepsearch is malformed ({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class JudgeSettings:
    """``algorithm.r3rag.judge``: which judge, and for the LLM judge the ``judge`` section it is
    reached with (its ``model``, ``url`` and client keys, set at launch; None for the reranker)."""

    kind: str
    client: JudgeConfig | None

    def __post_init__(self):
        if self.kind not in JUDGES:
            raise ValueError(f"algorithm.r3rag.judge.kind must be one of {JUDGES}, got {self.kind!r}")
        if (self.kind == "llm") != (self.client is not None):
            raise ValueError("algorithm.r3rag.judge: the llm judge (and only it) has client settings")

    @classmethod
    def from_config(cls, cfg: Any) -> JudgeSettings:
        j = _block(cfg, "r3rag").get("judge")
        if j is None:
            raise ValueError("algorithm.r3rag.judge is missing")
        try:
            kind = str(j["kind"])
            if kind != "llm":
                return cls(kind=kind, client=None)
            keys = ("model", "url", *JUDGE_CLIENT_KEYS)
            return cls(kind=kind, client=JudgeConfig.model_validate({k: j[k] for k in keys}))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and str(exc).startswith("algorithm."):
                raise
            raise ValueError(f"algorithm.r3rag.judge is malformed ({type(exc).__name__}: {exc})") from exc


def turn_fields(
    shown, queries: Sequence[str], observation: str, extra_fields: Mapping[str, Any] | None
) -> dict:
    """What the search tool adds to its step record for the baselines (see
    :meth:`spader.core.scorer_densify.TurnDetails.fields`). The turn's text is the one the agent
    loop recorded for the turn being executed (:data:`spader.core.spader_densify.FINAL_TURN_KEY`)."""
    text = str((extra_fields or {}).get(FINAL_TURN_KEY) or "")
    return TurnDetails.fields(shown, queries, turn_reasoning(text), observation)


_FIELDS = ["response_mask", "rm_scores", "extra_fields", "extra_info"]


def _padded(t: torch.Tensor, value) -> torch.Tensor:
    return t.to_padded_tensor(value) if t.is_nested else t


class _BatchRewards(ABC):
    """Shared TransferQueue I/O: read the batch, compute dense rewards, write ``rm_scores``."""

    prefix = ""

    def __call__(self, batch, global_step: int) -> dict[str, float]:
        """Replace the batch's ``rm_scores`` by the dense step rewards; returns metrics."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=_FIELDS)
        stored_mask = data["response_mask"]
        response_mask = _padded(stored_mask, 0)
        terminal = _padded(data["rm_scores"], 0.0).sum(dim=1)
        extra = list(data["extra_fields"])
        info = [dict(i or {}) for i in data["extra_info"]]
        details = [
            parse_turn_details(e, where=f"trajectory {k}") for e, k in zip(extra, batch.keys, strict=True)
        ]
        skip = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        dense, stats = self.dense(response_mask, terminal, extra, info, details, skip)
        rm_scores = response_to_nested(dense, stored_mask) if stored_mask.is_nested else dense
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"rm_scores": rm_scores}, batch_size=len(batch)),
        )
        return stats.metrics(self.prefix)

    @abstractmethod
    def dense(self, response_mask, terminal, extra, info, details, skip):
        """The dense token rewards and their statistics (one implementation per baseline)."""


class StepSearchRewards(_BatchRewards):
    """``algorithm.step_reward=stepsearch``: evidence loaded once, TF-IDF on ``workers`` processes."""

    prefix = "stepsearch/"

    def __init__(self, settings: StepSearchSettings):
        from spader.scorers.evidence import read_evidence

        if not settings.evidence_path:
            raise ValueError(
                "algorithm.stepsearch.evidence_path is not set: the training launcher passes the "
                "output of rule build_evidence"
            )
        self.settings = settings
        self.evidence = read_evidence(settings.evidence_path)
        self.pool = None
        if settings.workers > 0:
            # spawn: the trainer process holds torch threads and sockets a fork would copy
            context = multiprocessing.get_context("spawn")
            self.pool = ProcessPoolExecutor(max_workers=settings.workers, mp_context=context)
        log.info("StepSearch: evidence of %d questions from %s", len(self.evidence), settings.evidence_path)

    def dense(self, response_mask, terminal, extra, info, details, skip):
        keys = [str(i.get("id", "")) for i in info]
        missing = sorted({k for k, s in zip(keys, skip, strict=True) if not s and k not in self.evidence})
        if missing:
            raise KeyError(
                f"{len(missing)} training questions have no entry in {self.settings.evidence_path} "
                f"(e.g. {missing[:3]}): rebuild the evidence for this training mix"
            )
        # as StepSearch's code: an invalid final answer earns no step rewards (read as the
        # terminal reward reads it, so the two always agree)
        valid = [final_answer(str((e or {}).get(FINAL_TURN_KEY) or "")).valid for e in extra]
        return stepsearch_dense_rewards(
            response_mask,
            terminal,
            details,
            keys,
            self.evidence,
            lambda_s=self.settings.lambda_s,
            valid=valid,
            skip=skip,
            pool=self.pool,
        )


class R3RagRewards(_BatchRewards):
    """``algorithm.step_reward=r3rag``: process scores from the LLM judge or the reranker."""

    prefix = "r3rag/"

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        self.client = None
        judge = settings.client
        if judge is not None:
            from spader.scorers.judge import JudgeClient

            if not judge.url:
                raise ValueError(
                    "algorithm.r3rag.judge.url is not set: the training job starts the judge server "
                    "(judge.gpus) or takes judge.url from the workflow config"
                )
            self.client = JudgeClient(
                judge.url,
                judge.model,
                timeout=judge.timeout_s,
                retries=judge.retries,
                concurrency=judge.concurrency,
                max_tokens=judge.max_tokens,
                temperature=judge.temperature,
                unparsable=judge.unparsable,
            )
            self.client.check()
        self.unparsed = 0

    def score(self, items: Sequence[tuple[str, TurnDetails]]) -> list[float]:
        """Process scores of ``(question, turn)`` items with the configured judge."""
        if self.client is None:
            return [reranker_relevance(d.scores) for _, d in items]
        verdicts = self.client.judge_many(
            [judge_messages(q, d.reasoning, d.queries, d.observation) for q, d in items]
        )
        self.unparsed = sum(not v.parsed for v in verdicts)
        return [v.score for v in verdicts]

    def dense(self, response_mask, terminal, extra, info, details, skip):
        outcomes = [classify_final_turn(str((e or {}).get(FINAL_TURN_KEY) or "")) for e in extra]
        questions = [str(i.get("question", "")) for i in info]
        self.unparsed = 0
        dense, stats = r3rag_dense_rewards(
            response_mask, terminal, outcomes, details, questions, self.score, skip=skip
        )
        stats.count("judge_unparsed", self.unparsed)
        return dense, stats


def make_step_rewards(cfg: Any) -> _BatchRewards | None:
    """The step-reward function a config selects; None for SPADER's own (see :mod:`.trainer`)."""
    kind = step_reward_kind(cfg)
    if kind == "stepsearch":
        return StepSearchRewards(StepSearchSettings.from_config(cfg))
    if kind == "r3rag":
        return R3RagRewards(JudgeSettings.from_config(cfg))
    return None


def check_scorer_config(cfg: Any) -> None:
    """Checks of a StepSearch / R3-RAG config that verl cannot make (called by
    :func:`spader.integrations.verl.compose.validate`): well-formed settings, a critic, the
    estimator each baseline is defined with, and no discount.

    Raises:
        ValueError naming the key.
    """
    kind = step_reward_kind(cfg)
    algorithm = cfg["algorithm"]
    if kind not in ("stepsearch", "r3rag"):
        raise ValueError(f"algorithm.step_reward={kind} is not a step-level baseline")
    (expected,) = [a.estimator for a in ADVANTAGES.values() if kind in a.rewards]
    if kind == "stepsearch":
        StepSearchSettings.from_config(cfg)
    else:
        JudgeSettings.from_config(cfg)
    if algorithm.get("adv_estimator") != expected:
        raise ValueError(
            f"algorithm.adv_estimator: {kind} is trained with {expected}, got {algorithm.get('adv_estimator')}"
        )
    if not cfg["critic"].get("enable"):
        raise ValueError(f"critic.enable: {kind} trains a critic (PPO), got {cfg['critic'].get('enable')}")
    for key in ("gamma", "lam"):
        if float(algorithm.get(key, 1.0)) != 1.0:
            raise ValueError(f"algorithm.{key}: {kind} uses 1.0, got {algorithm.get(key)}")
