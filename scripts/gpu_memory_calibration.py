"""Measure the actor's activation and log-prob memory that the GPU memory plan models, and write it
as a record the plan reads (``hardware.calibration``).

torch, transformers and verl (no sglang, no network; random weights). For each backbone of
config/config.yaml it builds a model of the backbone's shape (spader/planning/shapes/) with fewer
decoder layers, in bf16 with sdpa attention and activation checkpointing as verl's actor computes,
on a micro-batch of the configured size and length (training.ppo_micro_batch_size_per_gpu x
(max_prompt_length + max_response_length)), and measures the peak memory above what is live
before each pass (the weights, the inputs):

* **the decoder stack** (no output projection; the embedding frozen; every parameter's gradient
  dropped as soon as it is accumulated, as FSDP2 reduce-scatters and frees it per layer) at two
  layer counts: with everything else held fixed, the difference is what each layer adds (the
  input activation checkpointing keeps), so it cannot cancel; the rest is one layer's backward
  working set. The same pass without gradients gives the log-prob passes' forward working set,
  and a padded micro-batch with the attention mask verl's padded path builds, against one
  without, what the mask costs;
* **the log-prob computation** from the last hidden states, through the code the training runs:
  ``fused`` is verl's fused kernel (``FusedLinearForPPO``, torch backend) run as a call of the
  ``lm_head`` module by the project's plug-in (``spader.integrations.verl.fused_logprobs``), as
  verl's FSDP2 actor computes log-probs and entropy with ``use_fused_kernels``; ``full`` is the
  (tokens x vocabulary) logits with verl's ``logprobs_from_logits`` and ``entropy_from_logits``
  (checkpointed in the loss when ``entropy_checkpointing``) over the unpadded rows, as verl's engine
  does without fused kernels. At two token counts, with and without gradients;
* **the whole model** through verl's monkey-patched forward (fused), as a check of the plan's sum.

The peak is the CUDA allocator's (``max_memory_allocated``) on a GPU, and on the CPU the live bytes
of every tensor the passes create (a dispatch mode that follows each storage until it is freed).
The record (YAML, ``--out``) holds per shape the measured constants, the plan's estimates for the
same sizes and the raw peaks; point ``hardware.calibration`` at it and the plan uses the measured
constants for that shape (spader.planning.calibration, docs/gpu.md).

    python scripts/gpu_memory_calibration.py                               # one GPU, configured sizes
    python scripts/gpu_memory_calibration.py --device cpu --tiny --out /tmp/calibration.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
import time
import weakref
from pathlib import Path
from typing import NamedTuple

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from spader.config import resolved_config  # noqa: E402
from spader.planning import plan  # noqa: E402  (plain Python: shapes and the plan's terms)
from spader.planning.calibration import KIND, SHAPE_KEYS  # noqa: E402

GIB = float(1 << 30)
MIB = float(1 << 20)
DEFAULT_OUT = "results/calibration/gpu_memory.yaml"


def settings(root: Path = ROOT) -> dict:
    """The configured sizes and log-prob path (config/config.yaml, config/verl/base.yaml)."""
    config = resolved_config(
        root / "config" / "config.yaml"
    )  # the file holds choices; the defaults filled in
    base = yaml.safe_load((root / "config" / "verl" / "base.yaml").read_text())
    training = config["training"]
    model = base["actor_rollout_ref"]["model"]
    actor = base["actor_rollout_ref"].get("actor") or {}
    return {
        "backbones": {b: spec["model"] for b, spec in config["backbones"].items()},
        "micro_batch": int(training["ppo_micro_batch_size_per_gpu"]),
        "seq_len": int(training["max_prompt_length"]) + int(training["max_response_length"]),
        "fused": bool(model.get("use_fused_kernels", False)),
        "entropy_checkpointing": bool(actor.get("entropy_checkpointing", False)),
    }


def tiny_shape(shape: plan.Shape) -> plan.Shape:
    """The same architecture at CPU size (a test of the script)."""
    return dataclasses.replace(
        shape, vocab=512, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, layers=2
    )


def model_type(shape: plan.Shape) -> str:
    return "qwen3" if shape.qk_norm else ("qwen2" if shape.qkv_bias else "llama")


def build(shape: plan.Shape, layers: int, device: str):
    """A randomly initialised causal LM of ``shape`` with ``layers`` decoder layers, as verl's actor
    computes it: bf16, sdpa, non-reentrant activation checkpointing; the embedding frozen and every
    other gradient dropped once accumulated."""
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
    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config}.get(model_type(shape), LlamaConfig)
    extra = {"head_dim": shape.head_dim} if cls is not Qwen2Config else {}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        cls(**common, **extra), attn_implementation="sdpa", dtype=torch.bfloat16
    )
    model = model.to(device).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.get_input_embeddings().weight.requires_grad_(False)
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(_drop_grad)
    return model


def _drop_grad(param) -> None:
    param.grad = None


# ---------------------------------------------------------------------------------------------
# Peak memory
# ---------------------------------------------------------------------------------------------
class _LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes of the storages the ops inside create and that are still alive; their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _free(self, key: int, size: int) -> None:
        if self.live.pop(key, None) is not None:
            self.now -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # an output on an input's storage (a view, an in-place op, a copy into it) is no allocation
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and not t.is_meta
        }
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key == 0 or key in self.live or key in inputs:
                    continue
                size = storage.nbytes()
                self.live[key] = size
                self.now += size
                self.peak = max(self.peak, self.now)
                weakref.finalize(storage, self._free, key, size)
        return out


class Peak:
    """``with Peak(device) as p: ...``; then ``p.bytes``: the peak above what was allocated at the
    start (the CUDA allocator's on a GPU, :class:`_LiveBytes` elsewhere)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.bytes = 0

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
        else:
            self._mode = _LiveBytes()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self._start
        else:
            self._mode.__exit__(*exc)
            self.bytes = self._mode.peak
        return False


# ---------------------------------------------------------------------------------------------
# Inputs as verl's padded path builds them
# ---------------------------------------------------------------------------------------------
class Batch(NamedTuple):
    ids: torch.Tensor  # (micro, length), right-padded
    mask: torch.Tensor | None  # (micro, length) int32, or None (every token real)
    positions: torch.Tensor
    lengths: list[int]


def make_batch(vocab: int, micro: int, seq: int, device: str, *, padded: bool) -> Batch:
    """A micro-batch of ``micro`` sequences padded to ``seq`` (the longest is full: the padded width
    verl's engine gives it), positions 0.. per sequence; ``padded=False``: every token real."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (micro, seq), generator=generator)
    lengths = [seq - (i * seq) // (2 * micro) for i in range(micro)] if padded else [seq] * micro
    valid = torch.arange(seq).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    positions = torch.where(valid, torch.arange(seq).expand(micro, seq), torch.zeros_like(ids))
    mask = valid.to(torch.int32) if padded else None
    return Batch(ids.to(device), None if mask is None else mask.to(device), positions.to(device), lengths)


# ---------------------------------------------------------------------------------------------
# Passes
# ---------------------------------------------------------------------------------------------
def stack_peak(model, batch: Batch, *, grad: bool, device: str) -> int:
    """Peak bytes of the decoder stack's forward (and backward with the hidden states' gradient)."""
    gradient = None
    if grad:
        gradient = torch.randn(
            *batch.ids.shape, model.config.hidden_size, generator=torch.Generator().manual_seed(2)
        )
        gradient = gradient.to(device=device, dtype=torch.bfloat16)
    with Peak(device) as peak, torch.set_grad_enabled(grad):
        hidden = model.model(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions,
                             use_cache=False)[0]  # fmt: skip
        if grad:
            hidden.backward(gradient)
        del hidden
    return peak.bytes


def _full_logprobs(model, hidden, batch: Batch, targets, *, entropy: bool, checkpoint_entropy: bool):
    """verl's engine without fused kernels on the padded path: the logits, the entropy over them,
    the unpadded rows (narrow, then cat) and verl's logprobs_from_logits."""
    from verl.utils import torch_functional as verl_F

    logits = model.lm_head(hidden)
    ent = None
    if entropy:
        ent = (
            torch.utils.checkpoint.checkpoint(verl_F.entropy_from_logits, logits, use_reentrant=False)
            if checkpoint_entropy
            else verl_F.entropy_from_logits(logits)
        )
        ent = torch.cat([ent[i, :n] for i, n in enumerate(batch.lengths)])
    rows = torch.cat([logits[i, :n] for i, n in enumerate(batch.lengths)])
    labels = torch.cat([targets[i, :n] for i, n in enumerate(batch.lengths)])
    return verl_F.logprobs_from_logits(logits=rows, labels=labels, inplace_backward=not entropy), ent


