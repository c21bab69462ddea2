"""The first hour's step at the paper's shape (spader.training.paper_step), by its dry run here."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_paper_step_is_qwen3_8b_on_every_gpu_with_rollout_tp_2(tmp_path, capsys):
    from spader.training.paper_step import main

    assert main(["--root", str(REPO), "--out", str(tmp_path / "step"), "--dry-run", "--gpus", "8"]) == 0
    text = capsys.readouterr().out
    printed = json.loads(text[text.index("{\n") :])
    argv, resolved = printed["argv"], printed["resolved"]
    assert "trainer.total_training_steps=1" in argv and "trainer.n_gpus_per_node=8" in argv
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in argv
    assert any(a.startswith("actor_rollout_ref.model.path=") and a.endswith("Qwen--Qwen3-8B") for a in argv)
    assert (resolved["trainer.device"], resolved["data.max_response_length"]) == ("cuda", 8192)
    # its plan: the GPU peak of its launch (and, where the data is there, its time and disk)
    assert printed["planned"]["gpu_capacity_gib"] == 80 and 0 < printed["planned"]["peak_gpu_gib"] < 80
    # this checkout has neither the weights nor the paper's data: the run would skip, naming them
    assert any("the weights of Qwen/Qwen3-8B" in m for m in printed["missing"])


def test_without_its_inputs_the_step_is_skipped_in_one_line(tmp_path, capsys):
    import pytest

    from spader.config import load_config
    from spader.training.paper_step import main, missing_inputs, paper_step_job

    config = load_config(REPO / "config" / "config.yaml").model_dump(mode="json")
    if not missing_inputs(paper_step_job(config, tmp_path, root=REPO, gpus=8)):
        pytest.skip("this checkout has Qwen3-8B's weights and the paper's data: the step would train")

    assert main(["--root", str(REPO), "--out", str(tmp_path / "step"), "--gpus", "8"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x]
    assert line.startswith("paper step: skipped, this checkout lacks the weights of Qwen/Qwen3-8B")
