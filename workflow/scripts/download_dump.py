"""Glue for rule download_dump. Logic: spader.infra.download.fetch (resume, retries, checks, atomic rename)."""

from spader.infra.download import fetch
from spader.infra.glue import job

with job(snakemake):
    fetch(
        snakemake.params.url,
        snakemake.output.archive,
        sha256=snakemake.params.sha256,
        size=snakemake.params.size_bytes,
        desc="chunked_wikipedia.tar.gz",
    )