def _fused_logprobs(model, hidden, batch: Batch, targets):
    """The training's fused route: verl's FusedLinearForPPO through the lm_head module (the
    plug-in's fused_head), then the valid positions (verl's engine masks the dense outputs)."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    from spader.integrations.verl.fused_logprobs import fused_head

    logp, ent = fused_head(model.lm_head, FusedLinearForPPO(impl_backend="torch"), hidden, targets, 1.0)
    valid = (
        torch.arange(hidden.shape[1], device=hidden.device)
        < torch.tensor(batch.lengths, device=hidden.device)[:, None]
    )
    return logp[valid], ent[valid]


def head_peak(
    model, batch: Batch, *, path: str, kind: str, checkpoint_entropy: bool, device: str
) -> tuple[int, torch.Tensor]:
    """Peak bytes of the log-prob computation from the last hidden states (``kind``: ``update`` with
    gradients, ``update_entropy`` with the entropy in the loss, ``forward`` without gradients and
    with the entropy, as the log-prob passes compute it); and the log-probs."""
    grad = kind != "forward"
    generator = torch.Generator().manual_seed(3)
    hidden = (0.5 * torch.randn(*batch.ids.shape, model.config.hidden_size, generator=generator)).to(
        device=device, dtype=torch.bfloat16
    )
    hidden.requires_grad_(grad)
    targets = torch.roll(batch.ids, shifts=-1, dims=-1)
    entropy = kind != "update"
    with Peak(device) as peak, torch.set_grad_enabled(grad):
        if path == "fused":
            logp, ent = _fused_logprobs(model, hidden, batch, targets)
        else:
            logp, ent = _full_logprobs(model, hidden, batch, targets, entropy=entropy,
                                       checkpoint_entropy=checkpoint_entropy)  # fmt: skip
        if grad:
            loss = -logp.mean() - (0.001 * ent.mean() if entropy and ent is not None else 0.0)
            loss.backward()
            del loss
        out = logp.detach().float().cpu()
        del logp, ent
    return peak.bytes, out


def whole_peak(model, batch: Batch, *, device: str) -> int:
    """Peak bytes of the whole model through verl's monkey-patched forward (fused, torch backend,
    the plug-in's route through the lm_head module) and its backward."""
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    from spader.integrations.verl import fused_logprobs

    fused_logprobs.install()
    cls = type(model)
    original = cls.forward
    apply_monkey_patch(
        model=model, use_remove_padding=False, use_fused_kernels=True, fused_kernels_backend="torch"
    )
    try:
        with Peak(device) as peak:
            out = model(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions, use_cache=False,
                        temperature=1.0, return_dict=True)  # fmt: skip
            valid = (
                torch.arange(batch.ids.shape[1], device=batch.ids.device)
                < torch.tensor(batch.lengths, device=batch.ids.device)[:, None]
            )
            loss = -out.log_probs[valid].mean()
            loss.backward()
            del out, loss
    finally:
        cls.forward = original
    return peak.bytes


