# Model weights: hub repositories downloaded once into resources/ (compute nodes often have no
# network), and tiny randomly initialised models built locally for the demo and smoke tests.


rule download_model:
    output:
        model=directory(stage("download_model", "resources/models/hub/{repo}")),
    log:
        "logs/download_model/{repo}.log",
    params:
        repo_id=lambda wc: wc.repo.replace("--", "/", 1),
        revision=lambda wc: JOBS.hub_revision(wc.repo),
    script:
        "../scripts/download_model.py"


rule build_tiny_model:
    output:
        model=directory(stage("build_tiny_model", "results/models/tiny/{kind}")),
    log:
        "logs/build_tiny_model/{kind}.log",
    params:
        seed=0,
        code=code_of("build_tiny_model"),
    script:
        "../scripts/build_tiny_model.py"


# CPU demo only: a tiny random policy never writes a valid action, so it is first taught the
# action format by supervised fine-tuning on scripted episodes with real search results
# (spader.demo.warmstart). It starts its own retrieval service, like evaluation.
rule warmstart_policy:
    input:
        mix=stage("mix_training_set", f"results/{SUITE}/data/mix/train.jsonl"),
        eval_sets=expand(
            stage("export_eval_set", "results/{suite}/data/eval/{dataset}.jsonl"),
            suite=SUITE,
            dataset=DATASETS,
        ),
        index=JOBS.index(),
        model=JOBS.base_model,
        reranker=JOBS.reranker,
    output:
        model=directory(stage("warmstart_policy", "results/{backbone}/warmstart/model")),
        trajectories=stage("warmstart_policy", "results/{backbone}/warmstart/trajectories.jsonl"),
        summary=stage("warmstart_policy", "results/{backbone}/warmstart/summary.json"),
    log:
        job="logs/warmstart_policy/{backbone}.log",
        service="logs/warmstart_policy/{backbone}.service.log",
    benchmark:
        "results/benchmarks/warmstart_policy/{backbone}.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=30,
    params:
        warmstart=lambda wc: JOBS.section_params("warmstart_policy", "backbones", wc.backbone, "warmstart"),
        agent=JOBS.agent_params(),
        prompt=JOBS.prompt,
        retrieval=JOBS.retrieval_params("warmstart_policy"),
        code=code_of("warmstart_policy"),
    script:
        "../scripts/warmstart_policy.py"
