"""bench/method_learning.py's report, on FAKE per-step metrics written where the bench keeps a
seed's results (no training: the numbers below are made up to exercise the report, and say nothing
about SPADER). The bench reads them as an earlier sitting's results and never builds the world."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

from method_runs import TRAJECTORIES, terminal  # noqa: E402

from spader.core.rewards import terminal_reward  # noqa: E402


def _fake_step(entities: float, f1: float, valid: float, score: float) -> dict:
    """FAKE metrics of one training step, under the names verl's logger and the trainer use."""
    return {
        "episode/entities": entities,
        "episode/f1": f1,
        "episode/format_valid": valid,
        "episode/failed": 0.0,
        "critic/score/mean": score,
    }


def _fake_seed(spader_entities: float) -> dict:
    """FAKE results of one seed: SPADER finds more entities and earns more total reward (step rewards
    included) than GRPO, while its answers get worse; the control stays where it started."""
    start = _fake_step(2.0, 0.40, 0.90, 0.30)
    return {
        "spader": {1: start, 2: start, 3: _fake_step(2.0 + spader_entities, 0.30, 0.70, 0.80),
                   4: _fake_step(2.0 + spader_entities, 0.30, 0.70, 0.80)},
        "control": {s: start for s in range(1, 5)},
        "grpo": {1: start, 2: start, 3: _fake_step(2.5, 0.45, 0.95, 0.40), 4: _fake_step(2.5, 0.45, 0.95, 0.40)},
    }  # fmt: skip


@pytest.fixture
def bench(monkeypatch):
    stub = types.ModuleType("spread_world")

    def build_world(*args, **kwargs):
        raise AssertionError("the report must not build the world when every seed's results exist")

    stub.build_world = build_world
    monkeypatch.setitem(sys.modules, "spread_world", stub)
    spec = importlib.util.spec_from_file_location(
        "bench_method_learning", REPO / "bench" / "method_learning.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    spec.loader.exec_module(module)
    return module


def test_the_report_gives_answers_beside_entities_and_compares_like_with_like(bench, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for seed, gain in ((900, 1.2), (901, 0.5)):  # FAKE: +1.2 clears the 0.8 margin, +0.5 does not
        (out / f"seed-{seed}-steps-4.json").write_text(json.dumps(_fake_seed(gain)))
    status = bench.main(
        ["--seeds", "2", "--seed-offset", "900", "--out", str(out), "--records", str(tmp_path)]
    )
    assert status == 0
    (record,) = tmp_path.glob("*-method_learning.yaml")
    rec = yaml.safe_load(record.read_text())
    table = {row[0]: float(row[1]) for row in rec["tables"]["seeds-900-901"]["rows"]}  # key: mean
    for arm in ("spader", "control", "grpo"):  # every arm: entities, answer F1, valid formats
        assert {f"{arm} rise {q}" for q in ("entities", "f1", "format_valid", "terminal")} <= set(table)
    assert "spader rise reward" in table and "control rise reward" in table
    assert "grpo rise reward" not in table  # GRPO's own reward is terminal-only: not beside SPADER's
    assert "spader - grpo reward" not in table and "spader - control reward" in table
    # like with like: SPADER's step-plus-terminal reward rose by 0.5, but its terminal reward fell
    assert table["spader rise reward"] == pytest.approx(0.5, abs=1e-3)
    assert table["spader - grpo terminal"] == pytest.approx((0.30 - 0.30) - (0.45 - 0.05), abs=1e-3)
    assert table["spader - grpo f1"] == pytest.approx(-0.15, abs=1e-3)
    assert table["spader - grpo format_valid"] == pytest.approx(-0.25, abs=1e-3)
    assert table["spader - control entities"] == pytest.approx(0.85, abs=1e-3)
    (verdict,) = [r for r in rec["rows"] if r.get("target")]
    assert verdict["result"] == "holds on **1 of 2 seeds**"
    assert list(verdict["numbers"]["failures"]) == ["901"]  # YAML keeps the seed as text
    assert "update-direction test's assertion" in capsys.readouterr().out


def test_the_terminal_reward_is_what_the_reward_function_gives_every_answer():
    """From the logged means (answer F1 with 0 for invalid answers, the valid-format rate, the
    count of failed episodes) ``terminal`` recovers the mean of the terminal rewards."""
    # FAKE trajectories: (F1, valid, failed)
    episodes = [(0.5, True, False)] * 10 + [(0.0, False, False)] * 6 + [(1.0, True, False)] * 14
    episodes += [(0.0, False, True)] * (TRAJECTORIES - len(episodes))
    assert len(episodes) == TRAJECTORIES
    step = {
        "episode/f1": sum(f for f, _, _ in episodes) / TRAJECTORIES,
        "episode/format_valid": sum(v for _, v, _ in episodes) / TRAJECTORIES,
        "episode/failed": float(sum(x for _, _, x in episodes)),
    }
    scores = [0.0 if failed else terminal_reward(f1 if valid else None) for f1, valid, failed in episodes]
    assert terminal(step) == pytest.approx(sum(scores) / TRAJECTORIES)
