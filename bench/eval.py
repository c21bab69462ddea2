"""Benchmark of agent inference for evaluation. Prints ratios measured side by
side in one run:

1. Loop overhead per turn, generation excluded: the loop driven by an instant scripted engine
   (fake, no model) and an instant search returning demo-sized passages; everything left is the
   loop's own work (chat template, tokenization, parsing, discovery, observation text).
2. Evaluation throughput with the CPU engine (transformers) on the demo: episodes per second with
   batched episodes against one episode at a time, and the loop's share of the wall time.
   Uses the demo's evaluation set, index and models under results/ when the demo has been run
   (and the retrieval service is available); otherwise a synthetic set with an in-process search
   (said so in the output).
3. On a GPU with sglang installed: the same episodes with the sglang and the transformers engines.
   Skipped cleanly (and said so) anywhere else.

The run ends by writing a record (``bench/records/``, see ``bench/records.py``), one row per part.

Usage: .venv/bin/python bench/eval.py [--episodes 24] [--model DIR] [--gpu-model DIR] [--records DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from records import write_record  # bench/records.py (the script's own directory is on sys.path)

from spader.agent.generation import Generation, TransformersEngine, load_tokenizer
from spader.agent.loop import AgentSettings, Question, run_episodes

ROOT = Path(__file__).resolve().parents[1]
WORDS = "river lake film novel album director city mountain island battle treaty painter".split()


def passage(i: int) -> dict:
    body = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(100))  # ~100 words, as the corpus
    return {"id": f"d{i}", "title": f"Title {i}", "text": body, "score": 1.0}


class InstantSearch:
    """In-process search (fake service): ``topk`` fixed passages per query, no I/O."""

    def __init__(self, topk: int = 5):
        self.topk, self.seconds = topk, 0.0

    def __call__(self, queries):
        t = time.perf_counter()
        out = [[passage(hash(q) % 997 + k) for k in range(self.topk)] for q in queries]
        self.seconds += time.perf_counter() - t
        return out


class InstantEngine:
    """Scripted engine (fake, no model): ``turns - 1`` searches with 3 queries, then an answer."""

    name = "instant"

    def __init__(self, tokenizer, turns: int):
        self.tokenizer, self.turns, self.seen = tokenizer, turns, {}

    def generate(self, prompts, max_new_tokens, sampling, seeds=None):
        out = []
        for ids in prompts:
            key = tuple(ids[:64])
            n = self.seen[key] = self.seen.get(key, 0) + 1
            if n < self.turns:
                text = f'<think>step {n}</think><tool_call>["q{n} a", "q{n} b", "q{n} c"]</tool_call>'
            else:
                text = '<think>done</think><answer>["river", "lake"]</answer>'
            tokens = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            out.append(Generation(text, completion_tokens=len(tokens), token_ids=tokens))
        return out

    def close(self):
        pass


class Timed:
    """Proxy that accumulates the time spent in ``generate``."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, 0.0
        self.name, self.tokenizer = engine.name, engine.tokenizer

    def generate(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t

    def close(self):
        self.engine.close()


def _agent_settings(max_context_tokens: int, **agent) -> AgentSettings:
    """The loop's settings from the configuration's sections: their defaults, ``agent`` keys changed,
    no stop for generation errors."""
    from spader.config import AgentConfig, EvaluationConfig
    from spader.config.model import ServiceConfig

    evaluation = EvaluationConfig(max_context_tokens=max_context_tokens)
    settings = AgentSettings.from_config(evaluation, AgentConfig(**agent), ServiceConfig())
    return dataclasses.replace(settings, max_error_share=None)


def questions(n: int) -> list[Question]:
    return [
        Question(f"b{i}", f"Which {WORDS[i % len(WORDS)]}s are linked to item {i}?", [["river"], ["lake"]])
        for i in range(n)
    ]


def bench_overhead(tokenizer, episodes: int, turns: int) -> dict:
    settings = _agent_settings(max_turns=turns, max_context_tokens=10**7)
    runs = []
    for _ in range(3):
        engine, search = Timed(InstantEngine(tokenizer, turns)), InstantSearch()
        t = time.perf_counter()
        eps = run_episodes(questions(episodes), engine, search, settings, progress=False)
        wall = time.perf_counter() - t
        n_turns = sum(len(e.steps) for e in eps)
        runs.append((wall - engine.seconds - search.seconds) / n_turns)
    per_turn = statistics.median(runs)
    longest = max(s.prompt_tokens for e in eps for s in e.steps)
    print(
        f"[1] loop overhead per turn (generation and search excluded), {episodes} episodes x {turns} turns, "
        f"3 queries x 5 passages per search, prompts up to {longest} tokens: {1e3 * per_turn:.2f} ms (median of 3)"
    )
    return {
        "id": "loop-overhead",
        "what": f"agent loop overhead per turn (generation and search excluded), {episodes} episodes x {turns} "
        f"turns, 3 queries x 5 passages per search, prompts up to {longest:,} tokens",
        "result": f"**{1e3 * per_turn:.2f} ms** per turn (median of 3 runs)",
        "target": None,
        "verdict": None,
        "numbers": {"per_turn_ms": round(1e3 * per_turn, 4), "runs_ms": [round(1e3 * r, 4) for r in runs]},
    }


def demo_inputs():
    """(questions, search context manager factory, label) from the demo outputs, or None."""
    eval_dir, index = ROOT / "results/demo/data/eval", ROOT / "results/demo/index/bm25"
    reranker = ROOT / "results/models/tiny/reranker"
    if not (eval_dir.is_dir() and index.is_dir() and importlib.util.find_spec("spader.retrieval.service")):
        return None
    from spader.agent.search import RetrievalSearch
    from spader.evaluation.episodes import load_eval_set
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    items = [q for f in sorted(eval_dir.glob("*.jsonl")) for q, _ in load_eval_set(f)]
    settings = {"bm25": {"k1": 0.9, "b": 0.4}, "initial_k": 50, "topk": 5,
                "reranker": {"model": "tiny:reranker", "path": str(reranker), "batch_size": 16, "max_length": 512, "fp16": False},
                "service": {"host": "127.0.0.1", "max_queries_per_request": 512, "max_query_chars": 1000,
                            "startup_timeout_s": 600, "request_timeout_s": 120, "retries": 3}}  # fmt: skip

    @contextlib.contextmanager
    def search():
        with (
            running_service(index, SearchSettings.from_config(settings), threads=2) as url,
            RetrievalClient(url, timeout=120, retries=3) as c,
        ):
            yield RetrievalSearch(c, topk=5)

    return items, search, f"demo ({len(items)} questions, real BM25 + tiny reranker service)"


def bench_throughput(model_dir: Path, n: int, threads: int) -> dict:
    found = demo_inputs()
    if found is None:
        items, label = (
            questions(n),
            f"synthetic ({n} questions, in-process search: run the demo for the real one)",
        )
        search_cm = lambda: contextlib.nullcontext(InstantSearch())  # noqa: E731
    else:
        items, search_cm, label = found
    settings = _agent_settings(max_turns=3, max_turn_tokens=48, max_context_tokens=4096)  # config/demo.yaml
    configs = [(8, threads), (1, threads), (8, threads + 1)]  # (batch size, torch threads)
    engines = {
        c: Timed(TransformersEngine(model_dir, device="cpu", batch_size=c[0], threads=c[1])) for c in configs
    }
    best: dict[tuple[int, int], tuple[float, float, int]] = {}
    with search_cm() as search:
        for engine in engines.values():
            run_episodes(items[:2], engine, search, settings, progress=False)  # warm-up, not timed
        for _ in range(2):  # alternate, keep each one's best round (robust to a busy machine)
            for config, engine in engines.items():
                engine.seconds = 0.0
                t = time.perf_counter()
                eps = run_episodes(items, engine, search, settings, method="react", progress=False)
                wall = time.perf_counter() - t
                result = (len(eps) / wall, 1 - engine.seconds / wall, sum(len(e.steps) for e in eps))
                if config not in best or result[0] > best[config][0]:
                    best[config] = result
    for engine in engines.values():
        engine.close()
    (b8, share8, turns), (b1, _, _), (more, _, _) = (best[c] for c in configs)
    print(f"[2] CPU engine throughput on {label}, tiny random Qwen3, {turns} turns:")
    print(
        f"    {threads} torch thread(s): batch 8 {b8:.2f} episodes/s, one at a time {b1:.2f} episodes/s; "
        f"batched / unbatched = {b8 / b1:.2f}x"
    )
    print(
        f"    batch 8 with {threads + 1} torch threads: {more:.2f} episodes/s; "
        f"{threads} / {threads + 1} threads = {b8 / more:.2f}x"
    )
    print(f"    share of wall time outside generation (loop + search), batch 8: {100 * share8:.1f}%")
    return {
        "id": "cpu-throughput",
        "what": f"evaluation with the CPU engine (transformers), tiny random Qwen3, {label}, {turns} turns",
        "result": f"batch 8: **{b8 / b1:.1f}x** one episode at a time ({b8:.2f} vs {b1:.2f} episodes/s, "
        f"{threads} torch thread(s)); {threads + 1} threads: {more:.2f} episodes/s; outside generation "
        f"(loop + search) {100 * share8:.0f}% of the wall time",
        "target": None,
        "verdict": None,
        "numbers": {
            "batched_eps": round(b8, 4),
            "unbatched_eps": round(b1, 4),
            "more_threads_eps": round(more, 4),
            "share_outside_generation": round(share8, 4),
            "turns": turns,
            "inputs": label,
        },
    }


def gpu_sized_random_qwen3(tiny_dir: Path, out: Path) -> Path:
    """A random 2-layer Qwen3 with the tiny tokenizer but real head size (128), so that sglang's
    attention kernels accept it (the tiny model's head size of 16 is below what they support)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok), hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, head_dim=128, max_position_embeddings=32768,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def bench_gpu(model_dir: Path | None, tiny_dir: Path, n: int, tmp: Path) -> dict | None:
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("sglang") is None:
        print(
            "[3] sglang vs transformers: skipped (needs a CUDA GPU and sglang; this machine has "
            f"cuda={torch.cuda.is_available()}, sglang={'installed' if importlib.util.find_spec('sglang') else 'absent'})"
        )
        return None
    from spader.integrations.sglang import SglangEngine

    model_dir = model_dir or gpu_sized_random_qwen3(tiny_dir, tmp / "qwen3_gpu")
    settings = _agent_settings(max_turns=3, max_turn_tokens=256, max_context_tokens=8192)
    rates = {}
    for name in ("sglang", "transformers"):
        eng = (
            SglangEngine(model_dir)
            if name == "sglang"
            else TransformersEngine(model_dir, device="cuda", batch_size=64)
        )
        engine = Timed(eng)
        t = time.perf_counter()
        run_episodes(questions(n), engine, InstantSearch(), settings, progress=False)
        rates[name] = n / (time.perf_counter() - t)
        engine.close()
    print(
        f"[3] GPU, {model_dir}: sglang {rates['sglang']:.2f} episodes/s, transformers {rates['transformers']:.2f} "
        f"episodes/s; sglang / transformers = {rates['sglang'] / rates['transformers']:.2f}x"
    )
    return {
        "id": "gpu-engines",
        "what": f"evaluation on a GPU ({torch.cuda.get_device_name()}), {model_dir.name}, {n} episodes: sglang vs "
        "transformers",
        "result": f"sglang **{rates['sglang'] / rates['transformers']:.1f}x** transformers "
        f"({rates['sglang']:.2f} vs {rates['transformers']:.2f} episodes/s)",
        "target": None,
        "verdict": None,
        "numbers": rates,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: robust on a shared machine)"
    )
    ap.add_argument(
        "--model", type=Path, default=None, help="CPU model (default: the demo's tiny Qwen3, built if absent)"
    )
    ap.add_argument(
        "--gpu-model", type=Path, default=None, help="GPU comparison model (default: a random 2-layer Qwen3)"
    )
    ap.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or ROOT / "results/models/tiny/qwen3"
        if not (model / "config.json").exists():
            from spader.demo.tiny import build_tiny_qwen3

            model = build_tiny_qwen3(Path(tmp) / "qwen3")
            print(f"(tiny random Qwen3 built in {model}; run the demo to reuse results/models/tiny/qwen3)")
        rows = [
            bench_overhead(load_tokenizer(model), args.episodes, turns=4),
            bench_throughput(model, args.episodes, args.threads),
        ]
        gpu = bench_gpu(args.gpu_model, model, max(args.episodes, 64), Path(tmp))
    rows += [gpu] if gpu else []
    argv = sys.argv[1:] if argv is None else list(argv)
    print(f"record: {write_record('bench/eval.py', rows, argv=argv, directory=args.records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
