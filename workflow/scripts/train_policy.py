"""Glue for rule train_policy. Logic: spader.training.run."""

from spader.infra.glue import job
from spader.training.run import TrainJob, run_training

with job(snakemake) as run:
    run_training(TrainJob.from_snakemake(snakemake), run=run)
