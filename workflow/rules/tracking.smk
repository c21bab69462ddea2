# One MLflow parent run per snakemake invocation (jobs nest their runs under it). Hooks run only
# in the main snakemake process: never in dry runs, never inside cluster jobs (--no-hooks).
from spader.infra.tracking import end_pipeline_run, start_pipeline_run


onstart:
    if "check_training_executor" in globals():  # training.smk: nodes > 1 needs a cluster executor
        check_training_executor()
    start_pipeline_run(
        config, targets=[str(t) for t in workflow.dag.targetfiles], code_root=workflow.basedir
    )


onsuccess:
    end_pipeline_run(config, "FINISHED")


onerror:
    end_pipeline_run(config, "FAILED")
