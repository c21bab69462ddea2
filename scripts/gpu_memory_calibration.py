"""Measure the actor's training memory on one GPU and set it against the memory plan's terms.

torch + transformers only (no verl, sglang or network; random weights). For each backbone of
config/config.yaml it builds a model of the backbone's shape (spader/training/shapes/) with fewer
decoder layers, in bf16 with sdpa attention and activation checkpointing as verl's FSDP2 actor
computes, and runs one forward and backward pass of a padded micro-batch of the configured size
and length (training.ppo_micro_batch_size_per_gpu x (max_prompt_length + max_response_length))
through either log-prob path:

* ``full``: the (tokens x vocabulary) bf16 logits, the copy of the unpadded rows and a row-by-row
  log-softmax, as verl 0.9.1 computes log-probs without flash-attn;
* ``fused``: log-probs and entropy from the hidden states 512 tokens at a time, recomputed in the
  backward pass, as verl's fused torch kernel computes them (this script's own implementation).

It prints, per run, the GPU's peak allocated memory above the weights and their gradients, the
bytes the log-prob computation saves for the backward pass, and the plan's terms for the same
shape (spader.training.plan: kept layer inputs, one layer's backward working set, the mask, the
log-prob term). Two layer counts separate the per-layer term (the slope) from the rest; the
fused-minus-full difference isolates the logits. docs/gpu.md says how to fold the measured
coefficients back into ``spader.training.plan.CONSTANTS``.

    python scripts/gpu_memory_calibration.py                   # one GPU, the configured sizes
    python scripts/gpu_memory_calibration.py --device cpu --tiny   # any machine, tiny shapes (a test)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from spader.config import resolved_config  # noqa: E402
from spader.training import plan  # noqa: E402  (plain Python: shapes and the plan's terms)

GIB = float(1 << 30)
MIB = float(1 << 20)


def settings(root: Path = ROOT) -> dict:
    """The configured sizes and log-prob path (config/config.yaml, config/verl/base.yaml)."""
    config = resolved_config(
        root / "config" / "config.yaml"
    )  # the file holds choices; the defaults filled in
    base = yaml.safe_load((root / "config" / "verl" / "base.yaml").read_text())
    training = config["training"]
    model = base["actor_rollout_ref"]["model"]
    return {
        "backbones": {b: spec["model"] for b, spec in config["backbones"].items()},
        "micro_batch": int(training["ppo_micro_batch_size_per_gpu"]),
        "seq_len": int(training["max_prompt_length"]) + int(training["max_response_length"]),
        "fused": bool(model.get("use_fused_kernels", False)),
    }


def tiny_shape(shape: plan.Shape) -> plan.Shape:
    """The same architecture at CPU size (a test of the script)."""
    return dataclasses.replace(
        shape, vocab=512, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, layers=2
    )


def build(shape: plan.Shape, layers: int, model_type: str, device: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common = {
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": shape.tied,
    }
    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config}.get(model_type, LlamaConfig)
    extra = {"head_dim": shape.head_dim} if cls is not Qwen2Config else {}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        cls(**common, **extra), attn_implementation="sdpa", dtype=torch.bfloat16
    )
    model = model.to(device).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class _Chunked(torch.autograd.Function):
    """Log-prob and entropy of ``targets`` from hidden states, ``chunk`` tokens at a time; the
    logits of a chunk are recomputed in the backward pass (never all alive at once)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk):
        logp = torch.empty(hidden.shape[0], device=hidden.device, dtype=torch.float32)
        entropy = torch.empty_like(logp)
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            log_softmax = torch.log_softmax((hidden[part] @ weight.t()).float(), dim=-1)
            logp[part] = log_softmax.gather(-1, targets[part, None]).squeeze(-1)
            entropy[part] = -(log_softmax.exp() * log_softmax).sum(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk = chunk
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            log_softmax = torch.log_softmax((hidden[part] @ weight.t()).float(), dim=-1)
            probs = log_softmax.exp()
            one_hot = torch.zeros_like(probs).scatter_(-1, targets[part, None], 1.0)
            grad_logits = grad_logp[part, None] * (one_hot - probs)
            if grad_entropy is not None:
                entropy = -(probs * log_softmax).sum(-1, keepdim=True)
                grad_logits -= grad_entropy[part, None] * probs * (log_softmax + entropy)
            grad_hidden[part] = (grad_logits.to(hidden.dtype) @ weight).to(hidden.dtype)
            grad_weight += grad_logits.t() @ hidden[part].float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None


def log_probs(model, hidden, targets, valid, *, fused: bool, chunk: int = 512):
    """Per-token log-probs and entropy of the valid (unpadded) positions."""
    if fused:
        logp, entropy = _Chunked.apply(hidden.flatten(0, 1), model.lm_head.weight, targets.flatten(), chunk)
        keep = valid.flatten()
        return logp[keep], entropy[keep]
    logits = model.lm_head(hidden)  # (micro-batch, length, vocabulary), bf16
    rows = torch.cat([logits[i, : int(valid[i].sum())] for i in range(logits.shape[0])])  # the unpadded copy
    labels = torch.cat([targets[i, : int(valid[i].sum())] for i in range(targets.shape[0])])
    # row by row, as verl's logprobs_from_logits_v2 does for bf16 logits
    logp = torch.stack([torch.log_softmax(r, -1)[t] for r, t in zip(rows, labels, strict=True)]).float()
    return logp, None


class SavedBytes:
    """Bytes of distinct tensor storages saved for the backward pass inside the context."""

    def __init__(self):
        self.storages: dict[int, int] = {}

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def mib(self) -> float:
        return sum(self.storages.values()) / MIB


def measure(model, micro: int, seq: int, *, fused: bool, device: str) -> dict:
    """One forward and backward pass of a padded micro-batch; memory and time."""
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (micro, seq), generator=generator).to(device)
    valid = torch.ones_like(ids, dtype=torch.bool)
    for i in range(1, micro):  # right padding, as verl's padded micro-batches
        valid[i, seq - (i * seq) // (2 * micro) :] = False
    targets = torch.roll(ids, shifts=-1, dims=-1)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    start = time.perf_counter()
    hidden = model.model(input_ids=ids, attention_mask=valid.long(), use_cache=False)[0]
    with SavedBytes() as saved:
        logp, entropy = log_probs(model, hidden, targets, valid, fused=fused)
    loss = -logp.mean() - (0.001 * entropy.mean() if entropy is not None else 0.0)
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - base - weights) / MIB if cuda else None  # less the gradients
    model.zero_grad(set_to_none=True)
    return {"peak_mib": peak, "saved_logprob_mib": saved.mib, "seconds": seconds, "logp": logp.detach()}


