"""Glue for rule download_dump. Logic: spader.infra.download.fetch (resume, retries, checks, atomic rename)."""

from spader.infra.download import anchor_source, fetch
from spader.infra.glue import job, workflow_root
from spader.infra.sources import record_source_digest

with job(snakemake):
    fetch(
        anchor_source(snakemake.params.url, workflow_root(snakemake)),
        snakemake.output.archive,
        sha256=snakemake.params.sha256,
        size=snakemake.config["corpus"]["size_bytes"],  # a check, no param: it reruns nothing
        desc="chunked_wikipedia.tar.gz",
        record_source=snakemake.params.url,  # as configured: records hold no absolute path
    )
    record_source_digest(snakemake.output.archive, snakemake.params.sha256)  # spader.infra.sources
