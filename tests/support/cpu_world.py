"""A small training world for the CPU training tests and the training bench.

Built from the demo's fictional world (spader.demo.world) with the project's own code: its
passages indexed by the real BM25 indexer, its questions exported to verl's parquet format by the
data export, a tiny Qwen3 warm-started by the demo's warm-start code on scripted answers. Two
deliberate changes make it a world a tiny model can learn in a few steps on 2 cores:

* the prompt is a short template (``Question: {question}``), so sequences are tens of tokens;
* the policy is warm-started on answers of two forms, a well-formed JSON list and a bare name
  (which the reward scores as an invalid format), so its rollouts are sometimes well-formed and
  sometimes not: rewards vary inside each group, advantages are not zero, and reinforcement
  learning has one clear choice to move.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from spader.config import resolved_config

SHORT_TEMPLATE = "Question: {question}"
CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"


@dataclass
class TrainWorld:
    """Paths and settings of a built world (see :func:`build_world`)."""

    root: Path
    train: Path
    val: Path
    index: Path
    base_model: Path
    model: Path
    retrieval: dict
    agent: dict
    questions: list = field(default_factory=list)


def _retrieval_settings() -> dict:

    settings = dict(resolved_config(CONFIG)["retrieval"])
    settings["reranker"] = {**settings["reranker"], "model": None, "path": None}
    settings["service"] = {
        **settings["service"],
        "startup_timeout_s": 300,
        "request_timeout_s": 60,
        "retries": 1,
    }
    return settings


def _answer(names: list[str]) -> str:
    return "<think>I know them.</think>\n<answer>" + json.dumps(names, ensure_ascii=False) + "</answer>"


def indexed_corpus(root: Path, chunks) -> Path:
    """Write ``chunks`` (corpus records) to ``root/corpus/chunks.jsonl`` and index them in
    ``root/index`` (kept when it exists); returns the index directory."""
    from spader.retrieval.index import build_bm25_index

    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    with open(corpus / "chunks.jsonl", "w", encoding="utf-8") as f:
        for rec in chunks:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    index = root / "index"
    if not index.exists():
        build_bm25_index(corpus, index, threads=1)
    return index


def build_world(
    root: str | os.PathLike, *, n_train: int = 4, n_val: int = 2, warm_steps: int = 60, warm_lr: float = 3e-3
) -> TrainWorld:
    """Write the world under ``root`` (index, parquet files, base and warm-started models).

    Args:
        root: output directory.
        n_train, n_val: questions (topics of the demo world) in the training and validation sets.
        warm_steps, warm_lr: supervised warm-start steps and learning rate (few: a partly formed policy).
    Returns:
        The world.
    """
    import polars as pl

    from spader.core.prompt import PromptTemplate
    from spader.data.export import verl_rows
    from spader.demo import chunk_lines
    from spader.demo.world import build_world as demo_world

    root = Path(root)
    world = demo_world()
    index = indexed_corpus(root, chunk_lines(world))

    template = PromptTemplate(SHORT_TEMPLATE, source="cpu training test world")
    topics = world.topics[: n_train + n_val]
    records = [
        {
            "id": f"world:{i}",
            "dataset": "qampari",
            "question": t.question(),
            "answers": [[o.plain, *o.aliases] for o in t.objects],
        }
        for i, t in enumerate(topics)
    ]
    paths = {}
    for split, rows in (("train", records[:n_train]), ("val", records[n_train:])):
        paths[split] = root / f"{split}.parquet"
        verl_rows(pl.DataFrame(rows), split, template).write_parquet(paths[split])

    base, model = root / "base", root / "warm"
    if not (model / "config.json").exists():  # built once per directory
        _warm_start(records[:n_train], template, base, model, warm_steps, warm_lr)
    agent = {"max_turns": 2, "max_turn_tokens": 48, "max_tool_response_chars": 600, "max_queries_per_call": 2,
             "stop": ["</tool_call>", "</answer>"], "prompt_template": None}  # fmt: skip
    return TrainWorld(
        root=root,
        train=paths["train"],
        val=paths["val"],
        index=index,
        base_model=base,
        model=model,
        retrieval=_retrieval_settings(),
        agent=agent,
        questions=records,
    )


def _warm_start(records, template, base: Path, model: Path, steps: int, lr: float) -> None:
    """A tiny Qwen3 fine-tuned for ``steps`` steps on direct answers naming the first gold entity,
    half of them well-formed (a JSON list) and half not (the bare name): the policy learns both
    and picks either, so rewards differ inside every group and a few reinforcement-learning steps
    can move that one choice towards the rewarded form."""
    from spader.demo.tiny import TINY_MARKER, build_tiny_qwen3
    from spader.demo.warmstart import WarmstartSettings, train_warmstart

    build_tiny_qwen3(base, kv_heads=1)  # the shape this world's margins were measured with
    conversations = []
    for r in records:
        name = r["answers"][0][0]
        for answer in (
            _answer([name]),
            _answer([name]).replace(json.dumps([name], ensure_ascii=False), name),
        ):
            conversations.append(
                [*template.messages(r["question"]), {"role": "assistant", "content": answer}]
            )
    train_warmstart(
        base,
        conversations,
        model,
        WarmstartSettings(steps=steps, batch_size=len(conversations), lr=lr, warmup_ratio=0.0),
        threads=2,
        progress=False,
    )
    shutil.copy(base / TINY_MARKER, model / TINY_MARKER)  # still the tiny model, as evaluation says


def cpu_training(**sizes) -> dict:
    """config.yaml's ``training`` section for a CPU run of this world, with ``sizes`` applied."""

    training = dict(resolved_config(CONFIG)["training"])
    training.update(
        device="cpu",
        rollout_backend="transformers",
        cpu_workers=1,
        train_batch_size=4,
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=4,
        rollout_n=8,
        lr=1e-3,
        lr_warmup_ratio=0.0,
        max_prompt_length=128,
        max_response_length=256,
        save_freq=1,
        test_freq=100,
        max_steps=4,
    )
    training.update(sizes)
    return training


def train_job(world: TrainWorld, out: str | os.PathLike, *, variant: str = "spader", training=None, extra=()):
    """The :class:`spader.training.run.TrainJob` of one CPU training run in ``world``."""

    from spader.training.run import TrainJob

    config = resolved_config(CONFIG)
    out = Path(out)
    return TrainJob(
        backbone="world",
        variant=variant,
        backbone_spec={"model": "tiny:qwen3", "gpus": 0, "variants": [variant], "prompting": []},
        variant_spec=dict(config["variants"][variant]),
        training=training or cpu_training(),
        retrieval=world.retrieval,
        train_file=world.train,
        val_file=world.val,
        index_dir=world.index,
        model_dir=world.model,
        verl_config_dir=CONFIG.parent / "verl",
        workdir=out / "work",
        final_json=out / "final.json",
        threads=2,
        extra_overrides=tuple(extra),
        agent=dict(world.agent),
    )


def main(argv: list[str]) -> int:
    """``python cpu_world.py WORLD_ROOT OUT TRAINING_JSON``: one training job, as a killable process."""
    import logging
    import sys

    from spader.training.run import run_training
    from spader.training.stop import RESUME_EXIT_CODE, StoppedForResume

    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    world = build_world(argv[0])
    try:
        run_training(train_job(world, argv[1], training=cpu_training(**json.loads(argv[2]))))
    except StoppedForResume:  # as the train_policy rule's script: a rerun resumes
        return RESUME_EXIT_CODE
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