def plan_terms(shape: plan.Shape, micro: int, seq: int, *, fused: bool) -> dict:
    tokens = micro * seq
    memory = plan.VerlMemory(micro_batch=micro, log_prob_micro_batch=micro, ref_micro_batch=micro,
                             critic_micro_batch=micro, seq_len=seq, fused=fused)  # fmt: skip
    acts = plan._activations(shape, tokens, micro, seq, checkpointing=True, padded=True)
    terms = {**acts, "logits": plan._logits(shape, tokens, memory, grad=True, entropy=False)}
    return {k: v * GIB / MIB for k, v in terms.items()}  # MiB


def run(args) -> list[dict]:
    config = settings()
    micro = args.micro_batch or config["micro_batch"]
    seq = args.seq_len or config["seq_len"]
    rows = []
    for backbone in args.backbones or list(config["backbones"]):
        model_id = config["backbones"][backbone]
        shape = plan.load_shape(model_id)
        model_type = "qwen3" if shape.qk_norm else ("qwen2" if shape.qkv_bias else "llama")
        if args.tiny:
            shape = tiny_shape(shape)
        layer_counts = (1, 2) if args.tiny else tuple(args.layers)
        for layers in layer_counts:
            model = build(shape, layers, model_type, args.device)
            small = dataclasses.replace(shape, layers=layers)
            for fused in (False, True):
                got = measure(model, micro, seq, fused=fused, device=args.device)
                terms = plan_terms(small, micro, seq, fused=fused)
                rows.append({"backbone": backbone, "layers": layers, "fused": fused, "micro": micro, "seq": seq,
                             **got, "plan": terms, "plan_mib": sum(terms.values())})  # fmt: skip
            del model
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


def report(rows: list[dict]) -> list[str]:
    """The runs as text (MiB): measured against planned, then the per-layer and logits terms."""
    lines = [
        "backbone     layers path    tokens  measured peak MiB  plan MiB = kept + layer + mask + logits"
        "  saved by log-probs MiB  seconds"
    ]
    for r in rows:
        peak = "n/a (cpu)" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        parts = " + ".join(f"{v:.1f}" for v in r["plan"].values())
        lines.append(
            f"{r['backbone']:<12} {r['layers']:>6} {'fused' if r['fused'] else 'full':<6} {r['micro'] * r['seq']:>7}"
            f"  {peak:>17}  {r['plan_mib']:.1f} = {parts}  {r['saved_logprob_mib']:.3f}  {r['seconds']:.1f}"
        )
    by = {(r["backbone"], r["fused"], r["layers"]): r for r in rows}
    for (backbone, fused, layers), r in sorted(by.items()):
        path = "fused" if fused else "full"
        more = next((v for k, v in sorted(by.items()) if k[:2] == (backbone, fused) and k[2] > layers), None)
        if more and r["peak_mib"] is not None:
            extra = more["layers"] - layers
            slope = (more["peak_mib"] - r["peak_mib"]) / extra
            planned = (more["plan"]["checkpoints"] - r["plan"]["checkpoints"]) / extra
            lines.append(f"{backbone} {path}: per layer measured {slope:.1f} MiB, plan {planned:.1f} MiB")
        full = by.get((backbone, False, layers))
        if fused and full is not None:
            same = torch.allclose(full["logp"].float().cpu(), r["logp"].float().cpu(), atol=0.1)
            measured = "n/a (cpu)" if r["peak_mib"] is None else f"{full['peak_mib'] - r['peak_mib']:.1f} MiB"
            lines.append(
                f"{backbone} {layers} layer(s): log-probs of the two paths agree: {same}; full minus fused: "
                f"measured {measured}, plan {full['plan']['logits'] - r['plan']['logits']:.1f} MiB, saved for "
                f"the backward pass {full['saved_logprob_mib'] - r['saved_logprob_mib']:.3f} MiB"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes with one and two layers (CPU test)")
    parser.add_argument("--backbones", nargs="*", help="backbones of config/config.yaml (default: all)")
    parser.add_argument("--layers", nargs=2, type=int, default=[2, 4], help="two layer counts (default: 2 4)")
    parser.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the config's)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: prompt + response)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or with --device cpu --tiny", file=sys.stderr)
        return 2
    if args.tiny and not args.seq_len:
        args.seq_len, args.micro_batch = 96, args.micro_batch or 2
    import transformers

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {where}")
    for line in report(run(args)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
