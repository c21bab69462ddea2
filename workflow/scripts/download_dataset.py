"""Glue for rule download_dataset. Logic: spader.data.release_files (tests/data/test_download.py)."""

from spader.data import download_dataset
from spader.infra.glue import job, workflow_root
from spader.infra.sources import record_source_digest

with job(snakemake):
    download_dataset(
        snakemake.params.source,
        snakemake.output.raw,
        key=snakemake.params.key,
        base_dir=workflow_root(snakemake),  # relative paths in the config name files of the repository
    )
    # a local file's content, planned with (spader.infra.sources)
    record_source_digest(snakemake.output.raw, snakemake.params.source.get("sha256"))
