"""Torch-level checks of the training path's model loading on one GPU, without verl or sglang.

Run on a GPU machine with torch and transformers installed (`python scripts/gpu_torch_checks.py`):

1. Attention: without the flash-attn package, transformers refuses ``flash_attention_2`` at load
   (the reason the verl configs ask for ``sdpa``); ``sdpa`` loads and matches ``eager`` on a padded
   bf16 batch, for the Qwen3 and Llama architectures.
2. FSDP2: ``fully_shard`` per decoder layer with bf16 mixed precision and ``sdpa`` trains one
   optimizer step of a small Qwen3 (finite loss, weights change; time and peak memory printed),
   and a distributed checkpoint of its state dict is saved and read back.

Exits non-zero when a check fails. Random weights; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config


def _small_configs() -> dict:
    common = {
        "vocab_size": 1024,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
    }
    return {"qwen3": Qwen3Config(head_dim=64, **common), "llama": LlamaConfig(**common)}


def check_attention(device: str, tolerance: float) -> bool:
    """flash_attention_2 refused without flash-attn; sdpa close to eager on padded rows.

    Args:
        device: the CUDA device.
        tolerance: largest accepted |logit difference| between sdpa and eager (bf16).

    Returns:
        True when every check passed.
    """
    ok = True
    has_fa2 = importlib.util.find_spec("flash_attn") is not None
    print(f"flash_attn installed: {has_fa2}")
    for name, cfg in _small_configs().items():
        try:
            AutoModelForCausalLM.from_config(
                cfg, attn_implementation="flash_attention_2", dtype=torch.bfloat16
            )
            print(f"{name}: flash_attention_2 loaded")
            ok &= has_fa2
        except ImportError as exc:
            print(f"{name}: flash_attention_2 refused: {str(exc).splitlines()[0][:160]}")
        ids = torch.randint(0, cfg.vocab_size, (3, 96), device=device)
        mask = torch.ones_like(ids)
        mask[1, 60:] = 0  # right padding
        mask[2, :30] = 0  # left padding
        logits = {}
        for impl in ("eager", "sdpa"):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.bfloat16)
            model = model.to(device).eval()
            with torch.no_grad():
                logits[impl] = model(input_ids=ids, attention_mask=mask).logits.float() * mask[..., None]
        diff = (logits["eager"] - logits["sdpa"]).abs().max().item()
        print(f"{name}: sdpa vs eager, max |logit difference| on a padded bf16 batch: {diff:.4f}")
        ok &= diff <= tolerance
    return ok


def check_fsdp2(device: str, seq_len: int, batch: int) -> bool:
    """One FSDP2 + sdpa + bf16 mixed-precision step of a small Qwen3, then a DCP round trip.

    Args:
        device: the CUDA device.
        seq_len: tokens per sequence.
        batch: sequences per step (the first one half padded).

    Returns:
        True when the loss is finite, the weights changed and the checkpoint was read back.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        cfg = Qwen3Config(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=128,
            max_position_embeddings=8192,
        )
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).to(
            device
        )
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        before = model.lm_head.weight.full_tensor().detach().clone()
        ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), device=device)
        mask = torch.ones_like(ids)
        mask[0, seq_len // 2 :] = 0
        start = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        changed = not torch.equal(before, model.lm_head.weight.full_tensor().detach())
        finite = bool(torch.isfinite(loss).item())
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(
            f"fsdp2 + sdpa + bf16 step, {batch} x {seq_len} tokens: loss {loss.item():.4f} finite={finite} "
            f"weights changed={changed} {seconds:.2f} s, peak {peak:.2f} GiB"
        )
        with tempfile.TemporaryDirectory() as tmp:
            dcp.save({"model": model.state_dict()}, checkpoint_id=tmp)
            state = {"model": model.state_dict()}
            dcp.load(state, checkpoint_id=tmp)
            print(
                f"distributed checkpoint of the FSDP2 state dict: saved and read back ({len(os.listdir(tmp))} files)"
            )
        return finite and changed
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.05, help="sdpa vs eager, bf16 logits")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: these checks need a GPU", file=sys.stderr)
        return 2
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}"
    )
    ok = check_attention("cuda", args.tolerance)
    ok &= check_fsdp2("cuda", args.seq_len, args.batch)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
