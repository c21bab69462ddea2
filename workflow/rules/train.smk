# Training: verl per backbone x variant (logic in spader.training; docs/method.md, docs/cluster.md).
# Checkpoints are written to results/{backbone}/train/{variant}/work/, which is deliberately not a
# declared output: Snakemake deletes the outputs of a failed job, and a rerun resumes from the
# newest complete checkpoint there (`spader rerun --from-scratch` moves it aside to retrain from
# step 0). A finished training's final.json is replaced only on purpose (spader.infra.replace_guard,
# the onstart hook). The job starts its own retrieval service on the node, and its MLflow run
# receives verl's per-step metrics.
#
# Time limits: the job asks SLURM for a warning (SIGURG) training.time_limit.warning_s before its
# limit, stops verl at the next step boundary after a checkpoint and exits with status 75; the
# rule's `retries` rerun it, and the rerun resumes. Its runtime is the variant's estimate
# (training.time_limit.hours) capped by the SLURM profile's `max_runtime` for train_policy.
# Nodes: variants.<name>.nodes, else training.nodes, per job (a Ray cluster across them); more
# than one needs a cluster executor. CPUs and host memory come from the node's description
# (hardware.cores, hardware.host_memory_gib) and the job's plan (`spader plan`);
# partition, account and GPU model live in profiles/slurm, never here. What a training job asks
# for: spader.dag.TrainingResources (TRAINING, common.smk).


rule train_policy:
    input:
        train=f"results/{SUITE}/data/verl/train.parquet",
        val=f"results/{SUITE}/data/verl/val.parquet",
        index=JOBS.index(),
        model=JOBS.backbone_model,
        reranker=JOBS.reranker,
        verl_configs=JOBS.verl_configs,
        evidence=JOBS.evidence,
        judge_model=JOBS.judge_model,
    output:
        final="results/{backbone}/train/{variant}/final.json",
    log:
        "logs/train_policy/{backbone}/{variant}.log",
    benchmark:
        "results/benchmarks/train_policy/{backbone}/{variant}.tsv"
    retries: TRAINING.retries(workflow.remote_exec)
    threads: gpu_job_threads()
    resources:
        gpu=TRAINING.gpus,
        gres=TRAINING.gres,
        nodes=TRAINING.nodes,
        # one task per node: SLURM shrinks `--nodes=2 --ntasks=1` (what plugin 2.6.1 asks for a job
        # without GPUs) to one node; a GPU job's request carries no --ntasks (tasks_per_gpu: 0)
        tasks=TRAINING.nodes,
        cpus_per_task=lambda wc: TRAINING.request(wc)[0],
        mem_mb=lambda wc: TRAINING.request(wc)[1],
        runtime=lambda wc: TRAINING.runtime(wc, workflow.resource_settings.overwrite_resources),
        slurm_extra=TRAINING.signal_option(),
        train_attempt=lambda wc, attempt: attempt,
    params:
        backbone=lambda wc: JOBS.backbone_params(wc.backbone),
        variant=lambda wc: JOBS.variant_params(wc.variant),
        training=JOBS.training_params(),
        agent=JOBS.agent_params(),
        retrieval=JOBS.retrieval_params("train_policy"),
        workdir=lambda wc: f"results/{wc.backbone}/train/{wc.variant}/work",
        judge=lambda wc: JOBS.judge_params(wc.variant),
        code=code_of("train_policy"),
    script:
        "../scripts/train_policy.py"


# The export of a finished training, like the training's record, is guarded: a run that would replace
# it because something upstream changed stops before its first job (spader.infra.replace_guard, the onstart
# hook); `spader rerun <output>` recomputes on purpose (docs/running.md).
rule export_checkpoint:
    input:
        final="results/{backbone}/train/{variant}/final.json",
    output:
        model=directory("results/{backbone}/models/{variant}"),
        meta="results/{backbone}/models/{variant}.json",
    log:
        "logs/export_checkpoint/{backbone}/{variant}.log",
    benchmark:
        "results/benchmarks/export_checkpoint/{backbone}/{variant}.tsv"
    threads: 8
    resources:
        mem_mb=64000,
        runtime=120,
    params:
        code=code_of("export_checkpoint"),
    script:
        "../scripts/export_checkpoint.py"
