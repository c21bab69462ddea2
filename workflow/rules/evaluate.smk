# Evaluation: every method (trained variants and prompting baselines) on every dataset, then the
# paper's tables (with bootstrap intervals and paired tests against spader), plots, the training
# runs' learning curves and report. An unchanged checkpoint on an unchanged set is not
# re-evaluated: the model, index and set are inputs, everything that changes a score is a param.
# An evaluation that exists is replaced only on purpose (spader.infra.replace_guard, the onstart hook).


rule evaluate_policy:
    input:
        records=expand(stage("export_eval_set", "results/{suite}/data/eval/{{dataset}}.jsonl"), suite=SUITE),
        index=JOBS.index(),
        model=JOBS.policy_model,
        reranker=JOBS.reranker,
    output:
        records="results/{backbone}/eval/{method}/{dataset}.jsonl",
        summary="results/{backbone}/eval/{method}/{dataset}.json",
    log:
        job="logs/evaluate_policy/{backbone}/{method}/{dataset}.log",
        service="logs/evaluate_policy/{backbone}/{method}/{dataset}.service.log",
    benchmark:
        "results/benchmarks/evaluate_policy/{backbone}/{method}/{dataset}.tsv"
    threads: lambda wc: gpu_job_threads() if CONFIG.evaluation.gpus > 0 else CONFIG.evaluation.cpu_threads
    resources:
        gpu=CONFIG.evaluation.gpus,
        cpus_per_task=JOBS.gpu_job_cpus(CONFIG.evaluation.gpus),
        mem_mb=32000,
        runtime=720,
    params:
        method=lambda wc: wc.method,
        evaluation=JOBS.evaluation_params,
        agent=JOBS.agent_params(),
        prompt=JOBS.prompt,
        retrieval=JOBS.retrieval_params("evaluate_policy"),
        code=code_of("evaluate_policy"),
    script:
        "../scripts/evaluate_policy.py"


rule aggregate_results:
    input:
        summaries=lambda wc: JOBS.evaluations(wc.backbone, ["json"]),
        records=lambda wc: JOBS.evaluations(wc.backbone, ["jsonl"]),
        # the training runs' final.json: their per-step metrics make the learning curves
        finals=lambda wc: expand(
            "results/{backbone}/train/{variant}/final.json",
            backbone=wc.backbone,
            variant=JOBS.trained_runs_of(wc.backbone),
        ),
        # which questions share a topic (evaluation.topics): the unit of the avg rows
        topics=JOBS.topics_file(),
    output:
        f1=report(
            "results/{backbone}/f1.tsv",
            caption="../report/f1.rst",
            category="Results",
            labels={"backbone": "{backbone}", "table": "F1"},
        ),
        prf=report(
            "results/{backbone}/prf.tsv",
            caption="../report/prf.rst",
            category="Results",
            labels={"backbone": "{backbone}", "table": "P/R/F1"},
        ),
        significance=report(
            "results/{backbone}/significance.tsv",
            caption="../report/significance.rst",
            category="Results",
            labels={"backbone": "{backbone}", "table": "significance"},
        ),
        f1_ci=report(
            "results/{backbone}/f1_ci.tsv",
            caption="../report/f1_ci.rst",
            category="Results",
            labels={"backbone": "{backbone}", "table": "F1 with intervals"},
        ),
        f1_plot=report(
            "results/{backbone}/f1.png",
            caption="../report/f1_ci.rst",
            category="Plots",
            labels={"backbone": "{backbone}", "figure": "F1 with intervals"},
        ),
        curves=report(
            "results/{backbone}/learning_curves.tsv",
            caption="../report/learning_curves.rst",
            category="Training",
            labels={"backbone": "{backbone}", "table": "learning curves"},
        ),
        curves_plot=report(
            "results/{backbone}/learning_curves.png",
            caption="../report/learning_curves.rst",
            category="Training",
            labels={"backbone": "{backbone}", "figure": "learning curves"},
        ),
        ablation=report(
            "results/{backbone}/ablation.tsv",
            caption="../report/ablation.rst",
            category="Analyses",
            labels={"backbone": "{backbone}", "table": "ablation"},
        ),
        beta_sweep=report(
            "results/{backbone}/beta_sweep.tsv",
            caption="../report/beta_sweep.rst",
            category="Analyses",
            labels={"backbone": "{backbone}", "table": "beta sweep"},
        ),
        efficiency=report(
            "results/{backbone}/efficiency.tsv",
            caption="../report/efficiency.rst",
            category="Analyses",
            labels={"backbone": "{backbone}", "table": "search efficiency"},
        ),
        temporal=report(
            "results/{backbone}/temporal.tsv",
            caption="../report/temporal.rst",
            category="Analyses",
            labels={"backbone": "{backbone}", "table": "temporal dynamics"},
        ),
        efficiency_plot=report(
            "results/{backbone}/efficiency.png",
            caption="../report/efficiency.rst",
            category="Plots",
            labels={"backbone": "{backbone}", "figure": "search efficiency"},
        ),
        runs=report(
            "results/{backbone}/runs.tsv",
            caption="../report/runs.rst",
            category="Results",
            labels={"backbone": "{backbone}", "table": "training runs"},
        ),
        temporal_plot=report(
            "results/{backbone}/temporal.png",
            caption="../report/temporal.rst",
            category="Plots",
            labels={"backbone": "{backbone}", "figure": "temporal dynamics"},
        ),
    log:
        "logs/aggregate_results/{backbone}.log",
    params:
        methods=lambda wc: JOBS.methods_of(wc.backbone),
        variants=JOBS.table_variants(),
        datasets=list(DATASETS),
        shared_runs=lambda wc: canonical(JOBS.shared_runs_of(wc.backbone)),
        uncertainty=canonical(JOBS.uncertainty()),
        tiny_model=lambda wc: CONFIG.backbones[wc.backbone].model.startswith("tiny:"),
        code=code_of("aggregate_results"),
    script:
        "../scripts/aggregate_results.py"


# A named run (config key `run`) against the default run of the same checkout: every method of the
# backbone on every dataset, paired by question, with the intervals and tests of the other tables
# (spader.evaluation.compare). The default run's evaluations are its own outputs, made by a run
# with the default config; this run only reads them.
if CONFIG.run is not None:

    rule compare_runs:
        input:
            default=lambda wc: JOBS.default_run_evaluations(wc.backbone),
            summaries=lambda wc: JOBS.evaluations(wc.backbone),
            topics=JOBS.topics_file(),
        output:
            table=report(
                "results/{backbone}/versus_default.tsv",
                caption="../report/versus_default.rst",
                category="Results",
                labels={"backbone": "{backbone}", "table": "this run against the default run"},
            ),
        log:
            "logs/compare_runs/{backbone}.log",
        params:
            run=CONFIG.run,
            methods=lambda wc: JOBS.methods_of(wc.backbone),
            # the trained methods the authors' code does not train: the table says it assumes them
            assumed=lambda wc: JOBS.assumed_methods(wc.backbone),
            datasets=list(DATASETS),
            uncertainty=JOBS.uncertainty(),
            code=code_of("compare_runs"),
        script:
            "../scripts/compare_runs.py"
