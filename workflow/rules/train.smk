# Training: verl per backbone x variant (logic in spader.training; docs/method.md). Checkpoints
# are written to results/{backbone}/train/{variant}/work/, which is deliberately not a declared
# output: Snakemake deletes the outputs of a failed job, and a rerun resumes from the newest
# complete checkpoint there. The job starts its own retrieval service on the node, and its MLflow
# run receives verl's per-step metrics. Cluster requests (CPUs, one task, partition) live in
# profiles/slurm, never here.


rule train_policy:
    input:
        train=f"results/{SUITE}/data/verl/train.parquet",
        val=f"results/{SUITE}/data/verl/val.parquet",
        index=get_index(),
        model=get_backbone_model,
        reranker=get_reranker,
        verl_configs=get_verl_configs,
        evidence=get_evidence,
        judge_model=get_judge_model,
    output:
        final="results/{backbone}/train/{variant}/final.json",
    log:
        "logs/train_policy/{backbone}/{variant}.log",
    threads: get_gpu_job_threads()
    resources:
        gpu=lambda wc: config["backbones"][wc.backbone]["gpus"],
        mem_mb=lambda wc: max(64000, 60000 * config["backbones"][wc.backbone]["gpus"]),
        runtime=2880,
    params:
        backbone=lambda wc: backbone_params(wc.backbone),
        variant=lambda wc: config["variants"][wc.variant],
        training=config["training"],
        agent=agent_params(),
        retrieval=retrieval_params(),
        workdir=lambda wc: f"results/{wc.backbone}/train/{wc.variant}/work",
        judge=lambda wc: judge_params(config["variants"][wc.variant], config["judge"]),
        code=code_of("train_policy"),
    script:
        "../scripts/train_policy.py"


rule export_checkpoint:
    input:
        final="results/{backbone}/train/{variant}/final.json",
    output:
        model=directory("results/{backbone}/models/{variant}"),
        meta="results/{backbone}/models/{variant}.json",
    log:
        "logs/export_checkpoint/{backbone}/{variant}.log",
    threads: 8
    resources:
        mem_mb=64000,
        runtime=120,
    params:
        code=code_of("export_checkpoint"),
    script:
        "../scripts/export_checkpoint.py"
