"""A method from outside the repository trains on the CPU with verl's own trainer: the training
job as the workflow runs it (``spader.training.run.run_training``: verl's entry point, v1 trainer,
TransferQueue, agent loop, FSDP2 actor on gloo, the ``transformers`` rollout replica) with the
demo's CPU settings shrunk to one step of 2 prompts x 2 rollouts. Its advantage is registered with
verl and its step rewards run in the ``spader_sync`` trainer mode, all from its entry point
(tests/support/plugin_method.py). Stand-ins: the tiny random Qwen3 (no weights can be downloaded)
and the stdlib retrieval service of tests/verl (the search is not what is under test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

pytest.importorskip("verl")

from plugin_method import REPO, VARIANT, environment, install

TRAIN = textwrap.dedent(
    """
    import contextlib, json, sys
    from pathlib import Path

    import polars as pl

    from spader.config import VariantConfig, resolved_config
    from spader.data.export import verl_rows
    from spader.training.run import TrainJob, run_training

    repo, out, model, url, variant = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    config = resolved_config(repo / "config" / "config.yaml", repo / "config" / "demo.yaml")
    frame = pl.DataFrame({
        "id": ["q1", "q2"],
        "dataset": ["qampari", "quest"],
        "question": ["Which films did Ilse Varga direct?", "Which films are set in a harbour?"],
        "answers": [[["The Salt Orchard"], ["Winter Quay"]], [["Harbour Lights"], ["Winter Quay"]]],
    })
    verl_rows(frame, "train").write_parquet(out / "train.parquet")
    verl_rows(frame.head(1), "val").write_parquet(out / "val.parquet")
    (out / "index").mkdir()
    training = {**config["training"], "max_steps": 1, "train_batch_size": 2, "ppo_mini_batch_size": 2,
                "ppo_micro_batch_size_per_gpu": 2, "rollout_n": 2, "save_freq": 1}
    job = TrainJob(
        backbone="demo", variant="bonus", backbone_spec={"model": "tiny:qwen3", "gpus": 0},
        variant_spec=VariantConfig.model_validate(json.loads(variant)).model_dump(mode="json"),
        training=training, retrieval=config["retrieval"], train_file=out / "train.parquet",
        val_file=out / "val.parquet", index_dir=out / "index", model_dir=Path(model),
        verl_config_dir=repo / "config" / "verl", workdir=out / "work", final_json=out / "final.json",
        threads=2, agent=config["agent"],
        extra_overrides=("trainer.val_before_train=false", "trainer.test_freq=-1"),
    )
    final = run_training(job, service=lambda *a, **k: contextlib.nullcontext(url))
    print(json.dumps({"steps_done": final["steps_done"], "metrics": final["metrics"]}))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_plugin_method_trains_a_step_on_the_cpu(tiny_model, retrieval_service, tmp_path):
    site = install(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN, str(REPO), str(out), str(tiny_model), retrieval_service.url,
         json.dumps(VARIANT)],
        env=environment(site), capture_output=True, text=True, timeout=1100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    assert final["steps_done"] == 1
    metrics = final["metrics"]
    # its step rewards ran (their metrics) and its advantage trained the actor (a finite loss)
    assert metrics["novelty_bonus/reward/mean"] == metrics["novelty_bonus/reward/mean"]
    assert metrics["actor/pg_loss"] == metrics["actor/pg_loss"]
    resolved = yaml.safe_load((out / "work" / "resolved_config.yaml").read_text())
    assert resolved["algorithm"]["adv_estimator"] == "novelty_bonus_return"
    assert resolved["algorithm"]["step_reward"] == "novelty_bonus"
    assert resolved["algorithm"]["novelty_bonus"]["bonus"] == 0.25
