"""R3-RAG's outcome-scaled process rewards and per-turn returns (docs/baselines.md, "R3-RAG").

Every search turn t gets a process score ``rho_t`` in [0, 1] from an external judge (an LLM that
reads the question, the turn's reasoning, queries and observation, or the reranker's scores of the
turn's passages); the outcome of the trajectory then scales them:

==========================  =============================  =====================
outcome                     search turn t                  last turn
==========================  =============================  =====================
valid answer, F1 = F        ``(0.8 + 0.8 F) * rho_t``      ``2 F``
no answer (turn budget)     ``0.9 * rho_t``                ``0.9 * rho_last``
invalid format              ``rho_t`` (unscaled)           ``-0.9``
==========================  =============================  =====================

``F = 1`` gives R3-RAG's x1.6 for a correct answer and ``F = 0`` its x0.8 for a wrong one; the
"no answer" case is a trajectory whose last turn is a well-formed search call (the budget ran
out before it could answer). Any other last turn without a valid answer is an invalid format.

The advantage treats each turn as its own episode (R3-RAG trains every step as a separate
sample): :func:`turn_returns` sums the token rewards from each token to the end of its assistant
turn, with nothing carried over from later turns.

Also here: the judge's prompt (:func:`judge_messages`) and the parsing of its verdict
(:func:`parse_relevance`); the network client lives in :mod:`spader.scorers.judge`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

import torch
from torch import Tensor

from spader.core.advantage import segment_steps, steps_to_tokens
from spader.core.parsing import parse_answer, parse_turn

__all__ = [
    "OBSERVATION_CHARS",
    "OUTCOMES",
    "classify_final_turn",
    "judge_messages",
    "parse_relevance",
    "r3rag_rewards",
    "reranker_relevance",
    "turn_gae",
    "turn_reasoning",
    "turn_returns",
]

#: Outcome states of a trajectory (see the module table).
OUTCOMES = ("answered", "no_answer", "invalid")
#: The judge sees the turn's observation cut to this many characters.
OBSERVATION_CHARS = 512

# R3-RAG's outcome factors: x1.6 correct and x0.8 wrong become 0.8 + 0.8 F; x0.9 no answer.
_FACTOR_AT_ZERO = 0.8
_FACTOR_SLOPE = 0.8
_NO_ANSWER_FACTOR = 0.9
_INVALID_REWARD = -0.9
_ANSWER_SCALE = 2.0

JUDGE_TEMPLATE = """\
You are grading one step of a search agent. The agent must answer a question by listing every \
entity that satisfies it; at this step it reasoned, issued search queries, and received documents.

Question: {question}

The agent's reasoning at this step:
{reasoning}

Its search queries: {queries}

The documents it received (cut to the first {chars} characters):
{observation}

Rate the step on one scale from 0.00 to 1.00: how relevant the received documents are to what \
the queries were looking for, and how useful they are for answering the question. If the \
reasoning is contradictory or illogical, the rating is 0.00.

