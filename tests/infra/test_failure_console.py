"""A failed job's cause on the console as it fails, under a cluster executor (whose jobs' stderr
goes to their cluster logs): Snakemake's report of the failed job, as it logs it, carries the job's
logs, and the workflow's handler (spader.infra.failures.JobErrors) prints the cause from them."""

from __future__ import annotations

import logging

from snakemake_interface_logger_plugins.common import LogEvent

from spader.infra.failures import JobErrors


def _report(logger: logging.Logger, jobid: int, logs: list[str], msg: str | None) -> None:
    """What Snakemake logs when an executor reports a failed job (snakemake.jobs.Job.log_error)."""
    logger.error(
        f"Error in rule train_policy, jobid: {jobid}",
        extra={"event": LogEvent.JOB_ERROR, "jobid": jobid, "rule_name": "train_policy", "log": logs,
               "rule_msg": msg, "aux": {}},
    )  # fmt: skip


def test_the_cause_of_a_failed_cluster_job_is_printed_as_it_fails(tmp_path):
    job_log, slurm_log = tmp_path / "train.log", tmp_path / "slurm-12.log"
    job_log.write_text(
        "2026-12-05 01:00:00 INFO spader.training.run: launching verl\n"
        "2026-12-05 01:00:09 ERROR spader.failure: train_policy failed: TrainingError: verl exited with code 3\n"
    )
    slurm_log.write_text("srun: error: node0: task 0: Exited with exit code 1\n")
    printed: list[str] = []
    cluster = [True]
    handler = JobErrors(echo=printed.append, when=lambda: cluster[0])
    logger = logging.getLogger("test-failure-console")
    logger.addHandler(handler)
    try:
        _report(logger, 7, [str(job_log), str(slurm_log)], "SLURM-job '12' failed, SLURM status is: 'FAILED'")
        assert printed == [
            f"train_policy (jobid 7) failed: TrainingError: verl exited with code 3 [log: {job_log}, {slurm_log}]"
        ]
        # a job that wrote no cause (killed at its time limit): what the executor said of it
        job_log.write_text("2026-12-05 01:00:00 INFO spader.training.run: launching verl\n")
        slurm_log.write_text(
            "slurmstepd: error: *** JOB 13 CANCELLED AT 2026-12-05T02:00:00 DUE TO TIME LIMIT ***\n"
        )
        _report(
            logger, 8, [str(job_log), str(slurm_log)], "SLURM-job '13' failed, SLURM status is: 'TIMEOUT'"
        )
        assert printed[1].startswith(
            "train_policy (jobid 8) failed: SLURM-job '13' failed, SLURM status is: 'TIMEOUT'"
        )
        # a local run: the job's stderr is this console already, nothing is printed twice
        cluster[0] = False
        _report(logger, 9, [str(job_log)], None)
        assert len(printed) == 2
    finally:
        logger.removeHandler(handler)
