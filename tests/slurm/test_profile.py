"""The SLURM profile, without SLURM: `snakemake -n --profile slurm` over the paper DAG, the
resources each job ends up with, and the sbatch line the pinned plugin (2.6.1) builds from them."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _parse_value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def _dry_run_jobs(target: str, *extra: str) -> dict[str, list[dict]]:
    """{rule: [resources of each job]} from the dry run's job listing (wildcards under `_wildcards`)."""
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "--profile", "slurm", target, *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs: dict[str, list[dict]] = defaultdict(list)
    rule = None
    wildcards = ""
    for line in proc.stdout.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):$", line)
        if m:
            rule, wildcards = m.group(1), ""
        elif rule and line.strip().startswith("wildcards:"):
            wildcards = line.split("wildcards:", 1)[1].strip()
        elif rule and line.strip().startswith("resources:"):
            items = line.split("resources:", 1)[1].split(", ")
            res = {k: _parse_value(v) for k, v in (i.split("=", 1) for i in items)}
            jobs[rule].append({**res, "_wildcards": wildcards})
            rule = None
    return jobs


PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "profile.yaml").read_text())


def test_profile_states_only_what_a_cluster_chooses():
    """Threads, memory and runtime come from the rules and the config's description of a node
    (hardware.*); the profile sets no threads, CPUs or memory, only what a cluster chooses
    (partition, account, GPU model, the partition's time limit) and the plugin's task layout."""
    assert "set-threads" not in PROFILE
    for rule, resources in PROFILE["set-resources"].items():
        assert not {"mem_mb", "runtime", "cpus_per_task", "threads"} & set(resources), rule
        assert set(resources) <= {
            "tasks_per_gpu",
            "max_runtime",
            "slurm_partition",
            "gpu_model",
            "slurm_extra",
        }, rule


@pytest.fixture(scope="module")
def paper_jobs():
    return _dry_run_jobs("results/qwen3_8b/f1.tsv")


def test_profile_is_found_as_typed():
    """`--profile NAME` searches ./NAME, so the repository root links slurm -> profiles/slurm."""
    assert (REPO / "slurm").resolve() == (REPO / "profiles" / "slurm").resolve()
    assert (REPO / "slurm" / "profile.yaml").is_file()


def test_paper_dag_dry_runs_with_the_profile(paper_jobs):
    assert len(paper_jobs["train_policy"]) == 10  # qwen3_8b: 10 trained variants
    assert len(paper_jobs["export_checkpoint"]) == 10
    assert len(paper_jobs["build_bm25_index"]) == 1
    assert paper_jobs["evaluate_policy"]


def _sbatch_args(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "_wildcards"}


def _estimate_minutes(variant: str) -> int:
    from spader.config import load_config

    return load_config(REPO / "config" / "config.yaml").training.time_limit.estimate_minutes(variant)


def _planned_requests(*configfiles: str) -> dict[str, tuple[int, int]]:
    """{variant: (threads, MB)} the plan gives qwen3_8b's training jobs (spader.planning.plan)."""
    from spader.config import load_config
    from spader.planning.plan import plan_config

    config = load_config(*(REPO / f for f in configfiles), verl_config_dir=REPO / "config" / "verl")
    jobs = plan_config(config, REPO / "config" / "verl", only=lambda b, v: b == "qwen3_8b")
    return {j.name.split("/")[1]: (j.threads, j.mem_mb) for j in jobs if j.name.startswith("train ")}


