"""The plan's time limits, time range and the DAG's disk: every training saves often enough that an
end of its allocation loses at most `training.max_work_lost_minutes` (and a time limit at most one
step when its step outlasts the warning window), the time model shows its named inputs and gives a
low and a high end, and the whole DAG's disk is added up and refused when it does not fit; the
launch saves at the planned cadence."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spader.planning import plan
from spader.planning.costs import SEARCH_RANGE, Search, TimeInputs, save_cadence, search_seconds

REPO = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, overlay: str | None = None) -> tuple[int, dict]:
    lines: list[str] = []
    argv = ["--root", str(REPO), "--json"]
    if overlay is not None:
        path = tmp_path / "overlay.yaml"
        path.write_text(overlay)
        argv += ["--configfile", str(path)]
    code = plan.main(argv, out=lines.append)
    return code, json.loads(lines[-1])


@pytest.fixture(scope="module")
def paper(tmp_path_factory) -> dict:
    code, result = _plan(tmp_path_factory.mktemp("paper"))
    assert code == 0, result["refused"]
    return result


def test_save_cadence_bounds_the_work_an_allocation_can_lose():
    # the step and its save fit the warning window (30 min): the stop saves the step in flight; an end
    # without it (a lost node) loses at most N steps and a save, N x 8 + 1 <= 60
    c = save_cadence(step_minutes=8.0, save_minutes=1.0, warning_s=1800, allocation_minutes=2400,
                     bound_minutes=60, save_freq=100)  # fmt: skip
    assert (c.save_every_steps, c.covered, c.stop_before_minutes, c.refused) == (7, True, 30.0, None)
    assert c.max_work_lost_minutes == 57.0
    capped = save_cadence(step_minutes=8.0, save_minutes=1.0, warning_s=1800, allocation_minutes=2400,
                          bound_minutes=60, save_freq=3)  # fmt: skip
    assert capped.save_every_steps == 3  # training.save_freq is the most steps between two saves
    # a step longer than the window: a save every step (even where the bound allows three) and a stop
    # a step and its save (and 10%) before the limit, so a time limit costs at most one step
    long = save_cadence(step_minutes=34.1, save_minutes=1.6, warning_s=1800, allocation_minutes=2880,
                        bound_minutes=120, save_freq=100)  # fmt: skip
    assert (long.save_every_steps, long.covered, long.refused) == (1, False, None)
    assert long.max_work_lost_minutes == pytest.approx(35.7)
    assert long.stop_before_minutes == pytest.approx(1.1 * 35.7) and long.stop_before_minutes > 30
    # one step and its save over the bound: refused, naming both figures and the key
    over = save_cadence(step_minutes=50.0, save_minutes=2.0, warning_s=1800, allocation_minutes=2880,
                        bound_minutes=45, save_freq=100)  # fmt: skip
    assert "a step takes up to 50.0 min and its save 2.0 min" in over.refused
    assert "over training.max_work_lost_minutes (45)" in over.refused
    # an allocation that holds no step: its start and the stop window fill it
    short = save_cadence(step_minutes=8.0, save_minutes=1.0, warning_s=1800, allocation_minutes=40,
                         bound_minutes=60, save_freq=100)  # fmt: skip
    assert "an allocation of 40 min (training.time_limit.hours) holds no step" in short.refused


def test_every_paper_training_saves_within_the_bound(paper):
    """`spader plan --json` on the paper config: every training has its cadence and the work an end
    of its allocation can lose, within training.max_work_lost_minutes (60); R3-RAG, whose step
    outlasts the 30-minute warning window, saves every step and stops earlier."""
    trainings = {j["job"]: j for j in paper["jobs"] if j["job"].startswith("train ")}
    assert len(trainings) == 17 and paper["refused"] is None and paper["fits"]
    for name, job in trainings.items():
        assert job["save_every_steps"] >= 1 and 0 < job["max_work_lost_minutes"] <= 60.0, name
        cadence = job["cadence"]
        expected = job["save_every_steps"] * cadence["step_minutes_high"] + cadence["save_minutes"]
        assert job["max_work_lost_minutes"] == pytest.approx(expected, abs=0.1), name
        assert cadence["step_minutes_high"] == job["step_minutes_range"][1], name
    r3rag, spader = trainings["train qwen3_8b/r3rag"], trainings["train qwen3_8b/spader"]
    assert r3rag["cadence"]["step_minutes_high"] + r3rag["cadence"]["save_minutes"] > 30
    assert r3rag["save_every_steps"] == 1 and not r3rag["cadence"]["warning_covers_step_and_save"]
    assert r3rag["cadence"]["stop_before_minutes"] > 30
    assert spader["save_every_steps"] > 1 and spader["cadence"]["warning_covers_step_and_save"]


def test_the_time_model_shows_its_inputs_and_a_range(paper):
    for job in (j for j in paper["jobs"] if j["job"].startswith("train ")):
        low, high = job["step_minutes_range"]
        assert low == job["step_minutes"] < high, job["job"]
        assert job["run_hours_range"][0] == job["run_hours"] < job["run_hours_range"][1]
        inputs = job["assumptions"]
        assert (inputs["low"]["mfu"], inputs["high"]["mfu"]) == (0.4, 0.3)
        assert (inputs["low"]["length_share"], inputs["high"]["length_share"]) == (0.5, 0.65)
        for end in ("low", "high"):
            kv = inputs[end]
            assert kv["kv_demand_over_pool"] == pytest.approx(
                kv["kv_demand_tokens_per_replica"] / kv["kv_pool_tokens_per_replica"], abs=0.01
            )
        assert inputs["low"]["search_seconds_per_turn"] < inputs["high"]["search_seconds_per_turn"]
        assert inputs["search"]["reranker_replicas"] == 8 and inputs["search"]["pairs_per_query"] == 50
    dag = paper["dag"]
    assert dag["gpu_hours_range"][0] == dag["gpu_hours"] < dag["gpu_hours_range"][1]


def test_the_search_wait_is_the_retrieval_benchmarks_projection():
    """bench/retrieval.py projects 4.4-19.9 s of reranking per paper-size step on 8 A100 replicas
    (2,048-4,608 queries at 50%-0% repeats, 50 pairs each); the plan's search inputs give the same."""
    from spader.config.model import HardwareConfig
    from spader.planning.costs import GPUS

    hw, spec = HardwareConfig(gpu="A100-80GB"), GPUS["A100-80GB"]
    assert spec.rerank_pairs_per_s == pytest.approx(1444, abs=2)  # bench: 1,444 pairs/s (estimate)
    search = Search(replicas=8, pairs_per_query=50)
    per_step = {
        end: SEARCH_RANGE["searching_turns"][i] * search_seconds(search, TimeInputs.of(hw, end), trajectories=512,
                                                                 spec=spec)
        for i, end in enumerate(("low", "high"))
    }  # fmt: skip
    assert per_step["low"] == pytest.approx(4.4, abs=0.1) and per_step["high"] == pytest.approx(19.9, abs=0.1)
    assert search_seconds(Search(0, 50), TimeInputs.of(hw), trajectories=512, spec=spec) == 0.0


