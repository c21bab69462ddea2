"""One turn, the same in training rollouts and in evaluation: the same scripted model through verl's
real agent loop (``spader_tool_agent``) and through the evaluation loop (``run_episodes``).

Fakes, named as such: ``TokenServer`` stands in for verl's sglang server manager and
``TokenEngine`` for an evaluation engine (no model can run here); both return scripted token ids,
honour the per-turn token budget as sglang does, and ignore stop strings, so the text a real
server could produce after ``</tool_call>`` reaches both loops. The retrieval service is the stub
HTTP service of conftest.py behind the real client; tokenizers and chat templates are the tiny
Qwen3's (ChatML) and a Llama-3.1-like template of our own with the same ``tools is not none``
branch as Llama-3.1's.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("verl")

from verl.workers.rollout.replica import TokenOutput
from verl_episode import agent_episode, search_tool

from spader.agent.generation import Generation
from spader.agent.loop import AgentSettings, Question, render_prompt, run_episodes
from spader.agent.search import RetrievalSearch
from spader.core.densify import FAILURE_KEY, FINAL_TURN_KEY, STEPS_KEY
from spader.core.prompt import build_messages
from spader.integrations.verl.agent_loop import turn_token_count
from spader.integrations.verl.reward import compute_score
from spader.retrieval.client import RetrievalClient

QUESTION = "Which films did Ilse Varga direct?"
GOLD = {"target": ["The Salt Orchard", "Winter Quay"], "entities": [["The Salt Orchard"], ["Winter Quay"]]}
TURN_TOKENS = 40

# Llama-3.1's template renders a function-calling preamble for any `tools` that is not None
LLAMA_LIKE = (
    "{{- bos_token }}"
    "{%- if tools is not none %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "You have access to the following functions: {{ tools | tojson }}<|eot_id|>{%- endif %}"
    "{%- for m in messages %}{{- '<|start_header_id|>' + ('ipython' if m['role'] == 'tool' else m['role'])"
    " + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# Qwen3's template renders its tool block only for a non-empty `tools`
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def styled(request, tokenizer):
    """``(tokenizer, hf_model_type)`` for one backbone's template style."""
    tok = copy.deepcopy(tokenizer)
    if request.param == "llama":
        tok.add_special_tokens(
            {
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot_id|>",
                "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            }
        )
        tok.chat_template = LLAMA_LIKE
    else:
        tok.chat_template = QWEN_LIKE
    return tok, request.param


class TokenServer:
    """Fake sglang server manager: the next scripted turn as token ids, cut at the request's
    ``max_new_tokens`` (as sglang does) but never at ``stop`` (a server may run past a tag)."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts, self.params = tokenizer, list(turns), [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(list(prompt_ids))
        self.params.append(dict(sampling_params))
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)
        ids = ids[: sampling_params["max_new_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


class TokenEngine:
    """Fake evaluation engine with the same script: token ids cut at the budget, decoded."""

    name = "scripted-tokens"

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    def generate(self, prompts, max_new_tokens, sampling):
        out = []
        for ids, budget in zip(prompts, max_new_tokens, strict=True):
            self.prompts.append(list(ids))
            turn = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)[:budget]
            out.append(Generation(self.tokenizer.decode(turn, skip_special_tokens=False), len(turn)))
        return out

    def close(self):
        pass


def training_episode(tokenizer, model_type, url, turns, *, response_length=4096, logprobs=False):
    """One real SpaderToolAgentLoop episode over the fake server; returns (output, server)."""
    server = TokenServer(tokenizer, turns)
    output = agent_episode(
        tokenizer,
        server,
        search_tool(url, max_queries_per_call=10, max_chars=11000),
        question=QUESTION,
        gold=GOLD,
        config=[f"spader_agent.max_turn_tokens={TURN_TOKENS}"],
        model_type=model_type,
        sampling={"temperature": 1.0, "logprobs": logprobs},
        response_length=response_length,
    )
    return output, server


def evaluation_episode(tokenizer, url, turns):
    """The same script through the evaluation loop; returns (episode, engine, queries searched)."""
    engine = TokenEngine(tokenizer, turns)
    settings = AgentSettings(max_turns=16, max_turn_tokens=TURN_TOKENS, max_context_tokens=100_000)
    sent: list[list[str]] = []
    with RetrievalClient(url, timeout=5, retries=0) as client:
        search = RetrievalSearch(client, topk=2)

        def recording(queries):
            sent.append(list(queries))
            return search(queries)

        (ep,) = run_episodes(
            [Question("q", QUESTION, GOLD["entities"])], engine, recording, settings, progress=False
        )
    return ep, engine, sent


def test_initial_prompt_tokens_are_the_evaluation_prompt_for_both_template_styles(styled, retrieval_service):
    tok, model_type = styled
    output, server = training_episode(
        tok, model_type, retrieval_service.url, ['<answer>["Winter Quay"]</answer>']
    )
    expected = render_prompt(tok, build_messages(QUESTION))
    assert server.prompts[0] == expected
    assert output.prompt_ids == expected
    text = tok.decode(expected, skip_special_tokens=False)
    assert "functions" not in text and "# Tools" not in text  # no tool schemas rendered
    # what an empty tool list renders with the Llama-like template: the preamble the loop avoids
    with_empty = tok.apply_chat_template(
        build_messages(QUESTION), tools=[], tokenize=False, add_generation_prompt=True
    )
    assert ("You have access to the following functions" in with_empty) == (model_type == "llama")


SCRIPT = [
    # a server that runs past the closing tag: the turn is the search, never the invented answer
    '<think>films first</think><tool_call>["Ilse Varga"]</tool_call><answer>["Invented"]</answer>',
    '<tool_call>["Winter Quay"]</tool_call>\n<tool_response>fake</tool_response>',
    '<think>done</think><answer>["The Salt Orchard", "Winter Quay"]</answer> and more text',
]


def test_one_turn_is_the_same_in_training_and_evaluation(styled, retrieval_service):
    tok, model_type = styled
    output, server = training_episode(tok, model_type, retrieval_service.url, SCRIPT, logprobs=True)
    training_queries = [r["queries"] for r in retrieval_service.requests]
    retrieval_service.requests.clear()
    ep, engine, _sent = evaluation_episode(tok, retrieval_service.url, SCRIPT)
    eval_queries = [r["queries"] for r in retrieval_service.requests]

    # both loops ran the two searches and nothing the server wrote after a closing tag
    assert training_queries == eval_queries == [["Ilse Varga"], ["Winter Quay"]]
    assert [s.kind for s in ep.steps] == ["search", "search", "answer"]
    assert [(s["turn"], s["queries"]) for s in output.extra_fields[STEPS_KEY]] == [(1, 1), (2, 1)]
    # every generation request carried the stop tags, kept, and the per-turn cap
    for params in server.params:
        assert params["stop"] == ["</tool_call>", "</answer>"] and params["no_stop_trim"] is True
        assert params["max_new_tokens"] == TURN_TOKENS
    # the model saw the same tokens at every turn in both loops
    assert server.prompts == engine.prompts
    # and the recorded turns end at their tags: the same final answer and score
    assert output.extra_fields[FINAL_TURN_KEY].endswith(
        '<answer>["The Salt Orchard", "Winter Quay"]</answer>'
    )
    assert ep.answer.valid and ep.answer.answers == ["The Salt Orchard", "Winter Quay"]
    score = compute_score("qampari", "", GOLD, dict(output.extra_fields))
    assert score["score"] == 1.0 and score["failed"] == 0.0
    # template closing tokens the model did not write carry no loss
    assert len(output.response_mask) == len(output.response_ids) == len(output.response_logprobs)


def test_a_turn_cut_by_the_token_cap_is_the_same_in_both_loops(styled, retrieval_service):
    tok, model_type = styled
    long_turn = "<think>" + "thinking " * 200 + '</think><answer>["Winter Quay"]</answer>'
    script = ['<tool_call>["Ilse Varga"]</tool_call>', long_turn]
    output, server = training_episode(tok, model_type, retrieval_service.url, script)
    ep, engine, _ = evaluation_episode(tok, retrieval_service.url, script)
    assert server.prompts == engine.prompts
    cut = output.extra_fields[FINAL_TURN_KEY]
    assert len(tok.encode(cut, add_special_tokens=False)) == TURN_TOKENS and "<answer>" not in cut
    assert ep.steps[-1].text == cut and ep.status == "no_action" and not ep.format_valid
    assert compute_score("qampari", "", GOLD, dict(output.extra_fields))["format_valid"] == 0.0


def test_turn_token_count_keeps_the_token_that_completes_the_tag(tokenizer):
    ids = tokenizer.encode('<tool_call>["q"]</tool_call> trailing words', add_special_tokens=False)
    keep = turn_token_count(tokenizer, ids, ("</tool_call>",))
    assert tokenizer.decode(ids[:keep]).endswith("</tool_call>") and keep < len(ids)
    assert turn_token_count(tokenizer, ids, ("</answer>",)) == len(ids)


def test_a_failing_episode_is_scored_zero_and_never_fails_the_batch(tokenizer, retrieval_service):
    # the fake server has no turn to give: generate raises inside the episode
    output, _ = training_episode(tokenizer, "qwen3", retrieval_service.url, [], logprobs=True)
    assert "IndexError" in output.extra_fields[FAILURE_KEY]
    assert output.response_mask == [0] and output.response_logprobs == [0.0]
    assert output.prompt_ids == render_prompt(tokenizer, build_messages(QUESTION))
    score = compute_score("qampari", "", GOLD, dict(output.extra_fields))
    assert (score["score"], score["failed"], score["format_valid"]) == (0.0, 1.0, 0.0)
    # verl's own conversion of the output works (one masked token carries the scalar score)
    output.reward_score = score["score"]
    assert output.as_dict()["rm_scores"].tolist() == [0.0]
