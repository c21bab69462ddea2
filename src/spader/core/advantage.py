"""Step-wise peer advantage (SPA) and its token mapping (docs/method.md, "SPA advantage").

All functions are vectorised torch over a batch of trajectories (no per-token Python loop, no
``.item()`` in a loop); the only framework-facing code is the verl adapter in
``spader.integrations.verl.estimators``.

Shapes: ``B`` trajectories, ``L`` response tokens, ``S`` decision steps (the most any trajectory
of the batch has). In token space a response is right-padded and ``response_mask`` is 1 on
assistant tokens and 0 on tool-observation and padding tokens; step t is the t-th maximal run of
assistant tokens (:func:`segment_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "EPS_PLACEMENTS",
    "Steps",
    "discounted_returns",
    "group_index",
    "place_step_rewards",
    "segment_steps",
    "standardize_in_groups",
    "step_peer_advantage",
    "step_rewards_from_tokens",
    "steps_to_tokens",
    "trajectory_peer_advantage",
]


#: Where the spread's epsilon goes: ``outside`` is the paper's ``(x - mu) / (sigma + eps)``,
#: ``inside_sqrt`` the authors' code's ``(x - mu) / sqrt(var + eps)`` (sigma floored at sqrt(eps)).
EPS_PLACEMENTS = ("outside", "inside_sqrt")


@dataclass(frozen=True)
class Steps:
    """Decision steps of a batch of responses, as a table of assistant runs.

    The token-level work is a few passes over the (B, L) mask; everything else works on the E
    runs of the batch (E <= B * S, a few thousand where B * L is millions).

    Attributes:
        rows: (E,) int64 response of each run, in row-major order.
        starts: (E,) int64 first token of each run.
        ends: (E,) int64 last token of each run (inclusive), where the step's reward sits.
        number: (E,) int64 step number of each run within its response (0-based).
        count: (B,) int64 number of steps of each response.
        length: L, the padded response length.
        assistant: (B, L) bool, True on the tokens of the runs.
    """

    rows: Tensor
    starts: Tensor
    ends: Tensor
    number: Tensor
    count: Tensor
    length: int
    assistant: Tensor

    @property
    def max_steps(self) -> int:
        """Most steps of any response of the batch (``S``; at least 1 so shapes stay valid)."""
        return max(int(self.count.max()) if self.count.numel() else 0, 1)

    @property
    def mask(self) -> Tensor:
        """(B, S) float mask, 1 where the step exists."""
        s = torch.arange(self.max_steps, device=self.count.device)
        return (s.unsqueeze(0) < self.count.unsqueeze(1)).to(torch.float32)

    @property
    def first_run(self) -> Tensor:
        """(B,) int64 position in the run table of each response's first run."""
        return torch.cumsum(self.count, 0) - self.count

    @property
    def index(self) -> Tensor:
        """(B, L) int64 step of each assistant token, -1 on observation and padding tokens."""
        return _fill_runs(self.number, self, fill=-1)

    @property
    def run_ids(self) -> Tensor:
        """(B, L) int64 position in the run table of each assistant token's run, -1 elsewhere."""
        return _fill_runs(torch.arange(self.rows.numel(), device=self.rows.device), self, fill=-1)


def _fill_runs(values: Tensor, steps: Steps, fill) -> Tensor:
    """(B, L) tensor holding ``values[k]`` on the tokens of run k and ``fill`` elsewhere.

    The flattened (B * L) tensor is a sequence of alternating gaps and runs, so one
    ``repeat_interleave`` writes it (no per-token index tensor, no scan over the mask).
    """
    b, length = steps.count.numel(), steps.length
    total = b * length
    if steps.rows.numel() == 0:
        return torch.full((b, length), fill, dtype=values.dtype, device=values.device)
    flat_s = steps.rows * length + steps.starts
    flat_e = steps.rows * length + steps.ends
    gaps = torch.empty(flat_s.numel() + 1, dtype=torch.int64, device=flat_s.device)
    gaps[0] = flat_s[0]
    gaps[1:-1] = flat_s[1:] - flat_e[:-1] - 1
    gaps[-1] = total - 1 - flat_e[-1]
    lengths = torch.stack([gaps[:-1], flat_e - flat_s + 1], dim=1).reshape(-1)
    lengths = torch.cat([lengths, gaps[-1:]])
    filler = torch.full_like(values, fill)
    seq = torch.cat([torch.stack([filler, values], dim=1).reshape(-1), filler[:1]])
    return torch.repeat_interleave(seq, lengths, output_size=total).reshape(b, length)


