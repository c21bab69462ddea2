"""One real training step of each baseline on the CPU: the training job as the workflow runs it
(``spader.training.run.run_training``: verl's entry point, v1 trainer, TransferQueue, agent loop,
FSDP2 actor, critic and reference on gloo, the ``transformers`` rollout replica) with the demo's
CPU settings shrunk to one step of 2 prompts x 2 rollouts. Stand-ins: the tiny random Qwen3
(no weights can be downloaded) and the stdlib retrieval service of tests/verl (the search is not
what is under test; tests/scorers/test_evidence.py runs the real one). R3-RAG uses the reranker
judge (the demo's; an LLM judge needs a served model)."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import polars as pl
import pytest
import yaml

pytest.importorskip("verl")

from spader.config import resolved_config

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    ("q1", "Which films did Ilse Varga direct?", [["The Salt Orchard"], ["Winter Quay"], ["Harbour Lights"]]),
    ("q2", "Which films are set in a harbour?", [["Harbour Lights"], ["Winter Quay"]]),
]


def merged_config() -> dict:
    """config.yaml overlaid with demo.yaml, as ``--configfile config/demo.yaml`` does."""

    def update(base, overlay):
        for k, v in overlay.items():
            if isinstance(v, dict) and isinstance(base.get(k), dict):
                update(base[k], v)
            else:
                base[k] = copy.deepcopy(v)
        return base

    return resolved_config(REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml")


def write_data(root: Path) -> tuple[Path, Path, Path]:
    from spader.data.export import verl_rows

    frame = pl.DataFrame(
        {
            "id": [q[0] for q in QUESTIONS],
            "dataset": ["qampari", "quest"],
            "question": [q[1] for q in QUESTIONS],
            "answers": [q[2] for q in QUESTIONS],
        }
    )
    train, val = root / "train.parquet", root / "val.parquet"
    verl_rows(frame, "train").write_parquet(train)
    verl_rows(frame.head(1), "val").write_parquet(val)
    evidence = root / "evidence.jsonl"
    texts = {
        "q1": ["Winter Quay is a drama film directed by Ilse Varga."],
        "q2": ["Harbour Lights is a 1964 film."],
    }
    evidence.write_text(
        "".join(
            json.dumps({"id": k, "dataset": "x", "n_entities": 1, "evidence": [{"title": "", "text": t}]})
            + "\n"
            for k, v in texts.items()
            for t in v
        )
    )
    return train, val, evidence


@pytest.mark.slow
@pytest.mark.timeout(1200)
# StepSearch's step is `long` (README): two PPO trainings with a critic took 8-15 minutes of the
# suite; R3-RAG's (judge, critic, the step-level reward manager) stays in the default run, and
# StepSearch's evidence and rewards are tested without verl (test_evidence.py, test_stepsearch.py).
@pytest.mark.parametrize("variant", [pytest.param("stepsearch", marks=pytest.mark.long), "r3rag"])
def test_one_training_step_on_the_cpu(variant, tiny_model, retrieval_service, tmp_path):
    from spader.training.run import TrainJob, run_training

    config = merged_config()
    training = {
        **config["training"],
        "max_steps": 1,
        "train_batch_size": 2,
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 2,
        "rollout_n": 2,
        "save_freq": 1,
    }
    train, val, evidence = write_data(tmp_path)
    index = tmp_path / "index"
    index.mkdir()
    job = TrainJob(
        backbone="demo",
        variant=variant,
        backbone_spec={"model": "tiny:qwen3", "gpus": 0},
        variant_spec=config["variants"][variant],
        training=training,
        retrieval=config["retrieval"],
        train_file=train,
        val_file=val,
        index_dir=index,
        model_dir=tiny_model,
        verl_config_dir=REPO / "config" / "verl",
        workdir=tmp_path / "work",
        final_json=tmp_path / "final.json",
        threads=2,
        evidence=evidence if variant == "stepsearch" else None,
        stepsearch=config["stepsearch"],
        agent=config["agent"],
        # no validation rollouts: only the training step is under test (halves the run time)
        extra_overrides=("trainer.val_before_train=false", "trainer.test_freq=-1"),
    )

    def stub_service(index_dir, settings, **kwargs):
        return contextlib.nullcontext(retrieval_service.url)

    final = run_training(job, service=stub_service)
    assert final["steps_done"] == 1
    checkpoint = Path(final["checkpoint"])
    assert (checkpoint / "actor").is_dir() and (checkpoint / "critic").is_dir()  # PPO with a critic
    prefix = f"{variant}/"
    metrics = final["metrics"]
    assert any(k.startswith(prefix) for k in metrics), sorted(metrics)
    assert metrics[f"{prefix}empty_responses"] == 0.0
    assert metrics["critic/vf_loss"] == metrics["critic/vf_loss"]  # finite (NaN != NaN)
    assert metrics["actor/reward_kl_penalty_coeff"] == (0.001 if variant == "stepsearch" else 0.01)
    config_text = (job.workdir / "resolved_config.yaml").read_text()
    assert f"step_reward: {variant}" in config_text
    assert yaml.safe_load((job.workdir / "tool_config.yaml").read_text())["tools"][0]["config"][
        "record_turns"
    ]
