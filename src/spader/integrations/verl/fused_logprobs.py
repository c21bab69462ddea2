"""verl's fused log-prob kernel under FSDP2 with an untied output projection.

With ``actor_rollout_ref.model.use_fused_kernels`` verl 0.9.1 replaces the causal LM's forward by
``verl.models.transformers.dense_common.forward_with_torch_backend``, which computes each token's
log-probability and entropy from the last hidden states 512 tokens at a time, so the
(tokens x vocabulary) logits never exist. That function multiplies by ``self.lm_head.weight``
directly, outside the ``lm_head`` module's own forward. verl's FSDP2 wrapping makes ``lm_head`` a
unit of its own for every untied model (``verl.utils.fsdp_utils._select_fsdp2_wrap_targets``), and
the weight of such a unit is a sharded DTensor outside its forward: the product fails with "got
mixed torch.Tensor and DTensor" for Qwen3-8B and Llama-3.1-8B (tests/verl/test_fused_logprobs.py
shows it on a tiny untied model).

:func:`install` (called by the plug-in in every process that imports verl) replaces that function,
under the name verl's monkey patch imports when it builds a model, by
:func:`forward_with_torch_backend`: the same computation with verl's own kernel
(``FusedLinearForPPO``), run as a call of the ``lm_head`` module, so FSDP2 gathers the weight for
the call, frees it after, gathers it again for the backward pass and reduce-scatters its gradient,
as for any layer. Without FSDP, or for a tied model, the result is the same as verl's.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["forward_with_torch_backend", "install"]

_MARK = "_spader_fused_through_lm_head"

#: verl's own function, kept by :func:`install` (tests show what it does under FSDP2).
VERL_FORWARD = None


def _head_forward(head, hidden_states, labels, temperature, *, kernel):
    """``lm_head``'s forward for one fused call: (log-probs, entropy) of ``labels``."""
    return kernel(
        hidden_states=hidden_states, vocab_weights=head.weight, input_ids=labels, temperature=temperature
    )


def fused_head(head, kernel, hidden_states, labels, temperature: float = 1.0):
    """Run ``kernel`` as a call of the module ``head`` (its hooks, FSDP2's included, fire).

    Returns:
        ``(log_probs, entropy)``, each shaped like ``labels``.
    """
    had_own = "forward" in head.__dict__
    previous = head.__dict__.get("forward")
    head.forward = functools.partial(_head_forward, head, kernel=kernel)
    try:
        return head(hidden_states, labels, temperature)
    finally:
        if had_own:
            head.forward = previous
        else:
            del head.forward


def forward_with_torch_backend(
    self,
    input_ids=None,
    attention_mask=None,
    position_ids=None,
    past_key_values=None,
    inputs_embeds=None,
    labels=None,
    use_cache=None,
    output_attentions=None,
    output_hidden_states=None,
    return_dict=None,
    cache_position=None,
    logits_to_keep: Any = 0,
    temperature: float = 1.0,
    shift_labels=None,
    **kwargs,
):
    """The causal LM's forward for verl's fused log-prob path (same signature and output as verl's
    ``forward_with_torch_backend``): the base model's hidden states, then the fused kernel through
    the ``lm_head`` module. ``labels`` / ``shift_labels`` as in verl: the next token of each
    position, rolled from ``input_ids`` unless given."""
    import torch
    from verl.models.transformers.dense_common import CausalLMOutputForPPO, forward_base_model
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    if not return_dict:
        raise NotImplementedError("the fused log-prob forward returns a dict (return_dict=True)")
    outputs = forward_base_model(
        self,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        output_attentions=output_attentions,
        output_hidden_states=output_hidden_states,
        cache_position=cache_position,
    )
    if shift_labels is not None:
        targets = shift_labels
    elif labels is not None:
        targets = torch.roll(labels, shifts=-1, dims=-1)
    elif input_ids is not None:
        targets = torch.roll(input_ids, shifts=-1, dims=-1)
    else:
        raise ValueError("the fused log-prob forward needs input_ids, labels or shift_labels")
    kernel = FusedLinearForPPO(impl_backend=getattr(self, "_verl_fused_kernels_backend", "torch"))
    log_probs, entropy = fused_head(self.lm_head, kernel, outputs[0], targets, temperature)
    return CausalLMOutputForPPO(
        log_probs=log_probs,
        entropy=entropy,
        past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )


def install() -> bool:
    """Make verl's monkey patch install :func:`forward_with_torch_backend` for the torch backend
    (idempotent). Returns True when it was installed by this call."""
    import verl.models.transformers.dense_common as dense

    global VERL_FORWARD
    if getattr(dense.forward_with_torch_backend, _MARK, False):
        return False
    VERL_FORWARD = dense.forward_with_torch_backend
    setattr(forward_with_torch_backend, _MARK, True)
    dense.forward_with_torch_backend = forward_with_torch_backend
    log.debug("verl's fused log-prob forward runs through the lm_head module")
    return True
