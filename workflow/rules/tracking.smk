# One MLflow parent run per snakemake invocation (jobs nest their runs under it). Hooks run only
# in the main snakemake process: never in dry runs, never inside cluster jobs (--no-hooks).
from spader.infra.tracking import end_pipeline_run, start_pipeline_run


onstart:
    check_before_start()  # common.smk: what a job would fail for, before the first one
    start_pipeline_run(
        config, targets=[str(t) for t in workflow.dag.targetfiles], code_root=workflow.basedir
    )


onsuccess:
    end_pipeline_run(config, "FINISHED")


onerror:
    report_failed_jobs()  # common.smk: each failed job's cause on the console
    end_pipeline_run(config, "FAILED")