def test_training_asks_for_one_node_with_its_gpus_cores_and_planned_memory(paper_jobs, sbatch_line):
    """--cpus-per-task is the node's cores (hardware.cores: the job holds all hardware.gpus GPUs),
    --mem the host memory of the job's plan with headroom (spader plan)."""
    planned = _planned_requests("config/config.yaml")
    for res in paper_jobs["train_policy"]:
        variant = dict(kv.split("=") for kv in res["_wildcards"].split(", "))["variant"]
        assert res["gpu"] == 8  # backbones.qwen3_8b.gpus, from the rule
        assert res["nodes"] == 1
        assert res["tasks_per_gpu"] == 0
        assert (res["cpus_per_task"], res["mem_mb"]) == planned[variant] and planned[variant][0] == 64
        assert 150_000 < res["mem_mb"] < 480_000, variant  # the plan's need, not a node's whole memory
        assert "slurm_partition" not in res and "slurm_account" not in res  # set by users in the profile
    critic_free = next(r for r in paper_jobs["train_policy"] if "variant=spader" in r["_wildcards"])
    critic = next(r for r in paper_jobs["train_policy"] if "variant=ppo" in r["_wildcards"])
    assert critic["mem_mb"] > critic_free["mem_mb"]  # the critic's offloaded state waits in host memory
    # outside its allocation the job has no core count (threads 1): --cpus-per-task is the resource's
    line = sbatch_line(_sbatch_args(critic_free), threads=1)
    assert " --gpus=8" in line
    assert " --nodes=1" in line
    assert " --cpus-per-task=64" in line
    assert f" --mem {critic_free['mem_mb']}" in line
    assert "--gres" not in line
    # one task: the training command starts once (the plugin's issues/459 on GitHub)
    assert "--ntasks" not in line


def test_training_runtime_is_the_variants_estimate_capped_by_the_partition_limit(paper_jobs, sbatch_line):
    """training.time_limit.hours per variant, at most the profile's max_runtime for train_policy
    (the partition's limit); a longer training stops before the limit, warned by SIGURG, and the
    rule's retries resume it."""
    cap = PROFILE["set-resources"]["train_policy"]["max_runtime"]
    runtimes = {}
    for res in paper_jobs["train_policy"]:
        variant = dict(kv.split("=") for kv in res["_wildcards"].split(", "))["variant"]
        runtimes[variant] = res["runtime"]
        assert res["runtime"] == min(_estimate_minutes(variant), cap)
        assert res["slurm_extra"] == "--signal=URG@1800"  # training.time_limit.warning_s
    assert runtimes["spader"] == 2400 < cap  # asks for its estimate, not for the partition's limit
    assert runtimes["r3rag"] == cap  # 100 h estimated: capped; it spans allocations
    line = sbatch_line(_sbatch_args(paper_jobs["train_policy"][0]))
    assert " --signal=URG@1800" in line and re.search(r" -t \d+ ", line)


def test_training_is_retried_a_bounded_number_of_times_by_the_main_process_only():
    """The rule's retries come from training.time_limit.retries, and none inside a cluster job (the
    retry of a job stopped for its time limit belongs in a new allocation)."""
    rules = REPO / "workflow" / "rules"
    rule = (rules / "train.smk").read_text().split("rule train_policy:", 1)[1].split("\nrule ", 1)[0]
    assert "retries: TRAINING.retries(workflow.remote_exec)" in rule
    from spader.config import load_config
    from spader.dag import Jobs, TrainingResources

    config = load_config(REPO / "config" / "config.yaml")
    training = TrainingResources(Jobs(config, REPO, REPO / "config" / "verl"))
    assert training.retries(remote_exec=False) == config.training.time_limit.retries > 0
    assert training.retries(remote_exec=True) == 0


#: Two smaller nodes: fewer cores, less host memory (the overlay of the two-node dry run).
SMALL_NODES = "training:\n  nodes: 2\nhardware:\n  cores: 48\n  host_memory_gib: 150\n"


@pytest.fixture(scope="module")
def two_node_jobs(tmp_path_factory):
    overlay = tmp_path_factory.mktemp("nodes") / "nodes.yaml"
    overlay.write_text(SMALL_NODES)
    return _dry_run_jobs(
        "results/qwen3_8b/f1.tsv", "--configfile", "config/config.yaml", str(overlay)
    ), overlay


def test_with_two_nodes_every_training_job_asks_for_two_nodes(two_node_jobs, sbatch_line):
    """training.nodes: 2 under the SLURM profile: each training job asks for 2 nodes with the
    backbone's GPUs on each (--gres per node; --gpus would count the whole job)."""
    jobs, _ = two_node_jobs
    assert len(jobs["train_policy"]) == 10
    for res in jobs["train_policy"]:
        assert res["nodes"] == 2 and res["gres"] == "gpu:8" and res["gpu"] == 0
        line = sbatch_line(_sbatch_args(res))
        assert " --nodes=2" in line and " --gres=gpu:8" in line and "--gpus" not in line
        assert "--ntasks" not in line
    for res in jobs["evaluate_policy"]:
        assert "nodes" not in res or res["nodes"] == 1


