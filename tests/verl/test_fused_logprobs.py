"""verl's fused log-prob path (``use_fused_kernels``, torch backend) on the padded batches the
configs use, under FSDP2 as verl wraps a model (the output projection a unit of its own): verl
0.9.1's forward fails there, the plug-in's computes the same log-probs, entropy and gradients as
the full logits. Real FSDP2 on the CPU (gloo, one rank), a tiny untied Qwen3 with random weights."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("verl")

import torch
from transformers import AutoModelForCausalLM, Qwen3Config


def _model():
    cfg = Qwen3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def _fsdp(model):
    """Sharded as verl's FSDP2 engine shards it (decoder layers, embedding and lm_head as units)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils.fsdp_utils import apply_fsdp2

    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    apply_fsdp2(
        model, {"mesh": init_device_mesh("cpu", (1,)), "mp_policy": policy, "reshard_after_forward": True}, {}
    )
    return model


def _batch():
    ids = torch.randint(0, 384, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0  # right padding, as verl's padded path builds its micro-batches
    mask[2, 9:] = 0
    return ids, mask


def _patch(model):
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    apply_monkey_patch(
        model=model, use_remove_padding=False, use_fused_kernels=True, fused_kernels_backend="torch"
    )


def test_verls_own_fused_forward_fails_under_fsdp2(process_group, patched_class):
    import verl.models.transformers.dense_common as dense

    from spader.integrations.verl import fused_logprobs

    verl_forward = fused_logprobs.VERL_FORWARD or dense.forward_with_torch_backend
    assert verl_forward is not fused_logprobs.forward_with_torch_backend
    model = _model()
    _patch(model)
    type(model).forward = verl_forward  # what verl 0.9.1 installs without the plug-in
    _fsdp(model)
    ids, mask = _batch()
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        model(input_ids=ids, attention_mask=mask, use_cache=False, temperature=1.0, return_dict=True)


def test_plugin_fused_forward_equals_the_full_logits_and_trains_the_head(process_group, patched_class):
    import verl.models.transformers.dense_common as dense

    import spader.integrations.verl.plugin  # noqa: F401  (installs the adapter)
    from spader.integrations.verl import fused_logprobs

    assert dense.forward_with_torch_backend is fused_logprobs.forward_with_torch_backend
    assert fused_logprobs.install() is False  # installed once
    reference = _model()
    fused = copy.deepcopy(reference)
    _patch(fused)  # verl's own patch path, which now picks the plug-in's forward
    assert type(fused).forward is fused_logprobs.forward_with_torch_backend
    _fsdp(fused)

    ids, mask = _batch()
    out = fused(input_ids=ids, attention_mask=mask, use_cache=False, temperature=1.0, return_dict=True)
    assert out.log_probs.shape == ids.shape and out.entropy.shape == ids.shape
    # the same weights without FSDP, through the full (tokens x vocabulary) logits
    hidden = reference.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]
    logp = torch.log_softmax(reference.lm_head(hidden).float(), dim=-1)
    targets = torch.roll(ids, shifts=-1, dims=-1)
    expected = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    valid = mask.bool()
    valid[:, -1] = False  # the rolled target of the last position wraps around
    assert torch.allclose(out.log_probs[valid], expected[valid], atol=1e-4)
    assert torch.allclose(out.entropy[valid].float(), entropy[valid], atol=1e-4)

    # the head's gradient reaches its sharded weight through FSDP2's reduce-scatter
    (out.log_probs * valid).sum().backward()
    (expected * valid).sum().backward()

    def full(grad):
        return grad.full_tensor() if hasattr(grad, "full_tensor") else grad

    assert fused.lm_head.weight.grad is not None
    assert torch.allclose(full(fused.lm_head.weight.grad), reference.lm_head.weight.grad, atol=1e-4)
    up = fused.model.layers[0].mlp.up_proj.weight.grad
    assert torch.allclose(full(up), reference.model.layers[0].mlp.up_proj.weight.grad, atol=1e-4)
