"""Glue for rule warmstart_policy. Logic: spader.demo.warmstart (tests/models/)."""

from spader.config import AgentConfig
from spader.core.prompt import checked_template
from spader.demo.warmstart import WarmstartSettings, warmstart_policy
from spader.infra.glue import job, retrieval_settings
from spader.retrieval.backend import SearchSettings

with job(snakemake) as run:
    summary = warmstart_policy(
        snakemake.input.mix,
        snakemake.input.eval_sets,
        snakemake.input.index,
        snakemake.input.model,
        snakemake.output.model,
        snakemake.output.trajectories,
        snakemake.output.summary,
        warmstart=WarmstartSettings.from_config(snakemake.params.warmstart),
        agent=AgentConfig.model_validate(snakemake.params.agent),
        prompt=checked_template(snakemake.params.prompt),
        retrieval=SearchSettings.from_config(
            retrieval_settings(snakemake.params.retrieval, snakemake.config)
        ),
        threads=snakemake.threads,
        service_log=snakemake.log.service,
    )
    if run is not None:
        import mlflow

        for step, loss in enumerate(summary["losses"]):
            mlflow.log_metric("warmstart_loss", loss, step=step)
        mlflow.log_metrics({k: summary[k] for k in ("train_seconds", "conversations", "kept_fraction")})