@pytest.fixture(scope="module")
def judge_node_jobs(tmp_path_factory):
    overlay = tmp_path_factory.mktemp("judge") / "judge.yaml"
    overlay.write_text("variants:\n  r3rag:\n    nodes: 2\n")
    return _dry_run_jobs("results/qwen3_8b/f1.tsv", "--configfile", "config/config.yaml", str(overlay))


def _variant(res: dict) -> str:
    return dict(kv.split("=") for kv in res["_wildcards"].split(", "))["variant"]


def test_r3rag_alone_takes_a_second_node_for_its_judge(judge_node_jobs, sbatch_line):
    """variants.r3rag.nodes: 2 under the SLURM profile: R3-RAG's training job asks for 2 nodes with
    the backbone's GPUs on each (--gres per node; --gpus would count the whole job), its judge
    served on the second; the other nine stay on one node (training.nodes, the default)."""
    jobs = {_variant(res): res for res in judge_node_jobs["train_policy"]}
    assert len(jobs) == 10
    r3rag = jobs.pop("r3rag")
    assert r3rag["nodes"] == 2 and r3rag["gres"] == "gpu:8" and r3rag["gpu"] == 0
    line = sbatch_line(_sbatch_args(r3rag))
    assert " --nodes=2" in line and " --gres=gpu:8" in line and "--gpus" not in line
    assert "--ntasks" not in line
    for variant, res in jobs.items():
        assert res["nodes"] == 1 and res["gpu"] == 8 and not res["gres"], variant
        line = sbatch_line(_sbatch_args(res))
        assert " --nodes=1" in line and " --gpus=8" in line and "--gres" not in line, variant
    for res in judge_node_jobs["evaluate_policy"]:
        assert "nodes" not in res or res["nodes"] == 1


def _allocation_steps(res: dict, *configfiles: str) -> dict[str, list[str]]:
    """The steps the training job of ``res`` (a dry run's resources) starts inside its allocation,
    as the job builds them from what its rule asked for (its threads are the CPUs SLURM gave it)."""
    from spader.config import load_config
    from spader.training.ray_cluster import allocation_steps
    from spader.training.run import TrainJob

    config = load_config(*(REPO / f for f in configfiles), verl_config_dir=REPO / "config" / "verl")
    wildcards = dict(kv.split("=") for kv in res["_wildcards"].split(", "))
    backbone, variant = wildcards["backbone"], wildcards["variant"]
    job = TrainJob(
        backbone=backbone, variant=variant, backbone_spec=config.backbones[backbone],
        variant_spec=config.variants[variant], training=config.training, retrieval=config.retrieval,
        train_file=Path("t"), val_file=Path("v"), index_dir=Path("i"), model_dir=Path("m"),
        verl_config_dir=REPO / "config" / "verl", workdir=Path("w"), final_json=Path("f"),
        judge=config.judge, stepsearch=config.stepsearch, evidence=Path("e"),
        threads=res["cpus_per_task"], mem_mb=res["mem_mb"],
    )  # fmt: skip
    return allocation_steps(job, [f"node{i}" for i in range(res["nodes"])])


def test_every_step_inside_a_training_allocation_asks_for_its_cpus_memory_and_gpus(two_node_jobs):
    """A cluster that confines steps (task/cgroup) gives a step only what it asks for: each node's
    retrieval replica, the second node's Ray worker and the judge's node ask for the job's CPUs and
    memory on their node (what the dry run's request gives the job) and their GPUs (the judge's:
    test_a_judge_node_step_asks_for_the_judges_gpus)."""
    jobs, overlay = two_node_jobs
    cases = [(res, ("config/config.yaml", str(overlay))) for res in jobs["train_policy"]]
    seen = set()
    for res, files in cases:
        steps = _allocation_steps(res, *files)
        for name, argv in steps.items():
            seen.add(name.split(" on ")[0])
            cpus, mem = f"--cpus-per-task={res['cpus_per_task']}", f"--mem={res['mem_mb']}M"
            assert argv[0] == "srun" and "--overlap" in argv and cpus in argv and mem in argv, (name, argv)
        if "Ray worker on node1" in steps:  # not r3rag's: its second node serves the judge
            assert [a for a in steps["Ray worker on node1"] if a.startswith("--gres")] == ["--gres=gpu:8"]
        assert not any(a.startswith("--gres") for a in steps["retrieval replica on node0"])
    assert seen == {"retrieval replica", "Ray worker", "judge"}


