"""Attention over packed sequences for verl's remove-padding path, without flash-attn.

With ``actor_rollout_ref.model.use_remove_padding`` (config.yaml ``training.remove_padding``)
verl 0.9.1's FSDP engine concatenates the real tokens of a micro-batch into one row
(``input_ids`` of shape ``(1, total tokens)``, no attention mask) and gives each sequence its own
positions, restarting at 0 (``FSDPEngineWithLMHead.prepare_model_inputs``). The model must then
attend causally *within* each sequence only. verl expects flash-attention's variable-length
kernel there (it patches ``transformers.integrations.flash_attention``); the ``gpu`` extra has
no flash-attn for Ampere (sglang pulls ``flash-attn-4``, a Hopper/Blackwell-only CuTe build), and
with ``sdpa`` transformers 5.8.1 detects the packing from the positions and builds a dense
(total x total) block mask, which costs more than the padding it removes.

This module registers an attention implementation of its own, :data:`NAME`, through
transformers' ``AttentionInterface`` (and ``AttentionMaskInterface``, with transformers'
flash-attention mask rule: no mask for packed rows, the 2D padding mask otherwise). It splits
the packed row at the position restarts (``cu_seqlens``) and runs

* on a CUDA device with bf16/fp16 inputs: PyTorch's own variable-length attention,
  ``torch.nn.attention.varlen.varlen_attn`` (the flash-attention 2 kernels built into torch's
  CUDA wheels, sm80 and newer: A100, H100, H200), causal, with grouped key/value heads;
* elsewhere (the CPU, fp32): scaled-dot-product attention per sequence with ``is_causal``, exact
  and without padding.

Nothing of verl or transformers is patched: the model is loaded with
``attn_implementation=NAME`` (``*.model.override_config.attn_implementation``, set at launch when
``training.remove_padding`` is true), which the plug-in makes known in every process that
imports verl (:func:`register`).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["NAME", "cu_seqlens_from_positions", "packed_attention_forward", "register", "varlen_kernel"]

log = logging.getLogger(__name__)

#: The attention implementation name models load with on the packed path.
NAME = "spader_varlen"


def cu_seqlens_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """Sequence boundaries of a packed row: a sequence starts wherever the position does not
    continue the previous one (verl's packed positions restart at 0 for every sequence).

    Args:
        position_ids: ``(total,)`` or ``(1, total)``.
    Returns:
        ``cu_seqlens`` (int32, ``(sequences + 1,)``, starting at 0 and ending at ``total``).
    """
    import torch

    pos = position_ids.reshape(-1)
    total = pos.numel()
    start = torch.ones(total, dtype=torch.bool, device=pos.device)
    if total > 1:
        start[1:] = pos[1:] != pos[:-1] + 1
    starts = torch.nonzero(start, as_tuple=False).reshape(-1)
    end = torch.tensor([total], device=pos.device, dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)


@cache
def varlen_kernel():
    """PyTorch's ``varlen_attn`` and the keyword arguments its signature takes (they changed
    between torch 2.10 and 2.12), or None when this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    return varlen_attn, frozenset(params)


def _varlen(query, key, value, cu: torch.Tensor, max_len: int, scaling: float | None):
    """``(total, heads, dim)`` tensors through ``varlen_attn``, causal."""
    kernel, params = varlen_kernel()
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # causal (torch >= 2.11)
    else:
        kwargs["is_causal"] = True  # torch 2.10
    if scaling is not None:
        if "scale" in params:
            kwargs["scale"] = float(scaling)
        else:
            query = query * (float(scaling) * math.sqrt(query.shape[-1]))
    if key.shape[1] != query.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            groups = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
    return kernel(query, key, value, cu, cu, max_len, max_len, **kwargs)


def _per_sequence(query, key, value, bounds: list[int], scaling: float | None):
    """``(total, heads, dim)`` tensors, causal attention within each sequence (sdpa each)."""
    import torch

    outs = []
    gqa = key.shape[1] != query.shape[1]
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        q = query[start:end].transpose(0, 1).unsqueeze(0)
        k = key[start:end].transpose(0, 1).unsqueeze(0)
        v = value[start:end].transpose(0, 1).unsqueeze(0)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa
        )
        outs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0) if outs else query.new_zeros(query.shape)


