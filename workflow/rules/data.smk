# Datasets: release files -> unified records (norm_v1) -> 6k/2k/2k/2k training mix, verl parquet
# and one evaluation file per dataset (docs/data.md). Logic: spader.data.


rule download_dataset:
    output:
        raw=stage("download_dataset", "resources/{suite}/datasets/{dataset}/{file}"),
    log:
        "logs/download_dataset/{suite}/{dataset}/{file}.log",
    params:
        source=JOBS.dataset_source,
        key=lambda wc: f"datasets.{wc.dataset}.files.{wc.file}",
    script:
        "../scripts/download_dataset.py"


rule normalize_dataset:
    input:
        raw=JOBS.split_source,
    output:
        records=stage("normalize_dataset", "results/{suite}/data/normalized/{dataset}/{split}.jsonl"),
        drops=stage("normalize_dataset", "results/{suite}/data/normalized/{dataset}/{split}.drops.json"),
    log:
        "logs/normalize_dataset/{suite}/{dataset}/{split}.log",
    params:
        member=JOBS.split_member,
        code=code_of("normalize_dataset"),
    script:
        "../scripts/normalize_dataset.py"


rule mix_training_set:
    input:
        train=JOBS.mix_files("train"),
        test=JOBS.mix_files("test"),
    output:
        train=stage("mix_training_set", "results/{suite}/data/mix/train.jsonl"),
        val=stage("mix_training_set", "results/{suite}/data/mix/val.jsonl"),
        stats=stage("mix_training_set", "results/{suite}/data/mix/stats.json"),
    log:
        "logs/mix_training_set/{suite}.log",
    params:
        datasets=JOBS.mix_datasets(),
        mix=JOBS.section_params("mix_training_set", "mix"),
        code=code_of("mix_training_set"),
    script:
        "../scripts/mix_training_set.py"


rule export_rl_dataset:
    input:
        train=stage("mix_training_set", "results/{suite}/data/mix/train.jsonl"),
        val=stage("mix_training_set", "results/{suite}/data/mix/val.jsonl"),
    output:
        train="results/{suite}/data/verl/train.parquet",
        val="results/{suite}/data/verl/val.parquet",
    log:
        "logs/export_rl_dataset/{suite}.log",
    params:
        prompt=JOBS.prompt,
        code=code_of("export_rl_dataset"),
    script:
        "../scripts/export_rl_dataset.py"


rule export_eval_set:
    input:
        records=stage("normalize_dataset", "results/{suite}/data/normalized/{dataset}/test.jsonl"),
    output:
        records=stage("export_eval_set", "results/{suite}/data/eval/{dataset}.jsonl"),
    log:
        "logs/export_eval_set/{suite}/{dataset}.log",
    params:
        # the seed picks the questions only under a limit
        **JOBS.eval_set_params(),
        code=code_of("export_eval_set"),
    script:
        "../scripts/export_eval_set.py"
