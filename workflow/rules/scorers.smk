# Step-level baselines (docs/baselines.md). StepSearch's evidence is built once per training mix,
# index and reranker with the project's own search, and read by the training job of every
# `stepsearch` variant; an `r3rag` variant with the LLM judge gets the judge model (served on its
# node) or the configured judge.url. Their input functions are spader.dag's (train.smk uses them).
rule build_evidence:
    input:
        train=stage("mix_training_set", "results/{suite}/data/mix/train.jsonl"),
        index=JOBS.index(),
        reranker=JOBS.reranker,
        qampari=JOBS.evidence_release,
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
    threads: lambda wc: gpu_job_threads() if CONFIG.stepsearch.evidence.gpus > 0 else 2
    resources:
        gpu=CONFIG.stepsearch.evidence.gpus,
        cpus_per_task=JOBS.gpu_job_cpus(CONFIG.stepsearch.evidence.gpus),
        mem_mb=32000,
        runtime=720,
    params:
        evidence=JOBS.section_params("build_evidence", "stepsearch", "evidence"),
        qampari_member=JOBS.evidence_member(),
        retrieval=JOBS.retrieval_params("build_evidence"),
        code=code_of("build_evidence"),
    script:
        "../scripts/build_evidence.py"