def test_a_cpu_trainings_ray_worker_step_asks_for_no_gpus():
    """On a CPU the Ray nodes count the CPU workers as GPU slots; the worker's step asks SLURM for no
    GPUs (a step asking for GPUs the job does not hold is refused: tests/slurm/test_confined_steps.py)."""
    from spader.training.ray_cluster import allocation_steps

    def job(device: str) -> SimpleNamespace:
        scorer = SimpleNamespace(judge_gpus=0)
        return SimpleNamespace(device=device, workers=2, train_nodes=2, judge_node=False, scorer=scorer,
                               threads=2, mem_mb=8000)  # fmt: skip

    gres = {
        d: [a for a in allocation_steps(job(d), ["a", "b"])["Ray worker on b"] if "gres" in a]
        for d in ("cpu", "cuda")
    }
    assert gres == {"cpu": [], "cuda": ["--gres=gpu:2"]}


def test_a_judge_node_step_asks_for_the_judges_gpus(judge_node_jobs, tmp_path):
    """R3-RAG on two nodes: verl trains on the first, the judge is served on the second by a step
    asking for the job's CPUs and memory there and the judge's GPUs."""
    from spader.config import resolved_config

    r3rag = next(r for r in judge_node_jobs["train_policy"] if "variant=r3rag" in r["_wildcards"])
    overlay = tmp_path / "judge.yaml"
    overlay.write_text("variants:\n  r3rag:\n    nodes: 2\n")
    steps = _allocation_steps(r3rag, "config/config.yaml", str(overlay))
    assert set(steps) == {"retrieval replica on node0", "judge on node1"}  # verl trains on node0 alone
    judge = steps["judge on node1"]
    assert f"--cpus-per-task={r3rag['cpus_per_task']}" in judge and f"--mem={r3rag['mem_mb']}M" in judge
    gpus = resolved_config(REPO / "config" / "config.yaml")["judge"]["gpus"]
    assert [a for a in judge if a.startswith("--gres")] == [f"--gres=gpu:{gpus}"], judge


def test_a_smaller_node_described_in_the_config_changes_the_requests(two_node_jobs, sbatch_line):
    """hardware.cores and hardware.host_memory_gib describe the node: the training jobs ask for its
    cores and, per node, the plan's host memory (the reference model and optimizer shards split
    over the nodes) capped by the node's; evaluation asks for its GPU's share of the cores."""
    jobs, overlay = two_node_jobs
    planned = _planned_requests("config/config.yaml", str(overlay))
    for res in jobs["train_policy"]:
        variant = dict(kv.split("=") for kv in res["_wildcards"].split(", "))["variant"]
        assert (res["cpus_per_task"], res["mem_mb"]) == planned[variant] and res["cpus_per_task"] == 48
        assert res["mem_mb"] <= 150 * 1024
        assert " --cpus-per-task=48" in sbatch_line(_sbatch_args(res))
    capped = [r for r in jobs["train_policy"] if r["mem_mb"] == 150 * 1024]
    assert capped, "a critic variant's plan needs more than 150 GiB with headroom: capped at the node's"
    for res in jobs["evaluate_policy"]:
        assert res["cpus_per_task"] == 48 // 8  # one of the node's 8 GPUs (hardware.gpus)


def test_without_tasks_per_gpu_the_plugin_would_start_one_task_per_gpu(paper_jobs, sbatch_line):
    """Why the profile sets tasks_per_gpu: 0: 2.6.1's default for a GPU job."""
    res = {k: v for k, v in _sbatch_args(paper_jobs["train_policy"][0]).items() if k != "tasks_per_gpu"}
    assert "--ntasks-per-gpu=1" in sbatch_line(res)