def segment_steps(response_mask: Tensor, valid_mask: Tensor | None = None) -> Steps:
    """Split responses into decision steps: maximal runs of assistant tokens in the valid region.

    Args:
        response_mask: (B, L) 1 on assistant tokens, 0 on observation and padding tokens.
        valid_mask: optional (B, L) 1 on non-padding tokens; assistant tokens outside it are ignored.
    Returns:
        :class:`Steps`.

    >>> s = segment_steps(torch.tensor([[1, 1, 0, 0, 1, 0]]))
    >>> s.index.tolist(), s.ends.tolist(), s.count.tolist()
    ([[0, 0, -1, -1, 1, -1]], [1, 4], [2])
    """
    mask = response_mask if valid_mask is None else response_mask.bool() & valid_mask.bool()
    b, length = mask.shape
    # one zero column after every row, so that in the flattened layout no run continues into the
    # next row; the diff is then +1 on each run's first token and -1 just after its last one
    padded = torch.empty(b, length + 1, dtype=torch.int8, device=mask.device)
    padded[:, length] = 0
    padded[:, :length] = mask
    flat = padded.view(-1)
    # a value change between flat positions p and p + 1 is an edge at p + 1
    edges = (flat[1:] != flat[:-1]).nonzero().squeeze(1) + 1
    if flat.numel() and flat[0]:
        edges = torch.cat([edges.new_zeros(1), edges])
    start_flat, end_flat = edges[0::2], edges[1::2] - 1
    rows = torch.div(start_flat, length + 1, rounding_mode="floor")
    count = torch.bincount(rows, minlength=b)
    first = torch.cumsum(count, 0) - count
    number = torch.arange(rows.numel(), device=rows.device) - first[rows]
    return Steps(
        rows=rows,
        starts=start_flat - rows * (length + 1),
        ends=end_flat - rows * (length + 1),
        number=number,
        count=count,
        length=length,
        assistant=padded.view(torch.bool)[:, :length],  # 0/1 int8 reinterpreted, no copy
    )


def step_rewards_from_tokens(token_rewards: Tensor, steps: Steps) -> Tensor:
    """Sum token-level rewards into step rewards.

    Every token's reward counts for the assistant run it belongs to; a token outside the runs
    counts for the run before it (the first run for tokens before it). So a reward that sits on an
    observation or padding token (verl puts the scalar score on the last response token, which is
    masked when the response was cut inside an observation) is credited to the step before it
    instead of being lost. Responses without any step contribute nothing.

    Args:
        token_rewards: (B, L) float.
        steps: the responses' :class:`Steps`.
    Returns:
        (B, S) step rewards, 0 where the step does not exist.
    """
    b, length = token_rewards.shape
    out = torch.zeros(b, steps.max_steps, dtype=token_rewards.dtype, device=token_rewards.device)
    at_ends = token_rewards[steps.rows, steps.ends]
    if torch.count_nonzero(token_rewards) == torch.count_nonzero(at_ends):
        # every nonzero reward sits on a step end (where the spader_sync trainer puts them):
        # one counting pass instead of listing the nonzero tokens
        return out.index_put_((steps.rows, steps.number), at_ends)
    nz = token_rewards.nonzero()
    if nz.numel() == 0 or steps.rows.numel() == 0:
        return out
    r, c = nz[:, 0], nz[:, 1]
    has_steps = steps.count[r] > 0
    r, c = r[has_steps], c[has_steps]
    run_flat = steps.rows * length + steps.starts
    owner = torch.searchsorted(run_flat, r * length + c, right=True) - 1
    owner = torch.maximum(owner, steps.first_run[r])
    return out.index_put_((r, steps.number[owner]), token_rewards[r, c], accumulate=True)