@cache
def _warn_fallback(reason: str) -> None:
    log.warning("packed attention without PyTorch's varlen kernel (%s): causal sdpa per sequence", reason)


def _attend(query, key, value, cu: torch.Tensor, scaling: float | None):
    """Causal attention within each sequence of packed ``(total, heads, dim)`` tensors."""
    import torch

    lengths = cu[1:] - cu[:-1]
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        if varlen_kernel() is not None:
            return _varlen(query, key, value, cu, int(lengths.max().item()), scaling)
        _warn_fallback(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    return _per_sequence(query, key, value, [int(b) for b in cu.tolist()], scaling)


def _check_call(module, query, key, dropout: float, sliding_window: int | None) -> None:
    """Raise ValueError for a call the kernel does not serve (dropout, a sliding window, a
    non-causal module, a KV cache)."""
    if dropout:
        raise ValueError(f"{NAME} attention has no dropout (got {dropout}); set attention_dropout to 0")
    if sliding_window is not None:
        raise ValueError(f"{NAME} attention has no sliding window (got {sliding_window})")
    if not getattr(module, "is_causal", True):
        raise ValueError(f"{NAME} attention is causal; {type(module).__name__} is not")
    tokens = query.shape[2]
    if key.shape[2] != tokens:
        raise ValueError(
            f"{NAME} attention serves training passes (no KV cache): {tokens} queries, {key.shape[2]} keys"
        )


def _attend_padded(q, k, v, attention_mask: torch.Tensor, batch: int, scaling: float | None):
    """The ``(batch * tokens, heads, dim)`` output of a padded batch: its real tokens (contiguous in
    each row) attended as packed sequences, zeros on the padding."""
    import torch

    if attention_mask.dim() != 2:
        raise ValueError(f"{NAME} attention takes a 2D padding mask, got shape {tuple(attention_mask.shape)}")
    keep = attention_mask.reshape(-1).bool()
    index = torch.nonzero(keep, as_tuple=False).reshape(-1)
    lengths = attention_mask.bool().sum(dim=1)
    cu = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    cu[1:] = torch.cumsum(lengths, 0)
    packed = _attend(q[index], k[index], v[index], cu, scaling)
    out = torch.zeros_like(q)
    out[index] = packed
    return out


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (``AttentionInterface``) for :data:`NAME`.

    Args:
        query, key, value: ``(batch, heads, tokens, dim)`` (key/value may have fewer heads).
        attention_mask: None (packed rows, or unpadded batches) or the 2D ``(batch, tokens)``
            padding mask (transformers' flash-attention mask rule).
        dropout: must be 0 (the models train without attention dropout).
        scaling: the softmax scale.
        sliding_window: must be None (Qwen3 and Llama-3.1 attend over the whole sequence).
        kwargs: ``position_ids`` (packed positions; a new sequence wherever they do not continue).
    Returns:
        ``(output of shape (batch, tokens, heads, dim), None)``.
    """
    import torch

    _check_call(module, query, key, dropout, sliding_window)
    batch, heads, tokens, dim = query.shape
    kv_heads = key.shape[1]
    q = query.transpose(1, 2).reshape(batch * tokens, heads, dim)
    k = key.transpose(1, 2).reshape(batch * tokens, kv_heads, dim)
    v = value.transpose(1, 2).reshape(batch * tokens, kv_heads, dim)
    if attention_mask is not None:
        out = _attend_padded(q, k, v, attention_mask, batch, scaling)
    else:
        positions = kwargs.get("position_ids")
        if positions is not None and batch == 1:
            cu = cu_seqlens_from_positions(positions.to(query.device))
        else:  # one sequence per row
            cu = torch.arange(0, (batch + 1) * tokens, tokens, dtype=torch.int32, device=query.device)
        out = _attend(q, k, v, cu, scaling)
    return out.reshape(batch, tokens, heads, dim), None


def register() -> str:
    """Make :data:`NAME` a transformers attention implementation (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, packed_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME
