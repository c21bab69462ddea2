"""Glue for rule warmstart_policy. Logic: spader.demo.warmstart (tests/models/)."""

from spader.config import AgentConfig
from spader.core.prompt import checked_template
from spader.demo.warmstart import WarmstartSettings, warmstart_policy
from spader.infra.glue import job, retrieval_settings
from spader.infra.tracking import log_metrics
from spader.retrieval.backend import SearchSettings

with job(snakemake):
    summary = warmstart_policy(
        snakemake.input.mix,
        snakemake.input.eval_sets,
        snakemake.input.index,
        snakemake.input.model,
        snakemake.output.model,
        snakemake.output.trajectories,
        snakemake.output.summary,
        warmstart=WarmstartSettings.model_validate(snakemake.params.warmstart),
        agent=AgentConfig.model_validate(snakemake.params.agent),
        prompt=checked_template(snakemake.params.prompt),
        retrieval=SearchSettings.from_config(
            retrieval_settings(snakemake.params.retrieval, snakemake.config)
        ),
        threads=snakemake.threads,
        service_log=snakemake.log.service,
    )
    log_metrics(
        {k: summary[k] for k in ("train_seconds", "conversations", "kept_fraction")},
        series={"warmstart_loss": summary["losses"]},
    )
