"""Glue for rule build_evidence. Logic: spader.scorers.evidence."""

from spader.infra.glue import job, retrieval_settings
from spader.infra.tracking import log_metrics
from spader.retrieval.backend import SearchSettings
from spader.scorers.evidence import EvidenceSettings, build_evidence_with_service, coverage_metrics

with job(snakemake):
    coverage = build_evidence_with_service(
        snakemake.input.train,
        snakemake.input.index,
        SearchSettings.from_config(retrieval_settings(snakemake.params.retrieval, snakemake.config)),
        snakemake.output.evidence,
        snakemake.output.coverage,
        settings=EvidenceSettings.model_validate(snakemake.params.evidence),
        threads=snakemake.threads,
        service_log=snakemake.log.service,
        qampari_release=snakemake.input.qampari[0] if snakemake.input.qampari else None,
        qampari_member=snakemake.params.qampari_member,
    )
    log_metrics(coverage_metrics(coverage))
