"""Glue for rule aggregate_results. Logic: spader.evaluation.aggregate (curves: .curves)."""

import json
import logging
from pathlib import Path

from spader.evaluation import aggregate_results
from spader.evaluation.curves import steps_from_mlflow
from spader.infra.glue import job
from spader.infra.tracking import MlflowSettings
from spader.training.checkpoints import read_step_metrics


def training_steps(finals, config):
    """Per training run, its per-step metrics: from the metrics files of its work directory (the
    records verl also logs to the MLflow run), or from the MLflow run its final.json names when
    those files were deleted with the work directory."""
    out = {}
    for path in finals:
        final = json.loads(Path(path).read_text(encoding="utf-8"))
        metrics_dir = Path(path).parent / "work" / "metrics"
        steps = read_step_metrics(metrics_dir) if metrics_dir.is_dir() else {}
        if not steps and final.get("mlflow_run_id") and config.get("mlflow", {}).get("enabled", True):
            uri = MlflowSettings(config["mlflow"]).tracking_uri
            steps = steps_from_mlflow(uri, final["mlflow_run_id"])
        if not steps:
            logging.getLogger("spader").warning("%s: no per-step metrics found for its learning curves", path)
        out[str(final.get("variant") or Path(path).parent.name)] = steps
    return out


with job(snakemake):
    aggregate_results(
        list(snakemake.input.summaries),
        list(snakemake.input.records),
        dict(snakemake.output.items()),
        methods=snakemake.params.methods,
        variants=snakemake.params.variants,
        datasets=snakemake.params.datasets,
        backbone=snakemake.wildcards.backbone,
        shared_runs=snakemake.params.shared_runs,
        uncertainty=snakemake.params.uncertainty,
        training_steps=training_steps(snakemake.input.finals, snakemake.config),
    )
