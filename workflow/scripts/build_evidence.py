"""Glue for rule build_evidence. Logic: spader.scorers.evidence (what it needs of its node:
spader.planning.needs)."""

from spader.infra.glue import job, overlay, retrieval_settings
from spader.infra.tracking import log_metrics
from spader.planning.needs import evidence_needs
from spader.retrieval.backend import SearchSettings
from spader.scorers.evidence import EvidenceSettings, build_evidence_with_service, coverage_metrics

with job(snakemake):
    retrieval = retrieval_settings(snakemake.params.retrieval, snakemake.config)
    # the config's section overlaid with the param: the keys that rerun nothing (gpus) are no param
    settings = EvidenceSettings.model_validate(
        overlay(snakemake.config["stepsearch"]["evidence"], snakemake.params.evidence)
    )
    coverage = build_evidence_with_service(
        snakemake.input.train,
        snakemake.input.index,
        SearchSettings.from_config(retrieval),
        snakemake.output.evidence,
        snakemake.output.coverage,
        settings=settings,
        threads=snakemake.threads,
        service_log=snakemake.log.service,
        qampari_release=snakemake.input.qampari[0] if snakemake.input.qampari else None,
        qampari_member=snakemake.params.qampari_member,
        needs=evidence_needs(
            "build_evidence", settings, hardware=snakemake.config["hardware"], retrieval=retrieval
        ),
    )
    log_metrics(coverage_metrics(coverage))