Start your reply with a first line of exactly this form, then explain the rating briefly:
Relevance: x.xx"""

_RELEVANCE = re.compile(r"relevance\s*[:=]\s*\**\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))", re.IGNORECASE)
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_TAGS = re.compile(r"</?(?:think|tool_call|answer)>")


def turn_reasoning(text: str) -> str:
    """The reasoning of one assistant turn: its ``<think>`` content, else the text before the call.

    >>> turn_reasoning('<think>Films by Varga.</think><tool_call>["Varga films"]</tool_call>')
    'Films by Varga.'
    """
    inside = [m.strip() for m in _THINK.findall(text)]
    if any(inside):
        return "\n".join(s for s in inside if s)
    before = text.split("<tool_call>", 1)[0]
    return _TAGS.sub(" ", before).strip()


def judge_messages(
    question: str, reasoning: str, queries: Sequence[str], observation: str, *, chars: int = OBSERVATION_CHARS
) -> list[dict[str, str]]:
    """Chat messages asking the judge for one search turn's process score (no gold answers).

    Args:
        question: the training question.
        reasoning: the turn's reasoning (:func:`turn_reasoning`).
        queries: the turn's queries.
        observation: the observation text the agent saw.
        chars: the observation is cut to this many characters.
    Returns:
        One user message.
    """
    text = JUDGE_TEMPLATE.format(
        question=question.strip(),
        reasoning=reasoning.strip() or "(none)",
        queries="; ".join(json.dumps(q, ensure_ascii=False) for q in queries) or "(none)",
        chars=chars,
        observation=observation[:chars].strip() or "(nothing)",
    )
    return [{"role": "user", "content": text}]


def parse_relevance(reply: str | None) -> float | None:
    """The judge's verdict ``Relevance: x.xx``, clamped to [0, 1].

    The prompt asks for the verdict first (R3-RAG's reply format); a judge that explains first and
    gives its verdict at the end is read as well: the verdict is the first ``Relevance:`` followed
    by a number, wherever it stands (an explanation's ``- Relevance: [why]`` carries none).
    Returns None when the reply holds no such number (the caller counts it as 0 and logs it).

    >>> parse_relevance("Relevance: 0.75\\nEvaluation:\\n- Relevance: both documents fit")
    0.75
    >>> parse_relevance("The documents list two films.\\nRelevance: 0.6"), parse_relevance("Relevance: 1.3")
    (0.6, 1.0)
    >>> parse_relevance("Relevance: x.xx") is None
    True
    """
    if not reply:
        return None
    found = _RELEVANCE.search(reply)
    if found is None:
        return None
    value = float(found.group(1))
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def reranker_relevance(scores: Sequence[float]) -> float:
    """The ``reranker`` judge: max over the turn's passages of ``sigmoid(reranker score)``.

    >>> round(reranker_relevance([-1.0, 2.0]), 4), reranker_relevance([])
    (0.8808, 0.0)
    """
    if not scores:
        return 0.0
    best = max(float(s) for s in scores)
    return 1.0 / (1.0 + math.exp(-best)) if best > -700 else 0.0


def classify_final_turn(text: str) -> str:
    """Outcome of a trajectory from its last assistant turn: ``answered`` (a valid answer),
    ``no_answer`` (a well-formed search call: the budget ended the episode) or ``invalid``.

    >>> [classify_final_turn(t) for t in ('<answer>["A"]</answer>', '<tool_call>["q"]</tool_call>', "hm")]
    ['answered', 'no_answer', 'invalid']
    """
    # the answer is read exactly as the terminal reward reads it, so the two always agree
    if parse_answer(text).valid:
        return "answered"
    turn = parse_turn(text)
    if turn.kind == "search" and turn.tool_call is not None and turn.tool_call.error is None:
        return "no_answer"
    return "invalid"


def r3rag_rewards(rho: Sequence[float], outcome: str, f1: float | None = None) -> list[float]:
    """Rewards of one trajectory's assistant turns (see the module table).

    Args:
        rho: process score of every turn, last turn included (its score only counts when the
            outcome is ``no_answer``; pass 0 for a turn without a search).
        outcome: one of :data:`OUTCOMES`.
        f1: F1 of the final answer (``answered`` only).
    Returns:
        One reward per turn.

    >>> r3rag_rewards([0.5, 0.0], "answered", 1.0), r3rag_rewards([0.5, 0.25], "no_answer")
    ([0.8, 2.0], [0.45, 0.225])
    >>> r3rag_rewards([0.5, 0.3], "invalid")
    [0.5, -0.9]
    """
    if not rho:
        raise ValueError("a trajectory has at least one assistant turn")
    if any(not 0.0 <= r <= 1.0 for r in rho):
        raise ValueError(f"process scores must lie in [0, 1], got {list(rho)}")
    if outcome == "answered":
        if f1 is None or not 0.0 <= f1 <= 1.0:
            raise ValueError(f"an answered trajectory needs its F1 in [0, 1], got {f1!r}")
        factor = _FACTOR_AT_ZERO + _FACTOR_SLOPE * f1
        return [factor * r for r in rho[:-1]] + [_ANSWER_SCALE * f1]
    if outcome == "no_answer":
        return [_NO_ANSWER_FACTOR * r for r in rho]
    if outcome == "invalid":
        return [float(r) for r in rho[:-1]] + [_INVALID_REWARD]
    raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")


def turn_returns(token_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Reward-to-go inside each assistant turn: ``G_j = sum of r_k for k >= j in j's turn``.

    Rewards of later turns are not carried back (each turn is its own episode, gamma = 1);
    observation and padding tokens get 0.

    Args:
        token_rewards: (B, L) float.
        response_mask: (B, L) 1 on assistant tokens.
    Returns:
        (B, L) in the dtype of ``token_rewards``.

    >>> turn_returns(torch.tensor([[1.0, 2.0, 0.0, 3.0, 4.0]]), torch.tensor([[1, 1, 0, 1, 1]])).tolist()
    [[3.0, 2.0, 0.0, 7.0, 4.0]]
    """
    steps = segment_steps(response_mask)
    inside = steps.assistant.to(torch.float64)
    r = token_rewards.to(torch.float64) * inside
    # suffix sums along the row; a turn's sum is its suffix sum minus the one after its last token
    suffix = torch.cat([r.flip(1).cumsum(1).flip(1), r.new_zeros(r.size(0), 1)], dim=1)
    tail = torch.zeros(steps.count.numel(), steps.max_steps, dtype=torch.float64, device=r.device)
    tail[steps.rows, steps.number] = suffix[steps.rows, steps.ends + 1]
    out = (suffix[:, :-1] - steps_to_tokens(tail, steps)) * inside
    return out.to(token_rewards.dtype)


def turn_gae(token_rewards: Tensor, values: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """GAE with gamma = lambda = 1 restricted to each assistant turn (bootstrap 0 at its end).

    With gamma = lambda = 1 the TD errors of a turn telescope: ``A_j = G_j - V_j`` with ``G_j``
    the reward-to-go inside the turn (:func:`turn_returns`). Not whitened (the verl estimator
    whitens over the batch, as verl's ``gae`` does).

    Args:
        token_rewards: (B, L) float.
        values: (B, L) critic values per token.
        response_mask: (B, L) 1 on assistant tokens.
    Returns:
        ``(advantages, returns)``, both (B, L), 0 off the assistant tokens.
    """
    if values.shape != token_rewards.shape:
        raise ValueError(f"values {tuple(values.shape)} and rewards {tuple(token_rewards.shape)} differ")
    returns = turn_returns(token_rewards, response_mask)
    mask = response_mask.to(returns.dtype)
    return (returns - values.to(returns.dtype)) * mask, returns
