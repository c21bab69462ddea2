"""Glue for rule train_policy. Logic: spader.training.run.

A training stopped on purpose before its last step (a time limit ahead, SIGTERM) exits with
spader.training.stop.RESUME_EXIT_CODE; the rule's retries run it again and it resumes."""

import sys

from spader.infra.glue import job
from spader.training.run import TrainJob, run_training
from spader.training.stop import RESUME_EXIT_CODE, StoppedForResume

try:
    with job(snakemake) as run:
        run_training(TrainJob.from_snakemake(snakemake), run=run)
except StoppedForResume:
    sys.exit(RESUME_EXIT_CODE)
