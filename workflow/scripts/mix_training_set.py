"""Glue for rule mix_training_set. Logic: spader.data.mix (tests/data/test_mix.py)."""

from spader.config import DATASETS
from spader.config.model import MixConfig
from spader.data import mix_metrics, mix_training_set
from spader.infra.glue import job
from spader.infra.tracking import log_metrics

with job(snakemake):
    datasets = snakemake.params.datasets
    stats = mix_training_set(
        dict(zip(datasets, snakemake.input.train, strict=True)),
        dict(zip(DATASETS, snakemake.input.test, strict=True)),  # every evaluated dataset
        snakemake.output.train,
        snakemake.output.val,
        snakemake.output.stats,
        MixConfig.model_validate(snakemake.params.mix),
    )
    log_metrics(mix_metrics(stats))