def test_the_high_end_scales_the_passes_by_the_mfu_and_prefills_the_retracted_sequences():
    from spader.config.model import HardwareConfig
    from spader.planning.costs import GPUS, Lengths, rollout_seconds

    shape = plan.load_shape("Qwen/Qwen3-8B")
    hw = HardwareConfig(mfu=0.4, mfu_low=0.25, length_share=0.5, length_share_high=0.5)
    low, high = TimeInputs.of(hw, "low"), TimeInputs.of(hw, "high")
    lengths = Lengths.from_share(8704, 0.5)
    kwargs = dict(
        trajectories=512, replicas=4, tp=2, lengths=lengths, spec=GPUS[hw.gpu], hardware=hw, max_turns=16
    )
    roomy = {
        e: rollout_seconds(shape, kv_tokens=10**7, inputs=i, **kwargs)
        for e, i in (("low", low), ("high", high))
    }
    assert roomy["high"]["prefill"] / roomy["low"]["prefill"] == pytest.approx(0.4 / 0.25)
    assert "retracted prefill" not in roomy["high"]  # the pool holds every sequence
    # a pool of half the demand: the high end prefills the retracted half again, at half its length
    demand = 512 / 4 * lengths.mean
    tight = rollout_seconds(shape, kv_tokens=int(demand / 2), inputs=high, **kwargs)
    assert tight["retracted prefill"] == pytest.approx(0.5 * roomy["high"]["prefill"] / 0.75 / 2, rel=1e-3)
    assert "retracted prefill" not in rollout_seconds(shape, kv_tokens=int(demand / 2), inputs=low, **kwargs)
    # a high end set better than the low end counts as the low end's
    assert TimeInputs.of(HardwareConfig(mfu=0.3, mfu_low=0.5), "high").mfu == 0.3


def test_a_disk_too_small_for_the_dag_is_refused_naming_its_total(tmp_path, paper):
    dag = paper["dag"]
    keepers = dag["disk_keepers"]
    assert dag["disk_gib"] == pytest.approx(
        sum(keepers.values()) + dag["disk_running_gib"] + dag["disk_awaiting_export_gib"], abs=0.5
    )
    # what every job keeps: the trainings' final checkpoints and exports, the models, the index, the dump
    assert (
        "BM25 index" in keepers and "corpus dump" in keepers and "model Qwen/Qwen2.5-14B-Instruct" in keepers
    )
    r3rag = next(j for j in paper["jobs"] if j["job"] == "train qwen3_8b/r3rag")
    assert keepers["qwen3_8b/r3rag (final checkpoint and export)"] < r3rag["disk_gib"]  # the retention rule
    assert 1000 < dag["disk_gib"] < 6000 and dag["disk_refused"] is None

    code, result = _plan(tmp_path, "hardware:\n  disk_gib: 1000\n")
    assert code == 1 and not result["fits"]
    assert all(j["fits"] for j in result["jobs"])  # each job alone fits in 1,000 GiB: only the DAG does not
    (refusal,) = result["refused"]
    assert refusal.startswith(f"the DAG: disk: the DAG needs {dag['disk_gib']:,.0f} GiB")
    assert "hardware.disk_gib is 1000" in refusal
    largest = list(keepers)[:3]
    assert all(k in refusal for k in largest)
    # keeping every checkpoint on purpose: the DAG keeps more
    code, kept = _plan(tmp_path, "training:\n  keep_checkpoints: true\n")
    assert kept["dag"]["disk_gib"] > dag["disk_gib"] + 1000 and kept["dag"]["disk_awaiting_export_gib"] == 0


