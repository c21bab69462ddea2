"""Glue for rule download_dump. Logic: spader.download.fetch (resume, retries, checks, atomic rename)."""

from spader.download import fetch
from spader.glue import job

with job(snakemake):
    fetch(
        snakemake.params.url,
        snakemake.output.archive,
        sha256=snakemake.params.sha256,
        size=snakemake.params.size_bytes,
        desc="chunked_wikipedia.tar.gz",
    )
