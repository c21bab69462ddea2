"""StepSearch's and R3-RAG's step rewards in training, and the checks of their verl configs.

A variant selects its step rewards with ``algorithm.step_reward`` (the name its reward has in the
method registry, :attr:`spader.methods.Reward.step_reward`); the ``spader_sync`` trainer mode
builds them from the registry (:func:`spader.integrations.verl.step_rewards.make_step_rewards`):

* ``stepsearch`` (``algorithm.stepsearch``: ``lambda_s``, ``evidence_path``, ``workers``):
  information gain against the question's evidence minus redundancy per search turn
  (:func:`spader.methods.stepsearch.densify.stepsearch_dense_rewards`), verl's ``gae`` after it;
* ``r3rag`` (``algorithm.r3rag.judge``): outcome-scaled process scores from the LLM judge
  (:class:`spader.scorers.judge.JudgeClient`) or the reranker's scores
  (:func:`spader.methods.r3rag.scoring.reranker_relevance`), the per-turn GAE of :mod:`.turn_gae`
  after it.

Both need the search tool to record turn details (:attr:`spader.methods.Reward.record_turns`;
:func:`spader.methods.steps.TurnDetails.fields`). They live here rather than in their method's
folder because they load the evidence and reach the judge (:mod:`spader.scorers`), which the
method registry's layer may not import; their method specs name them by import path.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from spader.config.model import JUDGE_CLIENT_KEYS, JudgeConfig
from spader.core.parsing import final_answer
from spader.methods import ADVANTAGES, REWARDS
from spader.methods.r3rag import JUDGES
from spader.methods.r3rag.densify import r3rag_dense_rewards
from spader.methods.r3rag.scoring import classify_final_turn, judge_messages, reranker_relevance
from spader.methods.steps import FINAL_TURN_KEY, StepBatch, TurnDetails, parse_turn_details
from spader.methods.stepsearch.densify import stepsearch_dense_rewards

__all__ = [
    "JudgeSettings",
    "R3RagRewards",
    "StepSearchRewards",
    "StepSearchSettings",
    "check_r3rag_config",
    "check_stepsearch_config",
]

log = logging.getLogger(__name__)


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


class StepSearchRewards:
    """``algorithm.step_reward=stepsearch``: evidence loaded once, TF-IDF on ``workers`` processes."""

    prefix = "stepsearch/"
    fields = ("extra_info",)

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

    @classmethod
    def from_config(cls, cfg: Any) -> StepSearchRewards:
        """From a full verl config (the ``algorithm.stepsearch`` block)."""
        return cls(StepSearchSettings.from_config(cfg))

    def __call__(self, batch: StepBatch):
        """StepSearch's dense rewards of one training step and their metrics."""
        details = _details(batch)
        extra, info, skip = batch.extra, batch.info, list(batch.skip)
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
        dense, stats = stepsearch_dense_rewards(
            batch.response_mask,
            batch.terminal,
            details,
            keys,
            self.evidence,
            lambda_s=self.settings.lambda_s,
            valid=valid,
            skip=skip,
            pool=self.pool,
        )
        return dense, stats.metrics(self.prefix)


class R3RagRewards:
    """``algorithm.step_reward=r3rag``: process scores from the LLM judge or the reranker."""

    prefix = "r3rag/"
    fields = ("extra_info",)

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

    @classmethod
    def from_config(cls, cfg: Any) -> R3RagRewards:
        """From a full verl config (the ``algorithm.r3rag`` block)."""
        return cls(JudgeSettings.from_config(cfg))

    def __call__(self, batch: StepBatch):
        """R3-RAG's dense rewards of one training step and their metrics."""
        details = _details(batch)
        extra, info, skip = batch.extra, batch.info, list(batch.skip)
        outcomes = [classify_final_turn(str((e or {}).get(FINAL_TURN_KEY) or "")) for e in extra]
        questions = [str(i.get("question", "")) for i in info]
        self.unparsed = 0
        dense, stats = r3rag_dense_rewards(
            batch.response_mask, batch.terminal, outcomes, details, questions, self.score, skip=skip
        )
        stats.count("judge_unparsed", self.unparsed)
        return dense, stats.metrics(self.prefix)


def _details(batch: StepBatch) -> list[list[TurnDetails]]:
    return [
        parse_turn_details(e, where=f"trajectory {k}") for e, k in zip(batch.extra, batch.keys, strict=True)
    ]


def _check_baseline(cfg: Any, reward: str) -> None:
    """What both step-level baselines are defined with: the estimator that trains their reward,
    a critic, and no discount."""
    algorithm = cfg["algorithm"]
    (expected,) = [a.estimator for a in ADVANTAGES.values() if reward in a.rewards]
    if algorithm.get("adv_estimator") != expected:
        raise ValueError(
            f"algorithm.adv_estimator: {reward} is trained with {expected}, got {algorithm.get('adv_estimator')}"
        )
    if not cfg["critic"].get("enable"):
        raise ValueError(f"critic.enable: {reward} trains a critic (PPO), got {cfg['critic'].get('enable')}")
    for key in ("gamma", "lam"):
        if float(algorithm.get(key, 1.0)) != 1.0:
            raise ValueError(f"algorithm.{key}: {reward} uses 1.0, got {algorithm.get(key)}")


def check_stepsearch_config(cfg: Any) -> None:
    """Checks of a StepSearch config that verl cannot make (the registry's ``checks`` of reward
    ``stepsearch``): well-formed settings, the estimator it is defined with, a critic, no discount.

    Raises:
        ValueError naming the key.
    """
    StepSearchSettings.from_config(cfg)
    _check_baseline(cfg, REWARDS["stepsearch"].name)


def check_r3rag_config(cfg: Any) -> None:
    """Checks of an R3-RAG config that verl cannot make (the registry's ``checks`` of reward
    ``r3rag``): a well-formed judge, the estimator it is defined with, a critic, no discount.

    Raises:
        ValueError naming the key.
    """
    JudgeSettings.from_config(cfg)
    _check_baseline(cfg, REWARDS["r3rag"].name)