# ---------------------------------------------------------------------------------------------
# One shape
# ---------------------------------------------------------------------------------------------
def _estimates(shape: plan.Shape, micro: int, seq: int) -> dict:
    """The plan's estimated constants for the same sizes (what the measurement replaces)."""
    c = plan.CONSTANTS
    per_token_layer = 2 * (c["layer_c_h"] * shape.hidden + c["layer_c_q"] * shape.q_dim
                           + c["layer_c_kv"] * shape.kv_dim + c["layer_c_i"] * shape.intermediate)  # fmt: skip
    tokens = micro * seq
    out = {
        "kept_bytes_per_token_layer": 2.0 * shape.hidden,
        "backward_bytes_per_token": c["layer_backward_factor"] * per_token_layer,
        "forward_bytes_per_token": float(per_token_layer),
        "mask_bytes_per_element": 1.0,
        "logprobs_at_tokens": {},
    }
    for fused in (True, False):
        m = plan.VerlMemory(micro_batch=micro, log_prob_micro_batch=micro, ref_micro_batch=micro, critic_micro_batch=micro,
                            seq_len=seq, fused=fused, entropy_checkpointing=True)  # fmt: skip
        path = "fused" if fused else "full"
        out["logprobs_at_tokens"][path] = {
            "update": plan._logits(shape, tokens, m, grad=True, entropy=False) * GIB,
            "forward": plan._logits(shape, tokens, m, grad=False, entropy=True) * GIB,
        }
        if not fused:
            out["logprobs_at_tokens"][path]["update_entropy"] = (
                plan._logits(shape, tokens, m, grad=True, entropy=True) * GIB
            )
    return out


