"""export_checkpoint: a real verl FSDP checkpoint (2 ranks, written on CPU by verl's checkpoint
manager) merged into a Hugging Face model by verl's model merger, plus the lineage metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from spader.training.hf_export import ExportError, export_checkpoint


def _final(tmp_path, actor_dir) -> dict:
    final = {
        "backbone": "demo",
        "variant": "spader",
        "steps_done": 1,
        "checkpoint": str(actor_dir.parent),
        "actor_dir": str(actor_dir),
        "base_model": "tiny:qwen3",
        "config_hash": "c" * 64,
        "data_hash": "d" * 64,
        "train_hash": "t" * 64,
        "val_hash": "v" * 64,
        "index_hash": "dir:" + "i" * 64,
        "verl_version": "0.9.1",
        "mlflow_run_id": "abc",
        "metrics": {"actor/pg_loss": 0.1},
    }
    path = tmp_path / "final.json"
    path.write_text(json.dumps(final))
    return final


@pytest.mark.slow
def test_export_merges_the_shards_into_the_trained_weights(tmp_path, fsdp_actor, tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)  # the job's working directory: final.json's paths are relative to it
    work = Path("results/demo/train/spader/work/checkpoints/global_step_1")
    shutil.copytree(fsdp_actor, work / "actor")
    torch.save({}, work / "data.pt")
    shutil.copytree(work, work.with_name("global_step_0"))  # an intermediate checkpoint
    final = _final(tmp_path, work / "actor")
    out = Path("results/demo/models/spader")
    out.mkdir(parents=True)
    (out / "stale.bin").write_text("from an earlier export")
    meta = export_checkpoint(
        tmp_path / "final.json", out, Path("results/demo/models/spader.json"), keep_checkpoints=False
    )
    # the retention rule: the intermediate checkpoint went once the export was written, the final stays
    assert not work.with_name("global_step_0").exists() and (work / "actor" / "fsdp_config.json").is_file()

    assert not (out / "stale.bin").exists()
    assert not list(out.parent.glob(".*export-tmp"))
    merged = AutoModelForCausalLM.from_pretrained(out)
    source = AutoModelForCausalLM.from_pretrained(tiny_model)
    merged_sd, source_sd = merged.state_dict(), source.state_dict()
    assert merged_sd.keys() == source_sd.keys()
    for key, value in source_sd.items():  # verl's merger saves bfloat16
        assert torch.equal(merged_sd[key], value.to(merged_sd[key].dtype)), key
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )

    on_disk = json.loads(Path("results/demo/models/spader.json").read_text())
    assert on_disk == meta
    for key in (
        "steps_done",
        "config_hash",
        "data_hash",
        "index_hash",
        "verl_version",
        "backbone",
        "variant",
    ):
        assert meta[key] == final[key]
    assert meta["model_hash"].startswith("dir:")
    # relocatable: the metadata names the model and checkpoint relative to the working directory
    assert meta["model_dir"] == "results/demo/models/spader"
    assert meta["checkpoint"] == "results/demo/train/spader/work/checkpoints/global_step_1"


def test_export_names_a_missing_checkpoint(tmp_path):
    _final(tmp_path, tmp_path / "work" / "checkpoints" / "global_step_1" / "actor")
    with pytest.raises(
        ExportError,
        match=r"names checkpoint .*global_step_1/actor, which is missing or incomplete.*demo/spader",
    ):
        export_checkpoint(
            tmp_path / "final.json", tmp_path / "out", tmp_path / "out.json", keep_checkpoints=False
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.json").exists()
