"""The data rules through the real `snakemake` CLI on a copy of the repository (demo config):
download (file: URL) -> normalize with the drop counts beside the records and in the job's MLflow
run; a null URL fails the download job with a message naming the config key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _snakemake(smk, work: Path, target: str, *configfiles: str) -> subprocess.CompletedProcess:
    return smk.run(
        "--cores",
        "2",
        target,
        "--configfile",
        "config/demo.yaml",
        *configfiles,
        cwd=work,
        check=False,
        timeout=600,
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory, smk):
    return smk.copy_repo(tmp_path_factory.mktemp("data_rules"))


def test_normalize_records_drops_and_mlflow(work, smk):
    target = "results/demo/data/normalized/mintaka/train.jsonl"
    proc = _snakemake(smk, work, target)
    assert proc.returncode == 0, proc.stderr[-4000:]
    drops = json.loads((work / "results/demo/data/normalized/mintaka/train.drops.json").read_text())
    assert drops["dataset"] == "mintaka" and drops["kept"] == sum(1 for _ in open(work / target))
    assert drops["read"] == drops["kept"] + sum(drops["dropped"].values())
    assert drops["dropped"]["count_question"] >= 1
    log = (work / "logs/normalize_dataset/demo/mintaka/train.log").read_text()
    assert f"mintaka train: read {drops['read']}, kept {drops['kept']}" in log

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work}/results/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("spader")
    runs = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("snakemake.rule") == "normalize_dataset"
    ]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    metrics = runs[0].data.metrics
    assert metrics["records_read"] == drops["read"] and metrics["records_kept"] == drops["kept"]
    for reason, count in drops["dropped"].items():
        assert metrics[f"dropped/{reason.replace(':', '/')}"] == count
    assert (
        json.loads(
            Path(client.download_artifacts(runs[0].info.run_id, "drops.json", str(work / "dl"))).read_text()
        )
        == drops
    )


def test_null_url_fails_with_the_config_key(work, tmp_path, smk):
    overlay = tmp_path / "webqsp.yaml"
    overlay.write_text("datasets:\n  webqsp:\n    files:\n      WebQSP.zip: {url: null}\n")
    proc = _snakemake(smk, work, "resources/demo/datasets/webqsp/WebQSP.zip", str(overlay))
    assert proc.returncode != 0
    # the run stops before its first job, the key on the console
    out = proc.stdout + proc.stderr
    assert "this run cannot start" in out, out[-3000:]
    assert "config key 'datasets.webqsp.files.WebQSP.zip.url' is not set" in out
    assert not (work / "logs/download_dataset/demo/webqsp/WebQSP.zip.log").exists()
    assert not (work / "resources/demo/datasets/webqsp/WebQSP.zip").exists()
