"""Glue for rule train_policy. Logic: spader.training.run.

SLURM's time-limit warning is caught from the script's first statement (it may come while the job
is still importing) and kept until verl can act on it. A training stopped on purpose before its
last step (a time limit ahead, SIGTERM) exits with spader.training.stop.RESUME_EXIT_CODE; the
rule's retries run it again and it resumes."""

from spader.training.stop import catch_stop_requests

catch_stop_requests()

import sys  # noqa: E402

from spader.infra.glue import job  # noqa: E402
from spader.training.run import TrainJob, run_training  # noqa: E402
from spader.training.stop import RESUME_EXIT_CODE, StoppedForResume  # noqa: E402

try:
    with job(snakemake) as run:
        run_training(TrainJob.from_snakemake(snakemake), run=run)
except StoppedForResume:
    sys.exit(RESUME_EXIT_CODE)
