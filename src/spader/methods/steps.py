"""The search tool's step records, and what every method's step rewards share.

The search tool records each search step of a trajectory in the rollout's extra fields
(:data:`STEPS_KEY`): which ground-truth entities the returned passages held (:class:`StepRecord`,
what SPADER's rewards read) and, where a method asks for them (tool config ``record_turns: true``),
the turn's passages, queries, reasoning and observation (:class:`TurnDetails`, what the step-level
baselines read). Turn t of a trajectory is its t-th assistant run
(:func:`spader.core.advantage.segment_steps`); a step's reward goes on the last token of its run
(:func:`spader.core.advantage.place_step_rewards`), never on an observation token.

A method's step rewards (:attr:`spader.methods.Reward.step_rewards`) are a callable
:class:`StepRewards` taking one training step's :class:`StepBatch` and giving the dense token
rewards and their metrics; the verl trainer mode reads the batch from TransferQueue and writes the
rewards back, the same for every method.

Pure: torch and the core only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from spader.core.advantage import place_step_rewards, segment_steps
from spader.methods.r3rag.scoring import OBSERVATION_CHARS

__all__ = [
    "FAILURE_KEY",
    "FINAL_TURN_KEY",
    "N_GOLD_KEY",
    "STEPS_KEY",
    "StepBatch",
    "StepRecord",
    "StepRewards",
    "StepStats",
    "TurnDetails",
    "parse_step_records",
    "parse_turn_details",
    "place_rows",
    "records_by_turn",
    "rows_with_steps",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepBatch:
    """One training step's trajectories, as a method's step rewards read them.

    Attributes:
        response_mask: (B, L) 1 on assistant tokens, 0 on observation and padding tokens.
        terminal: (B,) the terminal reward of each trajectory (F1 or the invalid-format reward).
        uids: (B,) prompt group of each trajectory.
        extra: (B,) the rollouts' extra fields (the search tool's records, the final turn).
        info: (B,) the rows' ``extra_info`` (question id, question text), read only for step
            rewards that ask for it (``fields``); else empty.
        skip: (B,) True for verl's padding rows, which keep zero rewards.
        keys: (B,) the trajectories' keys (named in errors).
        step: the training step (1-based).
    """

    response_mask: Tensor
    terminal: Tensor
    uids: Sequence[str]
    extra: Sequence[Mapping[str, Any] | None]
    info: Sequence[Mapping[str, Any]]
    skip: Sequence[bool]
    keys: Sequence[Any]
    step: int


class StepRewards(Protocol):
    """A method's step rewards: ``(dense (B, L) float32 token rewards, {metric: value})``. An
    attribute ``fields`` may name batch fields to read beyond the response mask, the terminal
    reward, the uids and the extra fields (``("extra_info",)`` for :attr:`StepBatch.info`)."""

    def __call__(self, batch: StepBatch) -> tuple[Tensor, dict[str, float]]: ...


#: Extra-field key of the list of :class:`StepRecord` dicts written by the search tool.
STEPS_KEY = "spader_steps"
#: Extra-field key of the number of ground-truth entities (``|E_GT|``) of the trajectory's question.
N_GOLD_KEY = "spader_n_gold"
#: Extra-field key of the text of the trajectory's last assistant turn (read by the reward).
FINAL_TURN_KEY = "spader_final_turn"
#: Extra-field key of why an episode failed (set only then): it is scored 0 and trains nothing.
FAILURE_KEY = "spader_episode_error"


@dataclass(frozen=True)
class StepRecord:
    """What one search step found.

    Attributes:
        turn: 1-based assistant turn that issued the search.
        queries: number of queries issued at that step (``q_t``: all of them, also those beyond
            the per-call cap that the tool did not run).
        hits: indices of the ground-truth entities found in the returned passages.
        error: why the step returned an error observation instead of passages (None if it did not).
    """

    turn: int
    queries: int
    hits: frozenset[int] = frozenset()
    error: str | None = None

    def __post_init__(self):
        if not isinstance(self.hits, frozenset):
            object.__setattr__(self, "hits", frozenset(self.hits))

    def as_dict(self) -> dict[str, Any]:
        """Plain-type form stored in the rollout's extra fields."""
        return {"turn": self.turn, "queries": self.queries, "hits": sorted(self.hits), "error": self.error}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "") -> StepRecord:
        """Validate a stored record; errors name the record and the field."""
        try:
            turn, queries = int(d["turn"]), int(d["queries"])
            hits = frozenset(int(h) for h in d.get("hits", ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"invalid step record {where}: {dict(d)!r} ({type(exc).__name__}: {exc})"
            ) from exc
        if turn < 1 or queries < 0:
            raise ValueError(
                f"invalid step record {where}: turn must be >= 1 and queries >= 0, got {dict(d)!r}"
            )
        return cls(turn=turn, queries=queries, hits=hits, error=d.get("error"))


def parse_step_records(extra_fields: Mapping[str, Any] | None, where: str = "") -> list[StepRecord]:
    """The :class:`StepRecord` list of one rollout's extra fields (empty when it never searched)."""
    raw = (extra_fields or {}).get(STEPS_KEY) or []
    return [StepRecord.from_dict(r, where=f"{where}[{j}]") for j, r in enumerate(raw)]


# Keys the search tool adds to a step record when it records details (see TurnDetails.fields).
_DETAIL_KEYS = ("passages", "query_texts", "reasoning", "observation")


@dataclass(frozen=True)
class TurnDetails:
    """What one search turn showed, as the step-level baselines need it.

    Attributes:
        turn: 1-based assistant turn that issued the search.
        passage_ids, passage_texts, scores: the passages shown (all queries, rank order, repeats
            kept), their text (title and body) and search score (the reranker's, when reranking).
        queries: the queries run.
        reasoning: the turn's reasoning (:func:`spader.methods.r3rag.scoring.turn_reasoning`).
        observation: the start of the observation text (what an LLM judge reads).
        error: why the turn returned an error instead of passages (None if it did not).
    """

    turn: int
    passage_ids: tuple[str, ...] = ()
    passage_texts: tuple[str, ...] = ()
    scores: tuple[float, ...] = ()
    queries: tuple[str, ...] = ()
    reasoning: str = ""
    observation: str = ""
    error: str | None = None

    @staticmethod
    def fields(
        shown: Sequence[Sequence[Mapping[str, Any]]], queries: Sequence[str], reasoning: str, observation: str
    ) -> dict[str, Any]:
        """The keys the search tool adds to its step record (plain types, for the extra fields).

        Args:
            shown: per query, the passages the observation shows (``id``, ``title``, ``text``,
                ``score``).
            queries: the queries run.
            reasoning: the turn's reasoning.
            observation: the observation text (cut here to what a judge reads).
        """
        passages = [
            {
                "id": str(p.get("id", "")),
                "text": f"{p.get('title', '')} {p.get('text', '')}".strip(),
                "score": float(p.get("score", 0.0) or 0.0),
            }
            for per_query in shown
            for p in per_query
        ]
        return {
            "passages": passages,
            "query_texts": [str(q) for q in queries],
            "reasoning": str(reasoning),
            "observation": str(observation)[:OBSERVATION_CHARS],
        }

    @classmethod
    def from_record(cls, d: Mapping[str, Any], where: str = "") -> TurnDetails:
        """Validate one stored step record with details; errors name the record and the field."""
        missing = [k for k in ("turn", *_DETAIL_KEYS) if k not in d]
        if missing:
            raise ValueError(
                f"step record {where} lacks {missing}: the step-level baselines need the search tool to "
                "record turn details (tool config 'record_turns: true')"
            )
        try:
            passages = list(d["passages"] or ())
            return cls(
                turn=int(d["turn"]),
                passage_ids=tuple(str(p["id"]) for p in passages),
                passage_texts=tuple(str(p["text"]) for p in passages),
                scores=tuple(float(p.get("score", 0.0)) for p in passages),
                queries=tuple(str(q) for q in (d["query_texts"] or ())),
                reasoning=str(d["reasoning"] or ""),
                observation=str(d["observation"] or ""),
                error=d.get("error"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid step record {where}: {type(exc).__name__}: {exc}") from exc


def parse_turn_details(extra_fields: Mapping[str, Any] | None, where: str = "") -> list[TurnDetails]:
    """The :class:`TurnDetails` of one rollout's extra fields (empty when it never searched)."""
    raw = (extra_fields or {}).get(STEPS_KEY) or []
    return [TurnDetails.from_record(r, where=f"{where}[{j}]") for j, r in enumerate(raw)]


@dataclass
class StepStats:
    """Bookkeeping of one batch, logged as training metrics under ``<prefix>``.

    Attributes:
        trajectories: rows rewarded.
        search_turns: search turns rewarded.
        dropped_records: records without an assistant turn to sit on (ignored).
        empty_responses: rows without any assistant token.
        sums: named sums (divided by ``trajectories`` or ``search_turns`` in :meth:`metrics`).
        counts: named counts, logged as they are.
    """

    trajectories: int = 0
    search_turns: int = 0
    dropped_records: int = 0
    empty_responses: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def count(self, name: str, value: float = 1.0) -> None:
        self.counts[name] = self.counts.get(name, 0.0) + float(value)

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat metric dict: per-turn means for ``turn_*`` sums, per-trajectory means otherwise."""
        out = {
            f"{prefix}search_turns/mean": self.search_turns / max(self.trajectories, 1),
            f"{prefix}dropped_step_records": float(self.dropped_records),
            f"{prefix}empty_responses": float(self.empty_responses),
        }
        for name, total in self.sums.items():
            per = self.search_turns if name.startswith("turn_") else self.trajectories
            out[f"{prefix}{name}/mean"] = total / max(per, 1)
        out.update({f"{prefix}{k}": v for k, v in self.counts.items()})
        return out


def rows_with_steps(response_mask: Tensor, skip: Sequence[bool] | None, stats: StepStats):
    steps = segment_steps(response_mask)
    counts = steps.count.tolist()
    skip = list(skip) if skip is not None else [False] * len(counts)
    rows = []
    for i, c in enumerate(counts):
        if skip[i]:
            continue
        if c == 0:
            stats.empty_responses += 1
            continue
        rows.append(i)
    return steps, counts, rows


def records_by_turn(
    details: Sequence[TurnDetails], n_turns: int, stats: StepStats
) -> list[TurnDetails | None]:
    """Each record on the run of its turn; records beyond the runs, or a second one, are dropped."""
    out: list[TurnDetails | None] = [None] * n_turns
    for d in details:
        t = d.turn - 1
        if not 0 <= t < n_turns or out[t] is not None:
            stats.dropped_records += 1
            continue
        out[t] = d
    return out


def place_rows(rewards: list[list[float]], steps, length: int) -> Tensor:
    width = max((len(r) for r in rewards), default=1) or 1
    table = torch.tensor([r + [0.0] * (width - len(r)) for r in rewards], dtype=torch.float32)
    return place_step_rewards(table.reshape(len(rewards), width), steps, length)
