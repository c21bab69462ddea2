"""Generation engines with the real tiny random Qwen3 (its outputs are meaningless by design)."""

from __future__ import annotations

import sys

import pytest
from sections import agent_settings

from spader.agent.generation import (
    Sampling,
    TransformersEngine,
    cut_at_markers,
    keep_through_stop,
)
from spader.agent.loop import Question, render_prompt, run_episodes
from spader.core.prompt import build_messages
from spader.evaluation.engines import build_engine
from spader.evaluation.episodes import episode_record


@pytest.fixture(scope="module")
def engine(tiny_qwen3_dir):
    eng = TransformersEngine(tiny_qwen3_dir, device="cpu", batch_size=4)
    yield eng
    eng.close()


def _prompts(engine, questions):
    return [render_prompt(engine.tokenizer, build_messages(q)) for q in questions]


QUESTIONS = [
    "Which rivers flow into Lake Morrow?",
    "Which films were directed by Ilse Varga in the 1960s and 1970s?",
    "Who?",
]


def test_batched_generation_equals_one_prompt_at_a_time(engine):
    # left padding must not change what a prompt generates: prompts differ in length
    prompts = _prompts(engine, QUESTIONS)
    assert len({len(p) for p in prompts}) == 3
    sampling = Sampling(temperature=0.0, stop=("</tool_call>", "</answer>"))
    batched = engine.generate(prompts, [12, 12, 12], sampling)
    single = [engine.generate([p], [12], sampling)[0] for p in prompts]
    assert [g.text for g in batched] == [g.text for g in single]
    assert all(g.error is None and 0 < g.completion_tokens <= 12 for g in batched)


def test_each_prompt_keeps_its_own_token_budget(engine):
    prompts = _prompts(engine, QUESTIONS[:2])
    outs = engine.generate(prompts, [3, 9], Sampling(temperature=1.0, seed=7))
    assert outs[0].completion_tokens <= 3 and outs[1].completion_tokens <= 9


def test_sampling_is_reproducible_with_a_seed(engine):
    prompts = _prompts(engine, QUESTIONS[:2])
    a = engine.generate(prompts, [10, 10], Sampling(temperature=1.0, seed=3))
    b = engine.generate(prompts, [10, 10], Sampling(temperature=1.0, seed=3))
    assert [g.text for g in a] == [g.text for g in b]


def test_a_failing_prompt_is_isolated(engine, monkeypatch):
    prompts = _prompts(engine, QUESTIONS)
    bad = len(prompts[1])
    real = engine._generate_batch

    def fail_on_one(batch, budgets, sampling, seeds):  # fault injection: one prompt always fails
        if any(len(p) == bad for p in batch):
            raise RuntimeError("simulated device failure")
        return real(batch, budgets, sampling, seeds)

    monkeypatch.setattr(engine, "_generate_batch", fail_on_one)
    outs = engine.generate(prompts, [4, 4, 4], Sampling())
    assert [g.finish == "error" for g in outs] == [False, True, False]
    assert "simulated device failure" in outs[1].error and outs[0].error is None and outs[2].error is None


def test_the_engine_returns_token_ids_and_a_seeded_request_samples_alone_as_in_a_batch(engine):
    prompts = _prompts(engine, QUESTIONS)
    sampling = Sampling(temperature=1.0, stop=("</tool_call>", "</answer>"), seed=0)
    batched = engine.generate(prompts, [10, 10, 10], sampling, seeds=[11, 12, 13])
    alone = engine.generate(prompts[1:2], [10], sampling, seeds=[12])[0]
    assert batched[1].token_ids == alone.token_ids and len(alone.token_ids) == alone.completion_tokens
    assert all(len(g.token_ids) == g.completion_tokens > 0 for g in batched)
    # the ids are what the model generated; the text is their decoding (end-of-turn markers cut)
    text = engine.tokenizer.decode(list(alone.token_ids), skip_special_tokens=False)
    assert (
        keep_through_stop(cut_at_markers(text, ["<|im_end|>", "<|endoftext|>"]), sampling.stop) == alone.text
    )
    other = engine.generate(prompts[1:2], [10], sampling, seeds=[99])[0]
    assert other.token_ids != alone.token_ids  # another seed, another sample (10 tokens of a random model)


