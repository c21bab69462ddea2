"""Two runs of one checkout side by side: `--configfile config/config.yaml config/authors.yaml`
plans the paper DAG in results/runs/authors/ (its own results/, logs/, .snakemake/), reading the
downloads, the index and the data stages of the default run; its comparison with the default run
reads the default run's evaluations and builds none of them."""

from __future__ import annotations

AUTHORS = ("--configfile", "config/config.yaml", "config/authors.yaml")
SHARED = "../../../"


def test_the_authors_run_plans_the_paper_dag_in_its_own_root(smk):
    jobs = smk.dry_run_jobs("results/qwen3_8b/f1.tsv", *AUTHORS)
    (aggregate,) = [j for j in jobs if j.rule == "aggregate_results"]
    assert aggregate.fields["output"].split(", ")[0] == "results/qwen3_8b/f1.tsv"  # in the run's root
    (index,) = [j for j in jobs if j.rule == "build_bm25_index"]
    assert index.fields["output"].startswith(f"{SHARED}results/paper/index/bm25")  # the default run's
    shared = {"download_dump", "download_dataset", "download_model", "build_bm25_index", "normalize_dataset",
              "mix_training_set", "export_eval_set", "build_evidence"}  # fmt: skip
    for job in jobs:
        outputs = job.fields["output"].split(", ")
        assert all(o.startswith(SHARED) == (job.rule in shared) for o in outputs), (job.rule, outputs)
    evaluation = next(j for j in jobs if j.rule == "evaluate_policy" and j.wildcards["method"] == "spader")
    inputs = evaluation.fields["input"].split(", ")
    assert f"{SHARED}results/paper/data/eval/{evaluation.wildcards['dataset']}.jsonl" in inputs
    assert "results/qwen3_8b/models/spader" in inputs
    (export,) = [j for j in jobs if j.rule == "export_rl_dataset"]  # the prompt differs: its own
    assert export.fields["output"].startswith("results/paper/data/verl/")
    assert (smk.repo / "results" / "runs" / "authors" / ".snakemake").is_dir()


def test_the_comparison_reads_the_default_runs_evaluations(smk, tmp_path):
    snakefile = str(smk.repo / "workflow" / "Snakefile")
    overlay = (
        "--configfile",
        str(smk.repo / "config" / "demo.yaml"),
        str(smk.repo / "config" / "authors.yaml"),
    )
    target = "results/demo/versus_default.tsv"
    proc = smk.run("-s", snakefile, "-d", str(tmp_path), "-n", "--nolock", target, *overlay, check=False)
    assert proc.returncode != 0
    assert f"{SHARED}results/demo/eval/rag/qampari.json" in proc.stdout + proc.stderr  # never built here
    assert (tmp_path / "results" / "runs" / "authors").is_dir()  # `-d` still gets the run's own root
    # the default run has no such rule
    proc = smk.run("-s", snakefile, "-d", str(tmp_path), "-n", "--nolock", target, "--configfile",
                   str(smk.repo / "config" / "demo.yaml"), check=False)  # fmt: skip
    assert proc.returncode != 0 and "MissingRuleException" in proc.stdout + proc.stderr


def test_the_default_config_stays_the_paper_and_the_profile_turns_the_options_on(smk):
    from spader.config import load_config
    from spader.config.model import AgentConfig, DivergencesConfig, EvaluationConfig

    paper = load_config(smk.repo / "config" / "config.yaml")
    assert paper.run is None and paper.agent == AgentConfig()
    assert paper.training.divergences == DivergencesConfig() and paper.training.shuffle
    assert paper.evaluation.loop == EvaluationConfig().loop == "spader"
    assert {v.invalid_format_reward for v in paper.variants.values()} == {-1.0}
    authors = load_config(smk.repo / "config" / "config.yaml", smk.repo / "config" / "authors.yaml")
    assert (
        authors.run == "authors" and authors.agent.stop == [] and authors.agent.max_queries_per_call is None
    )
    assert (authors.agent.parser, authors.agent.observation_format, authors.evaluation.loop) == (
        "authors",
    ) * 3
    assert authors.training.divergences.aliases == "blind" and not authors.training.shuffle
    # per variant: SPADER's reward manager (and its ablations) 0, their GRPO -1
    assert authors.variants["spader"].invalid_format_reward == 0.0
    assert authors.variants["grpo"].invalid_format_reward == -1.0


def test_the_demos_authors_run_warm_starts_its_own_policy_and_shares_the_data(smk):
    """The README's second demo command: the authors' prompt and turn settings feed the demo's warm
    start, so the run warm-starts its own policy (and evaluates from it); the downloads, index,
    data stages and tiny models stay the default run's (spader.infra.named_runs)."""
    overlay = ("--configfile", "config/demo.yaml", "config/authors.yaml", "config/demo_authors.yaml")
    proc = smk.run("-n", "--forceall", "--nolock", "results/demo/f1.tsv", *overlay)
    jobs = smk.parse_jobs(proc.stdout + proc.stderr)
    shared = {"download_dump", "download_dataset", "build_bm25_index", "normalize_dataset", "mix_training_set",
              "export_eval_set", "build_tiny_model"}  # fmt: skip
    assert {j.rule for j in jobs} >= shared | {"warmstart_policy"}
    for job in jobs:
        outputs = job.fields["output"].split(", ")
        assert all(o.startswith(SHARED) == (job.rule in shared) for o in outputs), (job.rule, outputs)
    evaluation = next(j for j in jobs if j.rule == "evaluate_policy")
    assert "results/demo/warmstart/model" in evaluation.fields["input"].split(", ")  # its own
    assert "named run 'authors' builds its own warmstart_policy (agent." in proc.stdout + proc.stderr