def place_step_rewards(step_rewards: Tensor, steps: Steps, length: int) -> Tensor:
    """Dense token rewards: the reward of step t on the last token of assistant run t, 0 elsewhere.

    Args:
        step_rewards: (B, S') float; entries for steps a response does not have are ignored.
        steps: :class:`Steps` of the responses.
        length: L, the padded response length.
    Returns:
        (B, L) float.
    """
    dense = torch.zeros(step_rewards.size(0), length, dtype=step_rewards.dtype, device=step_rewards.device)
    ok = steps.number < step_rewards.size(1)
    rows, number = steps.rows[ok], steps.number[ok]
    dense[rows, steps.ends[ok]] = step_rewards[rows, number]
    return dense


def steps_to_tokens(step_values: Tensor, steps: Steps) -> Tensor:
    """Broadcast per-step values to the tokens of each assistant run; 0 on other tokens.

    Args:
        step_values: (B, S) float.
        steps: :class:`Steps` of the responses.
    Returns:
        (B, L) float: the run's value on its tokens, 0 elsewhere. Exact with torch's CPU scan
        (left to right, where verl computes advantages); a parallel scan on a GPU may leave
        rounding-level residues on observation tokens, which the loss masks out anyway.
    """
    values = step_values[steps.rows, steps.number]
    # +value on each run's first token and -value just after its last one: the running sum along
    # the row is then exactly the value inside the run ((0 + v) - v == 0 in floating point, so
    # nothing drifts from run to run) and exactly 0 elsewhere. One cumulative sum, in place.
    delta = torch.zeros(steps.count.numel(), steps.length, dtype=values.dtype, device=values.device)
    delta[steps.rows, steps.starts] = values
    inside = steps.ends + 1 < steps.length
    delta[steps.rows[inside], steps.ends[inside] + 1] = -values[inside]
    return delta.cumsum_(dim=1)


def discounted_returns(step_rewards: Tensor, step_mask: Tensor, gamma: float) -> Tensor:
    """Future returns ``G_t = sum_k gamma^k r_{t+k}`` over each trajectory's own steps.

    Args:
        step_rewards: (B, S) float.
        step_mask: (B, S) 1 where the step exists (a prefix of each row).
        gamma: discount per decision step.
    Returns:
        (B, S) returns, 0 where ``step_mask`` is 0.
    """
    s = step_rewards.size(1)
    work = torch.float64
    r = step_rewards.to(work) * step_mask.to(work)
    pos = torch.arange(s, device=step_rewards.device, dtype=work)
    # discount[t, k] = gamma^(k - t) for k >= t: one matmul instead of a loop over steps.
    lag = pos.unsqueeze(0) - pos.unsqueeze(1)
    discount = torch.where(
        lag >= 0, torch.full_like(lag, float(gamma)).pow(lag.clamp(min=0)), torch.zeros_like(lag)
    )
    returns = r @ discount.T
    return (returns * step_mask.to(work)).to(step_rewards.dtype)


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group numbers ``0..K-1`` of arbitrary int64 ids; returns ``(inverse (B,), K)``."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def standardize_in_groups(
    values: Tensor, group_ids: Tensor, *, eps: float = 1e-6, eps_placement: str = "outside"
) -> Tensor:
    """``(x - mean) / (std + eps)`` per group and column, with the population std (divide by G).

    A column in which all members of a group are equal (a group of one included) yields 0, tested
    exactly with the group's min and max so rounding in the mean cannot leak through ``eps``.

    Args:
        values: (B,) or (B, S) float.
        group_ids: (B,) int64 group of each row.
        eps: added to the std (``outside``) or to the variance under the root (``inside_sqrt``).
        eps_placement: one of :data:`EPS_PLACEMENTS`.
    Returns:
        Same shape as ``values``; every group's column mean is 0.
    """
    if eps_placement not in EPS_PLACEMENTS:
        raise ValueError(f"eps_placement must be one of {EPS_PLACEMENTS}, got {eps_placement!r}")
    squeeze = values.dim() == 1
    x = (values.unsqueeze(1) if squeeze else values).to(torch.float64)
    inverse, k = group_index(group_ids.to(values.device))
    idx = inverse.unsqueeze(1).expand_as(x)
    counts = torch.bincount(inverse, minlength=k).to(torch.float64).unsqueeze(1)
    mean = torch.zeros(k, x.size(1), dtype=x.dtype, device=x.device).index_add_(0, inverse, x) / counts
    centred = x - mean[inverse]
    var = torch.zeros_like(mean).index_add_(0, inverse, centred * centred) / counts
    spread = (var + eps).sqrt() if eps_placement == "inside_sqrt" else var.sqrt() + eps
    gmax = torch.full_like(mean, -torch.inf).scatter_reduce_(0, idx, x, reduce="amax")
    gmin = torch.full_like(mean, torch.inf).scatter_reduce_(0, idx, x, reduce="amin")
    constant = (gmax == gmin)[inverse]
    z = torch.where(constant, torch.zeros_like(x), centred / spread[inverse])
    z = z.to(values.dtype)
    return z.squeeze(1) if squeeze else z