def test_indexing_asks_for_many_cpus(paper_jobs, sbatch_line):
    (res,) = paper_jobs["build_bm25_index"]
    assert res["mem_mb"] == 32000 and "gpu" not in res  # the rule's, not restated by the profile
    line = sbatch_line(res, threads=16)  # the rule's threads
    assert " --cpus-per-task=16" in line and " --ntasks=1" in line and "--gpus" not in line


def test_evaluation_asks_for_one_gpu_and_one_task(paper_jobs, sbatch_line):
    for res in paper_jobs["evaluate_policy"]:
        assert res["gpu"] == 1 and res["tasks_per_gpu"] == 0 and res["cpus_per_task"] == 8
    line = sbatch_line(paper_jobs["evaluate_policy"][0])
    assert " --gpus=1" in line and "--ntasks" not in line and " --cpus-per-task=8" in line


def test_evidence_asks_for_one_gpu_and_one_task(paper_jobs, sbatch_line):
    """StepSearch's evidence reranks every gold entity's search on one GPU (stepsearch.evidence.gpus)."""
    (res,) = paper_jobs["build_evidence"]
    assert res["gpu"] == 1 and res["tasks_per_gpu"] == 0
    assert res["cpus_per_task"] == 64 // 8  # one GPU of a node of hardware.gpus with hardware.cores
    line = sbatch_line(res)
    assert " --gpus=1" in line and "--ntasks" not in line and " --cpus-per-task=8" in line


def test_everything_else_is_small(paper_jobs, sbatch_line):
    big = {"train_policy", "export_checkpoint", "build_bm25_index", "evaluate_policy", "build_evidence"}
    small = {rule: jobs for rule, jobs in paper_jobs.items() if rule not in big}
    assert {"download_dump", "normalize_dataset", "mix_training_set", "aggregate_results"} <= set(small)
    for rule, jobs in small.items():
        for res in jobs:
            assert "gpu" not in res, rule
            assert res["mem_mb"] <= 16000, rule
            assert res.get("cpus_per_task", 1) <= 4, rule
            line = sbatch_line(res)
            assert "--gpus" not in line and " --ntasks=1" in line, rule


def test_two_nodes_without_a_cluster_executor_are_refused_before_any_job(tmp_path):
    """Only a cluster executor gives a job several nodes: a run on this machine stops in its onstart
    hook, before any job runs, naming the key."""
    import shutil

    for name in ("workflow", "config"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "resources" / "demo", tmp_path / "resources" / "demo")
    (tmp_path / "nodes.yaml").write_text("training:\n  nodes: 2\n")
    proc = subprocess.run(
        [*SNAKEMAKE, "--cores", "1", "results/demo/f1.tsv", "--configfile", "config/demo.yaml", "nodes.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config key 'training.nodes' is 2, but this run executes jobs on this machine" in out, out[-3000:]
    assert not (tmp_path / "results").exists()  # no job ran


def test_a_training_longer_than_its_retries_allocations_is_refused_naming_both(tmp_path):
    """Under the profile's partition limit (max_runtime), a training whose planned run exceeds its
    retries' allocations even at the low end of its time range stops the dry run, naming its run
    time and the allocations; the high end beyond them is warned (R3-RAG under the paper config)."""
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "--profile", "slurm", "results/qwen3_8b/f1.tsv"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"train qwen3_8b/r3rag: the high end of its planned run \(\d+ h\) exceeds what 6 allocations "
                     r"of 48\.0 h .*max_runtime 2880 min", proc.stdout + proc.stderr)  # fmt: skip
    overlay = tmp_path / "retries.yaml"
    overlay.write_text("training:\n  time_limit:\n    retries: 1\n")
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "--profile", "slurm", "results/qwen3_8b/f1.tsv", "--configfile", "config/config.yaml",
         str(overlay)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert re.search(
        r"train qwen3_8b/r3rag: its planned run takes \d+-\d+ h but 2 allocations of 48\.0 h \(training\.time_limit"
        r"\.hours of r3rag, capped by the profile's max_runtime 2880 min; training\.time_limit\.retries 1 \+ 1\) "
        r"give it 96 h: raise training\.time_limit\.retries to at least \d",
        out,
    ), out[-3000:]
