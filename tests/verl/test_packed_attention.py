"""The packed actor path (training.remove_padding): verl's remove-padding inputs through the
plug-in's ``spader_varlen`` attention give the same log-probs and gradients as verl's padded path
with sdpa and a mask, on a tiny untied Qwen3 with random weights, through verl's own monkey patch
and the plug-in's fused log-prob forward under FSDP2 (gloo, one rank). PyTorch's CUDA varlen
kernel cannot run here; its call is checked against a CPU stand-in of its documented contract."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("verl")

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

import spader.integrations.verl.plugin  # noqa: F401  (registers spader_varlen, the fused forward)
from spader.integrations.verl import packed_attention

LENGTHS = (20, 14, 9, 1)


def _model(attention: str):
    cfg = Qwen3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attention)


def _verl(model, *, packed: bool):
    """As verl's FSDP engine builds the actor: its monkey patch (fused torch kernels, the plug-in's
    forward through the lm_head) and FSDP2 units for the layers, embedding and head."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.fsdp_utils import apply_fsdp2

    apply_monkey_patch(
        model=model, use_remove_padding=packed, use_fused_kernels=True, fused_kernels_backend="torch"
    )
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    apply_fsdp2(
        model, {"mesh": init_device_mesh("cpu", (1,)), "mp_policy": policy, "reshard_after_forward": True}, {}
    )
    return model


def _sequences():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 384, (n,), generator=g) for n in LENGTHS]


def _padded_batch(seqs):
    """verl's padded path: right-padded ids, the mask, positions counting the real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def _full(grad):
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def test_packed_log_probs_and_gradients_equal_the_padded_paths(process_group, patched_class):
    seqs = _sequences()
    padded = _verl(_model("sdpa"), packed=False)
    packed = _verl(copy.deepcopy(_model(packed_attention.NAME)), packed=True)
    assert packed.config._attn_implementation == packed_attention.NAME

    ids, mask, positions = _padded_batch(seqs)
    out = padded(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                 temperature=1.0, return_dict=True)  # fmt: skip
    # verl's remove-padding inputs (FSDPEngineWithLMHead.prepare_model_inputs): one row of the real
    # tokens, no mask, positions restarting per sequence, the labels rolled over the whole row
    flat = torch.cat(seqs).unsqueeze(0)
    flat_pos = torch.cat([torch.arange(len(s)) for s in seqs]).unsqueeze(0)
    rolled = torch.roll(flat, shifts=-1, dims=1)
    got = packed(input_ids=flat, attention_mask=None, position_ids=flat_pos, use_cache=False,
                 temperature=1.0, return_dict=True, shift_labels=rolled)  # fmt: skip

    # each sequence's tokens but its last (whose rolled label is the next sequence's first token)
    want_lp = torch.cat([out.log_probs[i, : len(s) - 1] for i, s in enumerate(seqs)])
    want_ent = torch.cat([out.entropy[i, : len(s) - 1] for i, s in enumerate(seqs)])
    keep = torch.cat([torch.arange(len(s)) < len(s) - 1 for s in seqs])
    assert torch.allclose(got.log_probs[0][keep], want_lp, atol=1e-5)
    assert torch.allclose(got.entropy[0][keep].float(), want_ent.float(), atol=1e-5)

    # the same loss on both paths reaches every weight with the same gradient
    want_lp.sum().backward()
    got.log_probs[0][keep].sum().backward()
    reference = dict(padded.named_parameters())
    for name, param in packed.named_parameters():
        assert torch.allclose(_full(param.grad), _full(reference[name].grad), atol=1e-5), name


def test_a_padded_batch_through_the_packed_attention_equals_sdpa():
    """The attention also takes a 2D padding mask (a batch that reaches it padded)."""
    seqs = _sequences()
    ids, mask, positions = _padded_batch(seqs)
    sdpa, varlen = _model("sdpa"), _model(packed_attention.NAME)
    want = sdpa(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    got = varlen(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    real = mask.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)


def test_sequence_boundaries_come_from_the_position_restarts():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]])
    assert packed_attention.cu_seqlens_from_positions(positions).tolist() == [0, 3, 5, 6, 10]
    assert packed_attention.cu_seqlens_from_positions(torch.arange(4)).tolist() == [0, 4]


def _fake_varlen_attn(signature: str):
    """A CPU stand-in for ``torch.nn.attention.varlen.varlen_attn`` (its flash kernel needs CUDA)
    with the documented contract of one torch generation: 2.10 takes ``is_causal``; 2.11 takes
    ``scale`` and ``window_size``; 2.12 adds ``enable_gqa``. Causal attention per sequence."""

    def attend(query, key, value, cu_q, cu_k, max_q, max_k, scale=None, causal=False, gqa=False):
        assert torch.equal(cu_q, cu_k) and max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max())
        if key.shape[1] != query.shape[1] and not gqa:
            raise ValueError("Hq != Hkv without enable_gqa")
        outs = []
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            q, k, v = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
            o = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa
            )
            outs.append(o.squeeze(0).transpose(0, 1))
        return torch.cat(outs)

    if signature == "2.10":

        def varlen_attn(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
        ):
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal=is_causal)

    elif signature == "2.11":

        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1)):  # fmt: skip
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                          causal=tuple(window_size) == (-1, 0))  # fmt: skip

    else:

        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):  # fmt: skip
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                          causal=tuple(window_size) == (-1, 0), gqa=enable_gqa)  # fmt: skip

    return varlen_attn


@pytest.mark.parametrize("signature", ["2.10", "2.11", "2.12"])
def test_the_varlen_kernel_call_fits_each_torch_signature(signature, monkeypatch):
    import inspect

    fake = _fake_varlen_attn(signature)
    monkeypatch.setattr(
        packed_attention, "varlen_kernel", lambda: (fake, frozenset(inspect.signature(fake).parameters))
    )
    g = torch.Generator().manual_seed(2)
    q = torch.randn(12, 4, 8, generator=g)
    k, v = torch.randn(12, 2, 8, generator=g), torch.randn(12, 2, 8, generator=g)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    got = packed_attention._varlen(q, k, v, cu, 7, 0.3)
    want = packed_attention._per_sequence(q, k, v, [0, 5, 12], 0.3)
    assert torch.allclose(got, want, atol=1e-6)