class FakeSglangEngine:
    """Stand-in for sglang's offline ``Engine`` (sglang cannot be installed here): answers as sglang
    0.5's tokenizer manager does (``text``, ``output_ids``, ``meta_info``) and records the requests."""

    def __init__(self, replies):
        self.replies, self.params = list(replies), []

    def generate(self, input_ids, sampling_params):
        batch = isinstance(input_ids[0], list)
        params = sampling_params if batch else [sampling_params]
        self.params.extend(params)
        outs = [self.replies.pop(0) for _ in params]
        return outs if batch else outs[0]


def test_the_sglang_engine_keeps_output_ids_and_sends_each_request_its_seed(tiny_qwen3_dir):
    from spader.agent.generation import load_tokenizer
    from spader.integrations.sglang import SglangEngine

    tok = load_tokenizer(tiny_qwen3_dir)
    ids = tok.encode('<tool_call>["q"]</tool_call>', add_special_tokens=False)
    reply = {
        "text": '<tool_call>["q"]</tool_call>',
        "output_ids": ids,
        "meta_info": {"finish_reason": {"type": "stop"}, "completion_tokens": len(ids)},
    }
    eng = object.__new__(SglangEngine)  # no sglang here: the wrapper around the stand-in
    eng.tokenizer, eng._markers, eng.engine = tok, ["<|im_end|>"], FakeSglangEngine([reply, reply])
    outs = eng.generate(
        [[1, 2], [3]], [8, 9], Sampling(temperature=1.0, stop=("</tool_call>",)), seeds=[5, 6]
    )
    assert [g.token_ids for g in outs] == [tuple(ids)] * 2 and outs[0].finish == "stop"
    assert [(p["sampling_seed"], p["max_new_tokens"], p["no_stop_trim"]) for p in eng.engine.params] == [
        (5, 8, True),
        (6, 9, True),
    ]
    eng.engine = FakeSglangEngine([{"text": "x", "meta_info": {}}] * 2)  # answers without output_ids
    (failed,) = eng.generate([[1]], [4], Sampling())
    assert failed.finish == "error" and "output_ids" in failed.error


def test_output_is_cut_at_end_of_turn_markers_and_after_the_first_stop_string():
    assert cut_at_markers("abc<|im_end|>junk<|endoftext|>", ["<|im_end|>", "<|endoftext|>"]) == "abc"
    text = '<tool_call>["q"]</tool_call><tool_response>invented</tool_response>'
    assert keep_through_stop(text, ("</tool_call>", "</answer>")) == '<tool_call>["q"]</tool_call>'
    assert keep_through_stop("no stop", ("</answer>",)) == "no stop"


def test_sglang_is_never_imported_and_its_absence_is_a_clear_error(tiny_qwen3_dir):
    assert "sglang" not in sys.modules
    with pytest.raises(ValueError, match="needs a GPU"):
        build_engine("sglang", tiny_qwen3_dir, gpus=0)
    if "sglang" not in sys.modules:
        try:
            import sglang  # noqa: F401
        except ImportError:
            with pytest.raises(RuntimeError, match="sglang is not installed"):
                build_engine("sglang", tiny_qwen3_dir, gpus=1)
    with pytest.raises(ValueError, match="evaluation.engine"):
        build_engine("vllm", tiny_qwen3_dir)
    with pytest.raises(FileNotFoundError, match="config.json"):
        build_engine("transformers", tiny_qwen3_dir.parent / "nowhere")


@pytest.mark.parametrize("method", ["react", "rag"])
def test_the_loop_runs_the_tiny_model_end_to_end(engine, fake_search, method):
    questions = [Question(f"q{i}", q, [["Tam"], ["Oure"]]) for i, q in enumerate(QUESTIONS)]
    settings = agent_settings(
        max_turns=3, max_turn_tokens=24, max_context_tokens=4096, temperature=1.0, seed=1
    )
    eps = run_episodes(questions, engine, fake_search, settings, method=method, progress=False)
    recs = [episode_record(ep, "demo") for ep in eps]
    assert [r["id"] for r in recs] == ["q0", "q1", "q2"]
    allowed = {"answered", "no_action", "turn_budget", "context_budget"}
    assert all(r["status"] in allowed and r["error"] is None for r in recs)
    assert all(0.0 <= r["f1"] <= 1.0 and 1 <= r["turns"] <= 3 for r in recs)
    if method == "rag":
        assert fake_search.calls[0] == QUESTIONS and all(r["steps"][0]["kind"] == "retrieval" for r in recs)
    assert all(isinstance(s["text"], str) for r in recs for s in r["steps"])