def test_a_bound_below_one_step_refuses_the_run_naming_both(tmp_path):
    code, result = _plan(tmp_path, "training:\n  max_work_lost_minutes: 20\n")
    assert code == 1
    refused = {j["job"]: j["refused"] for j in result["jobs"] if j["refused"]}
    assert "train qwen3_8b/r3rag" in refused and "train qwen3_8b/spader" not in refused
    assert "time limit: a step takes up to" in refused["train qwen3_8b/r3rag"]
    assert "over training.max_work_lost_minutes (20)" in refused["train qwen3_8b/r3rag"]
    assert any(r.startswith("train qwen3_8b/r3rag: time limit:") for r in result["refused"])
    lines: list[str] = []
    path = tmp_path / "overlay.yaml"
    assert plan.main(["--root", str(REPO), "--configfile", str(path)], out=lines.append) == 1
    head = next(
        line for text in lines for line in text.splitlines() if line.startswith("train qwen3_8b/r3rag:")
    )
    assert head.endswith("REFUSED (time limit)") and "DOES NOT FIT" not in head  # its GPUs fit
    assert (
        lines[-1].startswith("the plan refuses: ") and "train qwen3_8b/r3rag: time limit: a step" in lines[-1]
    )


def test_the_launch_saves_at_the_planned_cadence(paper_config, gpu_training_job, tmp_path):
    """A GPU training plans itself on its composed launch and verl gets its cadence as
    trainer.save_freq; a CPU training (no plan) keeps training.save_freq."""
    from spader.training.launch import compose_config
    from spader.training.preflight import check_job_memory
    from spader.training.run import RunLink, plan_launch, planned_save_every

    job = gpu_training_job(paper_config, tmp_path)
    plan_ = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None))
    cfg = compose_config(plan_)
    assert cfg.trainer.save_freq == 100
    (planned,) = check_job_memory(job, cfg)
    assert planned.cadence is not None and planned.time  # the job's own time plan: 2 steps of 32 prompts
    every = planned_save_every([planned], cfg)
    assert every == planned.cadence.save_every_steps and 1 <= every < 100
    assert planned.cadence.max_work_lost_minutes <= job.training.max_work_lost_minutes
    saving = plan_launch(job, resume_from=None, metrics_file=tmp_path / "m.jsonl", link=RunLink(None, None),
                         save_every=every)  # fmt: skip
    assert compose_config(saving).trainer.save_freq == every
    assert [o for o in saving.overrides if o.startswith("trainer.save_freq=")] == [
        f"trainer.save_freq={every}"
    ]

    cpu = gpu_training_job(paper_config, tmp_path / "cpu", device="cpu")
    assert check_job_memory(cpu, cfg) == [] and planned_save_every([], cfg) is None
    assert math.isfinite(planned.cadence.stop_before_minutes)


def test_a_step_longer_than_the_warning_window_moves_the_stop_earlier():
    """R3-RAG's cadence: the job's time-left watch asks for the stop once the allocation has a step
    and its save (and 10%) left, not at the 30-minute warning, so the step in flight is saved."""
    from spader.training.run import stop_earlier
    from spader.training.stop import TimeLimitWatch

    asked: list[str] = []
    left = {"s": 2000.0}  # 33 minutes left: inside the step and save window (39 min), not yet the warning
    watch = TimeLimitWatch(1800, job_id="7", time_left=lambda job: left["s"], request=asked.append)
    long = save_cadence(step_minutes=34.1, save_minutes=1.6, warning_s=1800, allocation_minutes=2880,
                        bound_minutes=60, save_freq=100)  # fmt: skip
    short = save_cadence(step_minutes=8.0, save_minutes=1.0, warning_s=1800, allocation_minutes=2880,
                         bound_minutes=60, save_freq=100)  # fmt: skip
    assert not stop_earlier(watch, short, "t") and not watch.check() and asked == []
    assert stop_earlier(watch, long, "t") and watch.warning_s == pytest.approx(long.stop_before_minutes * 60)
    assert watch.check() and "2000 s left" in asked[0]