def calibrate_shape(name: str, model_id: str, shape: plan.Shape, *, micro: int, seq: int, layers: tuple[int, int],
                    device: str, entropy_checkpointing: bool) -> tuple[dict, list[str]]:  # fmt: skip
    """Measure one shape; returns the record entry and report lines."""
    low, high = layers
    tokens = micro * seq
    started = time.perf_counter()
    runs: dict[str, int] = {}
    unpadded = make_batch(shape.vocab, micro, seq, device, padded=False)
    padded = make_batch(shape.vocab, micro, seq, device, padded=True)
    half = make_batch(shape.vocab, micro, seq // 2, device, padded=True)
    for n in (low, high):
        model = build(shape, n, device)
        runs[f"stack_{n}_layers_grad"] = stack_peak(model, unpadded, grad=True, device=device)
        if n == low:
            runs[f"stack_{n}_layers_grad_padded"] = stack_peak(model, padded, grad=True, device=device)
            runs[f"stack_{n}_layers_forward"] = stack_peak(model, unpadded, grad=False, device=device)
            logps = {}
            for path in ("fused", "full"):
                kinds = ("update", "forward") + (("update_entropy",) if path == "full" else ())
                for kind in kinds:
                    for label, batch in (("", padded), ("_half", half)):
                        key = f"logprobs_{path}_{kind}{label}"
                        runs[key], logp = head_peak(model, batch, path=path, kind=kind,
                                                    checkpoint_entropy=entropy_checkpointing, device=device)  # fmt: skip
                        if not label and kind == "forward":
                            logps[path] = logp
            agree = bool(torch.allclose(logps["fused"], logps["full"], atol=0.05))
            runs[f"whole_{n}_layers_fused_padded"] = whole_peak(model, padded, device=device)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    kept = (runs[f"stack_{high}_layers_grad"] - runs[f"stack_{low}_layers_grad"]) / ((high - low) * tokens)
    backward = (runs[f"stack_{low}_layers_grad"] - low * kept * tokens) / tokens
    mask_raw = (runs[f"stack_{low}_layers_grad_padded"] - runs[f"stack_{low}_layers_grad"]) / (
        micro * seq * seq
    )
    measured = {
        "kept_bytes_per_token_layer": kept,
        "backward_bytes_per_token": backward,
        "forward_bytes_per_token": runs[f"stack_{low}_layers_forward"] / tokens,
        "mask_bytes_per_element": max(0.0, mask_raw),
        "logprobs": {},
    }
    half_tokens = micro * (seq // 2)
    for path in ("fused", "full"):
        measured["logprobs"][path] = {}
        for kind in ("update", "forward", "update_entropy"):
            if f"logprobs_{path}_{kind}" not in runs:
                continue
            full_t, half_t = runs[f"logprobs_{path}_{kind}"], runs[f"logprobs_{path}_{kind}_half"]
            per_token = (full_t - half_t) / (tokens - half_tokens)
            measured["logprobs"][path][kind] = {
                "fixed_bytes": full_t - per_token * tokens,
                "bytes_per_token": per_token,
            }
    estimated = _estimates(shape, micro, seq)
    # the plan's sum for the whole pass at the low layer count, with the measured constants
    small = dataclasses.replace(shape, layers=low)
    planned_whole = (low * kept + backward) * tokens + micro * seq * seq * measured["mask_bytes_per_element"] + (
        measured["logprobs"]["fused"]["update"]["fixed_bytes"] + measured["logprobs"]["fused"]["update"]["bytes_per_token"] * tokens
    )  # fmt: skip
    whole = runs[f"whole_{low}_layers_fused_padded"]
    entry = {
        "backbone": name,
        "model": model_id,
        "shape": {k: getattr(shape, k) for k in SHAPE_KEYS},
        "layers_measured": [low, high],
        "micro_batch": micro,
        "seq_len": seq,
        "tokens": tokens,
        "measured": measured,
        "estimated": estimated,
        "checks": {
            "fused_and_full_logprobs_agree": agree,
            "mask_bytes_per_element_raw": mask_raw,
            "whole_model_peak_bytes": whole,
            "whole_model_planned_bytes": planned_whole,
        },
        "runs_peak_bytes": runs,
        "seconds": round(time.perf_counter() - started, 1),
    }
    del small
    lines = [
        f"{name} ({model_id}{', tiny' if shape.vocab == 512 else ''}): {micro} x {seq} tokens, {low} and {high} layers, {device}",
        f"  kept per layer:        measured {kept * tokens / MIB:9.2f} MiB ({kept:.1f} B/token), "
        f"plan's estimate {estimated['kept_bytes_per_token_layer'] * tokens / MIB:9.2f} MiB",
        f"  layer backward:        measured {backward * tokens / MIB:9.2f} MiB, estimate "
        f"{estimated['backward_bytes_per_token'] * tokens / MIB:9.2f} MiB",
        f"  layer forward:         measured {measured['forward_bytes_per_token'] * tokens / MIB:9.2f} MiB, estimate "
        f"{estimated['forward_bytes_per_token'] * tokens / MIB:9.2f} MiB",
        f"  mask (padded path):    measured {mask_raw * micro * seq * seq / MIB:9.2f} MiB, estimate "
        f"{micro * seq * seq / MIB:9.2f} MiB",
    ]
    for path, kinds in measured["logprobs"].items():
        for kind, cost in kinds.items():
            got = cost["fixed_bytes"] + cost["bytes_per_token"] * tokens
            lines.append(
                f"  log-probs {path:<5} {kind:<14} measured {got / MIB:9.2f} MiB, estimate "
                f"{estimated['logprobs_at_tokens'][path][kind] / MIB:9.2f} MiB"
            )
    lines.append(f"  log-probs of the fused and full paths agree: {agree}")
    lines.append(
        f"  whole model ({low} layers, fused, padded): measured {whole / MIB:.2f} MiB, the plan's sum with the "
        f"measured constants {planned_whole / MIB:.2f} MiB"
    )
    return entry, lines


def run(args) -> tuple[dict, list[str]]:
    config = settings()
    micro = args.micro_batch or config["micro_batch"]
    seq = args.seq_len or config["seq_len"]
    import transformers

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    record = {
        "kind": KIND,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": where,
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        "argv": list(sys.argv[1:]),
        "shapes": [],
    }
    lines = [f"torch {torch.__version__}, transformers {transformers.__version__}, {where}"]
    for backbone in args.backbones or list(config["backbones"]):
        model_id = config["backbones"][backbone]
        shape = plan.load_shape(model_id)
        if args.tiny:
            shape = tiny_shape(shape)
        layers = (1, 2) if args.tiny else tuple(args.layers)
        entry, more = calibrate_shape(backbone, model_id, shape, micro=micro, seq=seq, layers=layers, device=args.device,
                                      entropy_checkpointing=config["entropy_checkpointing"])  # fmt: skip
        record["shapes"].append(entry)
        lines += more
    return record, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes with one and two layers (CPU test)")
    parser.add_argument("--backbones", nargs="*", help="backbones of config/config.yaml (default: all)")
    parser.add_argument("--layers", nargs=2, type=int, default=[2, 4], help="two layer counts (default: 2 4)")
    parser.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the config's)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: prompt + response)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the record to write (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or with --device cpu --tiny", file=sys.stderr)
        return 2
    if args.layers[0] >= args.layers[1]:
        parser.error("--layers: two counts, the first smaller")
    if args.tiny and not args.seq_len:
        args.seq_len, args.micro_batch = 96, args.micro_batch or 2
    record, lines = run(args)
    for line in lines:
        print(line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(record, sort_keys=False, width=110), encoding="utf-8")
    print(f"wrote {out}: set hardware.calibration to it for the plan to use the measured constants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
