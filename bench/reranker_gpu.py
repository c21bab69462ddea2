"""Throughput and GPU memory of a bge-reranker-v2-m3-sized cross-encoder, for the training-step
projection of ``bench/retrieval.py`` and the memory accounting of the reranker replicas.

The model is XLM-RoBERTa large with a one-logit head (the architecture of BAAI/bge-reranker-v2-m3:
24 layers, hidden 1024, 16 heads, FFN 4096, vocabulary 250,002; 568M parameters) with random
weights: throughput and memory do not depend on the weights, and none can be downloaded here. It
runs in fp16 (what the service uses on GPU) through transformers' default attention, on batches of
``batch`` pairs of one exact length (the service's exact-length batches need no mask) and, for
comparison, with a padding mask.

Prints one JSON line per (batch, tokens, masked) and a summary: pairs/s, achieved TFLOP/s, the
weights' memory, the peak activation memory above the weights, and the whole process's footprint
on the GPU (CUDA context included, read with nvidia-smi). Needs only torch and transformers.

With ``--ours``, the same-sized model (random weights, a small locally trained tokenizer: no
tokenizer can be downloaded) also runs through the service's own scoring code
(``spader.retrieval.replicas.RerankerReplicas``: fp16, exact-length batches, tokenization of the
next chunk overlapping the forward pass), with one replica at batch 64 and 512 (``--ours-batches``)
and with two replicas on the same GPU:
pairs/s, scores of two replicas against one, and the footprint ``reserve_peak`` holds. Needs the
package (``PYTHONPATH=src``) and FlagEmbedding.

The run ends by writing a record (``bench/records/``, see ``bench/records.py``): throughput and
memory rows, the fixed-shape and ``--ours`` tables, and on a GPU the worst-case memory of one
replica at ``--max-batch-tokens`` (weights + activations per token x the cap + allocator slack +
CUDA context, each measured), the table docs/retrieval.md quotes. A ``--tiny`` run writes a record
only where ``--records DIR`` sends it (it measures nothing the docs use).

Usage: python bench/reranker_gpu.py [--out results.json] [--tiny] [--ours] [--records DIR]
       (--tiny: a small model, for a quick check of the script on CPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from records import write_record  # bench/records.py (the script's own directory is on sys.path)

# torch and transformers are imported where the model runs: the record's arithmetic imports neither
if TYPE_CHECKING:
    from transformers import XLMRobertaConfig

# (pairs per batch, tokens per pair, with a padding mask)
SHAPES = [
    (64, 160, False),
    (64, 160, True),
    (128, 160, False),
    (256, 160, False),
    (512, 160, False),
    (64, 96, False),
    (64, 224, False),
    (64, 512, False),
    (64, 512, True),
]


def gpu_used_mib() -> float | None:
    """Memory used on GPU 0 as nvidia-smi reports it (all processes), or None without it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def model_config(tiny: bool) -> XLMRobertaConfig:
    """bge-reranker-v2-m3's architecture (or a tiny one)."""
    from transformers import XLMRobertaConfig

    cfg = XLMRobertaConfig(
        vocab_size=250002,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        max_position_embeddings=8194,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        num_labels=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    if tiny:
        cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads = 64, 2, 2
        cfg.intermediate_size, cfg.vocab_size = 128, 1000
    return cfg


def flops_per_pair(cfg: XLMRobertaConfig, params: int, tokens: int) -> float:
    """Forward FLOPs of one pair: 2 per non-embedding weight per token, plus attention scores and
    the weighted sum of values (4 * layers * tokens^2 * hidden)."""
    dense = params - (cfg.vocab_size + cfg.max_position_embeddings + cfg.type_vocab_size) * cfg.hidden_size
    return 2.0 * dense * tokens + 4.0 * cfg.num_hidden_layers * tokens * tokens * cfg.hidden_size


_OURS_WORDS = "the of film river album city director novel band lake village church market index".split()


def _ours_tokenizer(rng):
    """A small Unigram tokenizer trained on random text of :data:`_OURS_WORDS` (draws from ``rng``)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = (
        normalizers.NFKC(),
        pre_tokenizers.Metaspace(),
        decoders.Metaspace(),
    )
    corpus = [" ".join(rng.choices(_OURS_WORDS, k=20)) for _ in range(200)]
    tok.train_from_iterator(
        corpus, trainers.UnigramTrainer(vocab_size=60, special_tokens=specials, unk_token="<unk>")
    )
    return tok


def _ours_model(tok, tiny: bool) -> Path:
    """A random cross-encoder around ``tok`` with bge-reranker-v2-m3's layer sizes (or the tiny
    ones), saved in a temporary directory; returns the model directory."""
    import tempfile

    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    from spader.demo.tiny import save_random_cross_encoder

    work = Path(tempfile.mkdtemp(prefix="reranker_gpu_"))
    small = save_random_cross_encoder(tok, work / "small")
    # The same files with bge-reranker-v2-m3's layer sizes (the vocabulary stays the tokenizer's).
    cfg = XLMRobertaConfig.from_pretrained(small)
    big = model_config(tiny)
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "layer_norm_eps",
    ):
        setattr(cfg, key, getattr(big, key))
    torch.manual_seed(0)
    XLMRobertaForSequenceClassification(cfg).save_pretrained(work / "small")
    return work / "small"


def _ours_run(model_dir: Path, device: str, batch: int, replicas: int, pairs: list) -> tuple[dict, object]:
    """``(row, scores)`` of one ``RerankerReplicas`` run over ``pairs`` (after a warm-up)."""
    import numpy as np
    import torch

    from spader.retrieval.replicas import RerankerReplicas

    rr = RerankerReplicas(
        model_dir,
        (device,) * replicas,
        batch_size=batch,
        max_length=512,
        fp16=True,
        max_batch_tokens=batch * 160,  # the paper config's cap: batch x 160 tokens per pass
    )
    peak = rr.reserve_peak()
    rr.score(pairs[:3200])  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    scores = rr.score(pairs)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    encoded = rr.replicas[0]._encode([q for q, _ in pairs], [p for _, p in pairs])
    tokenize_s = time.perf_counter() - started
    lengths = [len(e) for e in encoded]
    row = {
        "batch": batch,
        "replicas": replicas,
        "pairs": len(pairs),
        "seconds": round(seconds, 3),
        "pairs_per_s": round(len(pairs) / seconds, 1),
        "mean_tokens_per_pair": round(float(np.mean(lengths)), 1),
        "tokenize_pairs_per_s": round(len(pairs) / tokenize_s, 1),
        "reserve_peak_mib": peak,
    }
    rr.close()
    del rr
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row, scores


def ours(args, out: dict) -> None:
    """Score 512 queries x 50 passages through ``RerankerReplicas``: one replica at each batch size
    of ``--ours-batches`` (capped at batch x 160 tokens per pass, as the paper config), then two
    replicas at the last one."""
    import random

    import numpy as np
    import torch

    rng = random.Random(0)
    model_dir = _ours_model(_ours_tokenizer(rng), args.tiny)
    queries = 64 if args.tiny else 512  # --tiny: a quick check of the script on CPU
    pairs = []
    for _ in range(queries):
        query = " ".join(rng.choices(_OURS_WORDS, k=rng.randint(3, 8)))
        pairs += [(query, " ".join(rng.choices(_OURS_WORDS, k=rng.randint(18, 30)))) for _ in range(50)]
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    rows = {}
    scores = {}
    runs = [(batch, 1) for batch in args.ours_batches] + [(args.ours_batches[-1], 2)]
    for batch, replicas in runs:
        row, scores[batch, replicas] = _ours_run(model_dir, device, batch, replicas, pairs)
        rows[f"batch {batch}, {replicas} replica(s)"] = row
        print(json.dumps(row), flush=True)
    one, two = scores[runs[-2]], scores[runs[-1]]
    diff = float(np.max(np.abs(one - two)))
    same_top5 = sum(
        list(np.argsort(-one[i : i + 50], kind="stable")[:5])
        == list(np.argsort(-two[i : i + 50], kind="stable")[:5])
        for i in range(0, len(pairs), 50)
    )
    out["ours"] = {
        "runs": rows,
        "max_score_diff_1_vs_2": diff,
        "identical_top5_1_vs_2": same_top5,
        "queries": queries,
    }
    print(json.dumps(out["ours"], indent=1), flush=True)


def replica_memory(out: dict, max_batch_tokens: int) -> dict | None:
    """One replica's worst-case GPU memory at ``max_batch_tokens`` per pass, from the measured
    weights, activations per token (median over the unmasked shapes), allocator slack (reserved
    above weights + activations at the largest unmasked pass) and CUDA context (the process's
    footprint less the allocator's), in MiB; None without GPU measurements."""
    runs = [r for r in out.get("runs", []) if not r["masked"] and "peak_activation_mib" in r]
    if not runs or out.get("process_gpu_mib") is None:
        return None
    weights = out["weights_mib"]
    per_token = statistics.median(r["peak_activation_mib"] / (r["batch"] * r["tokens"]) for r in runs)
    largest = max(runs, key=lambda r: r["peak_activation_mib"])
    slack = largest["reserved_mib"] - weights - largest["peak_activation_mib"]
    context = out["process_gpu_mib"] - out["max_reserved_mib"]
    return {
        "max_batch_tokens": max_batch_tokens,
        "weights_mib": round(weights, 1),
        "mib_per_token": round(per_token, 5),
        "activations_mib": round(per_token * max_batch_tokens, 1),
        "slack_mib": round(slack, 1),
        "slack_at": f"{largest['batch']} x {largest['tokens']}",
        "process_mib": round(out["process_gpu_mib"], 1),
        "allocator_mib": round(out["max_reserved_mib"], 1),
        "context_mib": round(context, 1),
        "worst_case_mib": round(weights + per_token * max_batch_tokens + slack + context, 1),
    }


def memory_rows(m: dict, params: int) -> list[list[str]]:
    """The table of :func:`replica_memory`."""
    return [
        [f"weights ({params / 1e6:.0f}M parameters, fp16), measured", f"{m['weights_mib']:,.0f}"],
        [
            f"activations of the largest pass, {m['max_batch_tokens']:,} tokens x {m['mib_per_token']:.4f} MiB "
            "per token (median of the unmasked shapes)",
            f"~{m['activations_mib']:,.0f}",
        ],
        [f"allocator slack above the peak (measured at {m['slack_at']})", f"~{m['slack_mib']:,.0f}"],
        [
            f"CUDA context (the process's {m['process_mib']:,.0f} MiB less the allocator's "
            f"{m['allocator_mib']:,.0f}, measured)",
            f"~{m['context_mib']:,.0f}",
        ],
        [
            "**replica in all, worst case**",
            f"**~{m['worst_case_mib']:,.0f} ({m['worst_case_mib'] / 1024:.1f} GiB)**",
        ],
    ]


def _peak(peak) -> str:
    """``reserve_peak``'s MiB per device as text ("—" where nothing is held: the CPU)."""
    if isinstance(peak, dict):
        return ", ".join(f"{d}: {v:,.0f} MiB" for d, v in peak.items()) or "—"
    return "—" if peak is None else f"{peak:,.0f} MiB"


def _shapes_record(out: dict, model: str, device: str, precision: str) -> tuple[dict, dict]:
    """The fixed-shape runs' row and table of the record."""
    runs = out["runs"]
    best = max((r for r in runs if not r["masked"]), key=lambda r: r["pairs_per_s"])
    first = runs[0]
    longest = max((r for r in runs if not r["masked"]), key=lambda r: (r["tokens"], -r["batch"]))
    footprint = ""
    if "weights_mib" in out:
        footprint = f"; weights {out['weights_mib']:,.0f} MiB"
        if out.get("process_gpu_mib") is not None:
            footprint += f", the process {out['process_gpu_mib']:,.0f} MiB with its CUDA context"
    row = {
        "id": "shapes",
        "what": f"{model}, {device}, {precision}, fixed shapes (pairs per batch x tokens per pair)",
        "result": f"**{best['pairs_per_s']:,.0f} pairs/s** at {best['batch']} x {best['tokens']}; "
        f"{first['pairs_per_s']:,.0f} at {first['batch']} x {first['tokens']}, "
        f"{longest['pairs_per_s']:,.0f} at {longest['batch']} x {longest['tokens']}" + footprint,
        "target": None,
        "verdict": None,
        "numbers": {k: v for k, v in out.items() if k != "ours"},
    }
    table = {
        "title": f"{model}, {device}, {precision}, one shape per run",
        "columns": [
            "pairs x tokens",
            "padding mask",
            "pairs/s",
            "TFLOP/s",
            "activations above the weights",
        ],
        "rows": [
            [
                f"{r['batch']} x {r['tokens']}",
                "yes" if r["masked"] else "no",
                f"{r['pairs_per_s']:,.0f}",
                f"{r['tflops']:.1f}",
                f"{r['peak_activation_mib']:,.0f} MiB" if "peak_activation_mib" in r else "—",
            ]
            for r in runs
        ],
    }
    return row, table


def _memory_record(memory: dict, max_batch_tokens: int, params: int) -> tuple[dict, dict]:
    """The worst-case replica memory's row and table of the record."""
    row = {
        "id": "replica-memory",
        "what": f"one reranker replica's worst-case GPU memory at {max_batch_tokens:,} tokens "
        "per pass, from the measured parts",
        "result": f"**~{memory['worst_case_mib']:,.0f} MiB ({memory['worst_case_mib'] / 1024:.1f} GiB)**",
        "target": None,
        "verdict": None,
        "numbers": memory,
    }
    table = {
        "title": f"One replica's GPU memory at {max_batch_tokens:,} tokens per pass, MiB",
        "columns": ["", "MiB"],
        "rows": memory_rows(memory, params),
    }
    return row, table


def _ours_record(ours: dict, model: str, device: str) -> tuple[dict, dict]:
    """The ``--ours`` runs' row and table of the record."""
    ours_runs = ours["runs"]
    same, queries = ours["identical_top5_1_vs_2"], ours["queries"]
    parts = [f"{name}: {r['pairs_per_s']:,.0f} pairs/s" for name, r in ours_runs.items()]
    row = {
        "id": "ours",
        "what": f"the service's scoring code (`RerankerReplicas`), {model}, {device}, {queries} queries "
        "x 50 pairs, one and two replicas",
        "result": "; ".join(parts) + f"; top-5s identical with one and two replicas {same}/{queries} "
        f"(max score difference {ours['max_score_diff_1_vs_2']:.1e})",
        "target": "identical results",
        "verdict": "met" if same == queries else "not met",
        "numbers": ours,
    }
    table = {
        "title": f"The service's scoring code (`RerankerReplicas`), {device}",
        "columns": ["run", "pairs/s", "tokenizer pairs/s", "`reserve_peak`"],
        "rows": [
            [
                name,
                f"{r['pairs_per_s']:,.0f}",
                f"{r['tokenize_pairs_per_s']:,.0f}",
                _peak(r["reserve_peak_mib"]),
            ]
            for name, r in ours_runs.items()
        ],
    }
    return row, table


def write_run_record(out: dict, args) -> str:
    """Write the run's record; returns its path."""
    device = out["device"]
    model = "tiny cross-encoder" if args.tiny else "bge-reranker-v2-m3-shaped cross-encoder (random weights)"
    precision = "fp16" if device != "cpu" else "fp32"
    rows, tables = [], {}
    if out.get("runs"):
        row, tables["shapes"] = _shapes_record(out, model, device, precision)
        rows.append(row)
        memory = replica_memory(out, args.max_batch_tokens)
        if memory:
            row, tables["memory"] = _memory_record(memory, args.max_batch_tokens, out["params"])
            rows.append(row)
    if "ours" in out:
        row, tables["ours"] = _ours_record(out["ours"], model, device)
        rows.append(row)
    return str(
        write_record("bench/reranker_gpu.py", rows, argv=sys.argv[1:], tables=tables, directory=args.records)
    )


def finish(out: dict, args) -> None:
    """Write ``--out`` and the record (a --tiny run only where --records says)."""
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    if args.tiny and args.records is None:
        print("(--tiny: no record written; pass --records DIR to write one)")
    else:
        print(f"record: {write_run_record(out, args)}")


def _parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--tiny", action="store_true", help="a small model (check the script on CPU)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ours", action="store_true", help="also score through RerankerReplicas")
    parser.add_argument("--only-ours", action="store_true", help="skip the plain model runs")
    parser.add_argument(
        "--ours-batches",
        default="64,512",
        type=lambda text: [int(x) for x in text.split(",")],
        help="batch sizes of the --ours runs (one replica each; two replicas at the last)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=81_920,
        help="tokens per pass of the worst-case replica memory (retrieval.reranker.max_batch_tokens)",
    )
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    return parser


def _shape_run(model, cfg, params: int, dev: str, gen, shape: tuple[int, int, bool], repeats: int) -> dict:
    """One fixed-shape run: random ids of ``shape`` (batch, tokens, masked) drawn from ``gen``,
    three warm-up passes, then ``repeats`` timed ones; returns its row."""
    import torch

    batch, tokens, masked = shape
    ids = torch.randint(5, cfg.vocab_size, (batch, tokens), generator=gen)
    ids[:, 0], ids[:, -1] = 0, 2
    ids = ids.to(dev)
    mask = None
    if masked:  # half the rows padded by a quarter: what a padded remainder batch looks like
        mask = torch.ones_like(ids)
        mask[batch // 2 :, tokens * 3 // 4 :] = 0
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        for _ in range(3):
            model(input_ids=ids, attention_mask=mask).logits.float().cpu()
        if dev == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=ids, attention_mask=mask).logits.float().cpu()  # .cpu() syncs, as scoring does
        seconds = (time.perf_counter() - started) / repeats
    row = {
        "batch": batch,
        "tokens": tokens,
        "masked": masked,
        "ms_per_batch": round(seconds * 1e3, 3),
        "pairs_per_s": round(batch / seconds, 1),
        "tflops": round(batch * flops_per_pair(cfg, params, tokens) / seconds / 1e12, 1),
    }
    if dev == "cuda":
        row["peak_activation_mib"] = round(
            (torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()) / 2**20, 1
        )
        row["reserved_mib"] = round(torch.cuda.memory_reserved() / 2**20, 1)
    return row


def _model(cfg, dev: str):
    """``(model, params)``: the random cross-encoder of ``cfg`` (seed 0) in eval mode on ``dev``,
    in fp16 on a GPU, and its parameter count."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    torch.manual_seed(0)
    model = XLMRobertaForSequenceClassification(cfg)
    params = sum(p.numel() for p in model.parameters())
    model = model.to(torch.float16 if dev == "cuda" else torch.float32).to(dev).eval()
    return model, params


def main() -> None:
    import torch

    args = _parser().parse_args()
    if args.only_ours:
        out = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
        ours(args, out)
        finish(out, args)
        return

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    before = gpu_used_mib() if dev == "cuda" else None
    cfg = model_config(args.tiny)
    model, params = _model(cfg, dev)
    out = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": params,
        "attn_implementation": model.config._attn_implementation,
        "flops_per_pair_160": flops_per_pair(cfg, params, 160),
    }
    if dev == "cuda":
        torch.cuda.synchronize()
        out["weights_mib"] = torch.cuda.memory_allocated() / 2**20
    runs = []
    gen = torch.Generator().manual_seed(0)
    # --tiny checks the script: the same shapes, scaled down to run in seconds on a CPU
    shapes = [(b // 8, t // 4, m) for b, t, m in SHAPES] if args.tiny else SHAPES
    for shape in shapes:
        runs.append(_shape_run(model, cfg, params, dev, gen, shape, 2 if args.tiny else args.repeats))
        print(json.dumps(runs[-1]), flush=True)
    out["runs"] = runs
    if dev == "cuda":
        after = gpu_used_mib()
        out["process_gpu_mib"] = None if before is None or after is None else after - before
        out["max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    if args.ours:
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
        ours(args, out)
    print(json.dumps(out, indent=1))
    finish(out, args)


if __name__ == "__main__":
    main()
