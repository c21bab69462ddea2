# One MLflow parent run per snakemake invocation (jobs nest their runs under it). Hooks run only
# in the main snakemake process: never in dry runs, never inside cluster jobs (--no-hooks). A
# damaged store is one line naming it (spader.infra.tracking.check_store).
from spader.infra.tracking import TrackingStoreError, end_pipeline_run, start_pipeline_run


onstart:
    check_before_start()  # common.smk: what a job would fail for, before the first one
    try:
        start_pipeline_run(
            config, targets=[str(t) for t in workflow.dag.targetfiles], code_root=workflow.basedir
        )
    except TrackingStoreError as exc:
        raise WorkflowError(str(exc)) from None


onsuccess:
    try:
        end_pipeline_run(config, "FINISHED")
    except TrackingStoreError as exc:
        logger.error(str(exc))


onerror:
    report_failed_jobs()  # common.smk: each failed job's cause on the console
    try:
        end_pipeline_run(config, "FAILED")
    except TrackingStoreError as exc:
        logger.error(str(exc))
