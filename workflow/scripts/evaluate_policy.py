"""Glue for rule evaluate_policy. Logic: spader.evaluation.evaluate (what it needs of its node:
spader.planning.needs)."""

from spader.config import AgentConfig, EvaluationConfig
from spader.core.prompt import checked_template
from spader.evaluation import evaluate_policy
from spader.infra.glue import job, overlay, retrieval_settings
from spader.planning.needs import evaluation_needs
from spader.retrieval.backend import SearchSettings

# sglang's engine starts worker processes that import the main module again: run only as __main__.
if __name__ == "__main__":
    with job(snakemake):
        wc = snakemake.wildcards
        # the config's section overlaid with the param: the keys that rerun nothing are no param
        evaluation = EvaluationConfig.model_validate(
            overlay(snakemake.config["evaluation"], snakemake.params.evaluation)
        )
        retrieval = retrieval_settings(snakemake.params.retrieval, snakemake.config)
        evaluate_policy(
            snakemake.input.records[0],
            snakemake.input.index,
            snakemake.input.model,
            snakemake.output.records,
            snakemake.output.summary,
            method=snakemake.params.method,
            evaluation=evaluation,
            agent=AgentConfig.model_validate(snakemake.params.agent),
            prompt=checked_template(snakemake.params.prompt),
            retrieval=SearchSettings.from_config(retrieval),
            threads=snakemake.threads,
            service_log=snakemake.log.service,
            job_log=snakemake.log.job,
            needs=evaluation_needs(
                f"evaluate {wc.backbone}/{wc.method} on {wc.dataset}",
                evaluation.model_dump(),
                model=snakemake.config["backbones"][wc.backbone]["model"],
                model_dir=snakemake.input.model,
                hardware=snakemake.config["hardware"],
                retrieval=retrieval,
            ),
        )