def step_peer_advantage(
    step_rewards: Tensor,
    step_mask: Tensor,
    group_ids: Tensor,
    *,
    gamma: float,
    eps: float = 1e-6,
    eps_placement: str = "outside",
) -> Tensor:
    """Step-wise peer advantage of SPADER.

    For trajectory i of a group of G and step t: ``G_t(i) = sum_k gamma^k r_{t+k}(i)`` over its own
    steps, ``mu_t`` and the population ``sigma_t`` over all G members with ``G_t * M_t`` (members
    that already terminated count as 0), and ``A_t(i) = (G_t(i) - mu_t) / (sigma_t + eps) * M_t(i)``.
    A group of one, or a step where all G values are equal, yields 0.

    Args:
        step_rewards: (B, S) float reward of each decision step (search steps then the answer step).
        step_mask: (B, S) 1 where the step exists (``t <= L_i``), a prefix of each row.
        group_ids: (B,) int64 prompt group of each trajectory.
        gamma: discount per decision step.
        eps: added to the std (see ``eps_placement``).
        eps_placement: ``outside`` (paper, the default) or ``inside_sqrt`` (authors' code:
            ``sqrt(var + eps)``), see :data:`EPS_PLACEMENTS`.
    Returns:
        (B, S) advantages, 0 where ``step_mask`` is 0.

    >>> a = step_peer_advantage(torch.tensor([[0.5, 0.2, 0.6], [0.1, 0.4, 0.0], [0.0, 0.0, 0.0]]),
    ...     torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]]), torch.tensor([7, 7, 7]), gamma=0.9)
    >>> [round(v, 4) for v in a[0].tolist()]
    [1.3013, 1.1903, 1.4142]
    """
    mask = step_mask.to(step_rewards.dtype)
    returns = discounted_returns(step_rewards, mask, gamma)
    return standardize_in_groups(returns, group_ids, eps=eps, eps_placement=eps_placement) * mask


def trajectory_peer_advantage(
    step_rewards: Tensor,
    step_mask: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    eps_placement: str = "outside",
) -> Tensor:
    """Trajectory-level GRPO advantage on the summed return (the ``no_spa`` ablation).

    ``R(i) = sum_t r_t(i)``, standardized over the group with the same conventions as
    :func:`step_peer_advantage` (population std, ``eps``, 0 for a group of one or equal returns),
    and given to every step of the trajectory.

    Args:
        step_rewards: (B, S) float.
        step_mask: (B, S) 1 where the step exists.
        group_ids: (B,) int64.
        eps, eps_placement: as in :func:`step_peer_advantage`.
    Returns:
        (B, S) advantages, constant over each row's existing steps, 0 elsewhere.
    """
    mask = step_mask.to(step_rewards.dtype)
    total = (step_rewards * mask).sum(dim=1)
    return standardize_in_groups(total, group_ids, eps=eps, eps_placement=eps_placement).unsqueeze(1) * mask
