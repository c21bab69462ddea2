# Step-level baselines (docs/baselines.md). StepSearch's evidence is built once per training mix,
# index and reranker with the project's own search, and read by the training job of every
# `stepsearch` variant; an `r3rag` variant with the LLM judge gets the judge model (served on its
# node) or the configured judge.url. Their input functions live in common.smk (train.smk uses them).
rule build_evidence:
    input:
        train=stage("mix_training_set", "results/{suite}/data/mix/train.jsonl"),
        index=get_index(),
        reranker=get_reranker,
        qampari=get_evidence_release,
    output:
        evidence=stage("build_evidence", "results/{suite}/data/evidence/train.jsonl"),
        coverage=report(
            stage("build_evidence", "results/{suite}/data/evidence/coverage.json"),
            caption="../report/baselines.rst",
            category="Baselines",
            labels={"table": "StepSearch evidence coverage"},
        ),
    log:
        job="logs/build_evidence/{suite}.log",
        service="logs/build_evidence/{suite}.service.log",
    benchmark:
        "results/benchmarks/build_evidence/{suite}.tsv"
    threads: lambda wc: get_gpu_job_threads() if config["stepsearch"]["evidence"]["gpus"] > 0 else 2
    resources:
        gpu=config["stepsearch"]["evidence"]["gpus"],
        cpus_per_task=gpu_job_cpus(config["stepsearch"]["evidence"]["gpus"]),
        mem_mb=32000,
        runtime=720,
    params:
        evidence=section_params("build_evidence", "stepsearch", "evidence"),
        qampari_member=config["datasets"]["qampari"]["splits"]["train"].get("member"),
        retrieval=retrieval_params("build_evidence"),
        code=code_of("build_evidence"),
    script:
        "../scripts/build_evidence.py"
