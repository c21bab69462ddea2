"""Search tool, tool parser and agent loop on CPU: a real verl ``ToolAgentLoop`` episode.

The LLM server is replaced by a scripted generator (sglang needs a GPU); everything else is the
real code: verl's agent loop and continuous-token tokenization with the tiny Qwen3 tokenizer, our
parser, our ``BaseTool`` over the real ``RetrievalClient`` and a local retrieval service stand-in.
"""

import asyncio
import json

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf
from paper_verl import paper_overrides
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.workers.rollout.replica import TokenOutput
from verl_episode import agent_episode, call_tool, search_tool

from spader.core.prompt import fit_observation
from spader.integrations.verl.agent_loop import SpaderToolParser
from spader.integrations.verl.compose import compose
from spader.integrations.verl.reward import compute_score
from spader.integrations.verl.search_tool import SearchTool
from spader.integrations.verl.tool_config import TOOL_SCHEMA, write_tool_config
from spader.methods.steps import FINAL_TURN_KEY, N_GOLD_KEY, STEPS_KEY

GOLD = {
    "target": ["The Salt Orchard", "Winter Quay", "Harbour Lights", "Quiet Meadow"],
    "entities": [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"], ["Harbour Lights"], ["Quiet Meadow"]],
}


def _tool(url, **overrides):
    return search_tool(url, **overrides)


class _AgentData:
    """The two attributes of verl's AgentData the tool uses."""

    def __init__(self, turns):
        self.assistant_turns = turns
        self.extra_fields = {}


async def _call(tool, parameters, agent_data, entities=GOLD["entities"]):
    return await call_tool(tool, parameters, agent_data, entities)


def test_tool_records_hits_on_passages_never_on_queries(retrieval_service):
    tool = _tool(retrieval_service.url)
    data = _AgentData(turns=2)
    # "Quiet Meadow" is a gold entity named in the query, but no passage contains it
    response, reward, metrics = asyncio.run(_call(tool, {"queries": ["Quiet Meadow", "Salt Orchard"]}, data))
    assert reward == 0.0
    assert data.extra_fields[STEPS_KEY] == [{"turn": 2, "queries": 2, "hits": [0], "error": None}]
    assert data.extra_fields[N_GOLD_KEY] == 4
    assert 'Results for "Quiet Meadow":\n(no results)' in response.text
    assert "Ilse Varga directed The Salt Orchard" in response.text
    assert retrieval_service.requests[-1] == {
        "queries": ["Quiet Meadow", "Salt Orchard"],
        "return_scores": True,
        "topk": 2,
        "initial_k": 10,
    }
    assert metrics == {"queries": 2, "hits": 1, "error": False}


def test_the_authors_discovery_credits_an_entity_the_query_names(retrieval_service):
    """``discovery: substring`` (the authors' reward): the observation echoes the query, so the
    entity no passage contains is found; the passages' own entity is found as before."""
    tool = _tool(retrieval_service.url, discovery="substring")
    data = _AgentData(turns=2)
    asyncio.run(_call(tool, {"queries": ["Quiet Meadow", "Salt Orchard"]}, data))
    assert data.extra_fields[STEPS_KEY] == [{"turn": 2, "queries": 2, "hits": [0, 3], "error": None}]
    with pytest.raises(ValueError, match="'discovery' must be one of"):
        _tool(retrieval_service.url, discovery="words")


def test_searches_leave_the_loop_s_default_executor_to_the_tokenizer_work(retrieval_service):
    """verl runs every episode's tokenizer work in the event loop's default executor: a search
    waiting on the service must not hold one of its threads (a busy default executor here, one
    thread held until the search is done, would otherwise stall the search forever)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    tool = _tool(retrieval_service.url)
    data = _AgentData(turns=1)
    release = threading.Event()

    async def searched_while_the_default_executor_is_busy():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        held = loop.run_in_executor(None, release.wait, 30)
        try:
            return await asyncio.wait_for(_call(tool, {"queries": ["Salt Orchard"]}, data), 20)
        finally:
            release.set()
            await held

    response, _, metrics = asyncio.run(searched_while_the_default_executor_is_busy())
    assert metrics == {"queries": 1, "hits": 1, "error": False}
    assert "Ilse Varga directed The Salt Orchard" in response.text


def test_tool_caps_queries_and_sends_repeats_once(retrieval_service):
    tool = _tool(retrieval_service.url, max_queries_per_call=3)
    data = _AgentData(turns=1)
    asyncio.run(
        _call(tool, {"queries": ["winter quay", "winter quay", " ", "harbour", "salt", "extra"]}, data)
    )
    assert retrieval_service.requests[-1]["queries"] == ["winter quay", "harbour"]
    # q_t counts every query issued, also the two beyond the cap that were not run
    assert data.extra_fields[STEPS_KEY][0]["queries"] == 5
    assert data.extra_fields[STEPS_KEY][0]["hits"] == [1, 2]


def test_tool_budget_drops_low_ranked_passages_and_their_hits(retrieval_service):
    full = _tool(retrieval_service.url, max_chars=100000)
    data = _AgentData(turns=1)
    _text_full, _, _ = asyncio.run(_call(full, {"queries": ["ilse varga film"]}, data))
    assert data.extra_fields[STEPS_KEY][0]["hits"] == [1, 2]  # Winter Quay, then Harbour Lights
    # a budget that only fits the first passage: the second one (Harbour Lights) is neither shown nor hit
    budget = len('Results for "ilse varga film":\n') + len("Doc 1 (Title: Winter Quay) ") + 60
    small = _tool(retrieval_service.url, max_chars=budget)
    data = _AgentData(turns=1)
    text, _, _ = asyncio.run(_call(small, {"queries": ["ilse varga film"]}, data))
    assert len(text.text) <= budget and "Harbour Lights" not in text.text
    assert data.extra_fields[STEPS_KEY][0]["hits"] == [1]


def test_fit_observation_takes_from_the_longest_list_first():
    p = [{"title": f"T{i}", "text": "x" * 20} for i in range(3)]
    text, shown = fit_observation(
        ["a", "b"], [p, p[:1]], max_chars=len(fit_observation(["a", "b"], [p[:2], p[:1]], 10**6)[0])
    )
    assert [len(s) for s in shown] == [2, 1]
    text, shown = fit_observation(["a"], [p], max_chars=5)
    assert shown == [[]] and len(text) == 5


def test_tool_error_observation_for_malformed_call_and_dead_service(retrieval_service):
    tool = _tool(retrieval_service.url)
    data = _AgentData(turns=1)
    response, _, _ = asyncio.run(
        _call(tool, {"queries": [], "error": "the tool call must be a JSON list"}, data)
    )
    assert response.text == "Error: the tool call must be a JSON list"
    retrieval_service.fail_next = 1  # 503 with retries=0: the client gives up
    response, _, metrics = asyncio.run(_call(tool, {"queries": ["salt"]}, data))
    assert response.text.startswith("Error: search service unavailable")
    assert [r["error"] is not None for r in data.extra_fields[STEPS_KEY]] == [True, True]
    # a malformed call issues no query; a call the dead service could not serve issued one
    assert [r["queries"] for r in data.extra_fields[STEPS_KEY]] == [0, 1]
    assert metrics["error"] is True


@pytest.mark.parametrize(
    "parameters",
    [
        {"queries": ["\ud800 lone surrogate"]},
        {"queries": [10**50]},
        {"queries": [["nested"]]},
        {"queries": "not a list"},
    ],
)
def test_unusable_queries_are_an_error_observation_never_a_request(retrieval_service, parameters):
    tool = _tool(retrieval_service.url)
    data = _AgentData(turns=1)
    response, _, metrics = asyncio.run(_call(tool, parameters, data))
    assert response.text == "Error: the tool call must be a JSON list of query strings"
    assert data.extra_fields[STEPS_KEY] == [
        {"turn": 1, "queries": 0, "hits": [], "error": "the tool call must be a JSON list of query strings"}
    ]
    assert retrieval_service.requests == [] and metrics["error"] is True


def test_entities_and_gold_count_are_deduplicated_as_f1_counts_them(retrieval_service):
    tool = _tool(retrieval_service.url)
    data = _AgentData(turns=1)
    gold = [["Winter Quay"], ["winter quay!"], ["Harbour Lights"], ["?"]]
    asyncio.run(_call(tool, {"queries": ["ilse varga film"]}, data, entities=gold))
    assert data.extra_fields[N_GOLD_KEY] == 2  # |E_GT| as the F1 metric counts it
    assert data.extra_fields[STEPS_KEY][0]["hits"] == [0, 1]  # indices into the distinct entities


def test_tool_requires_entities_and_config(retrieval_service):
    with pytest.raises(ValueError, match="max_chars"):
        _tool(retrieval_service.url, max_chars=None)
    tool = _tool(retrieval_service.url)
    with pytest.raises(ValueError, match="ground-truth entities"):
        asyncio.run(tool.create(create_kwargs={}))


def test_write_tool_config_is_loaded_by_verl(tmp_path, retrieval_service):
    from verl.tools.tool_registry import initialize_tools_from_config

    retrieval = {
        "topk": 5,
        "initial_k": 50,
        "service": {
            "request_timeout_s": 30,
            "retries": 2,
            "max_query_chars": 500,
            "max_queries_per_request": 64,
        },
    }
    path = write_tool_config(
        tmp_path / "tools" / "search.yaml",
        service_url=retrieval_service.url,
        retrieval=retrieval,
        max_chars=11000,
        max_queries_per_call=10,
        discovery="substring",
    )
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, SearchTool) and tool.name == "search"
    assert (tool.topk, tool.initial_k, tool.max_chars, tool.max_queries, tool.max_query_chars) == (
        5,
        50,
        11000,
        10,
        500,
    )
    assert tool.discovery == "substring"
    with pytest.raises(ValueError, match="retrieval.topk"):
        write_tool_config(
            tmp_path / "x.yaml",
            service_url=retrieval_service.url,
            retrieval={"initial_k": 5},
            max_chars=10,
            max_queries_per_call=10,
        )


@pytest.mark.parametrize(
    "text, calls",
    [
        ('<think>x</think><tool_call>["a", "b"]</tool_call><|im_end|>', [{"queries": ["a", "b"]}]),
        (
            "<tool_call>not json</tool_call>",
            [{"queries": [], "error": "the tool call must be a JSON list of query strings"}],
        ),
        # the first closing tag ends the turn: what follows it is not part of the turn
        ('<tool_call>["a"]</tool_call><answer>["A"]</answer>', [{"queries": ["a"]}]),
        ('<answer>["A"]</answer><tool_call>["a"]</tool_call>', []),  # an answer ends the episode
        ("<think>only thinking</think>", []),
    ],
)
def test_tool_parser(tokenizer, text, calls):
    parser = SpaderToolParser(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    tools = [OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA)]
    content, got = asyncio.run(parser.extract_tool_calls(ids, tools))
    assert [json.loads(c.arguments) for c in got] == calls
    assert all(c.name == "search" for c in got)
    assert "<tool_call>" not in content or not got


class ScriptedServer:
    """Stand-in for the sglang server: returns the next scripted assistant turn as token ids."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.turns.pop(0) + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def run_episode(tokenizer, url, turns, question="Which films did Ilse Varga direct?", response_length=4096):
    """One real SpaderToolAgentLoop episode; returns (output, server)."""
    server = ScriptedServer(tokenizer, turns)
    output = agent_episode(
        tokenizer, server, _tool(url), question=question, gold=GOLD, response_length=response_length
    )
    return output, server


SEARCH_THEN_ANSWER = [
    '<think>look up the meadow</think><tool_call>["Quiet Meadow"]</tool_call>',
    '<tool_call>["Salt Orchard", "Winter Quay"]</tool_call>',
    '<think>done</think><answer>["The Salt Orchard", "Winter Quay", "Nonsense"]</answer>',
]


def _runs(mask):
    runs, prev = 0, 0
    for m in mask:
        runs += int(m == 1 and prev == 0)
        prev = m
    return runs


def test_agent_loop_episode_records_steps_and_final_turn(tokenizer, retrieval_service):
    output, server = run_episode(tokenizer, retrieval_service.url, SEARCH_THEN_ANSWER)
    steps = output.extra_fields[STEPS_KEY]
    assert [(s["turn"], s["queries"], s["hits"]) for s in steps] == [(1, 1, []), (2, 2, [0, 1])]
    assert output.extra_fields[N_GOLD_KEY] == 4
    assert (
        '<answer>["The Salt Orchard", "Winter Quay", "Nonsense"]</answer>'
        in output.extra_fields[FINAL_TURN_KEY]
    )
    # three assistant runs in the response mask, separated by the two observations
    assert _runs(output.response_mask) == 3
    text = tokenizer.decode(output.response_ids)
    assert "<tool_response>" in text and "Ilse Varga directed The Salt Orchard" in text
    # the chat template got no tool schemas: the prompt is the system message (the instructions)
    # and the user turn (the question) only
    prompt = tokenizer.decode(server.prompts[0])
    assert prompt.startswith("<|im_start|>system\nAnswer the question below.")
    assert prompt.endswith(
        "<|im_start|>user\nQuestion: Which films did Ilse Varga direct?<|im_end|>\n<|im_start|>assistant\n"
    )
    # the terminal reward reads the final turn only: P 2/3, R 2/4 -> F1 4/7
    score = compute_score("qampari", tokenizer.decode(output.response_ids), GOLD, dict(output.extra_fields))
    assert score["score"] == pytest.approx(4 / 7) and score["format_valid"] == 1.0


def test_agent_loop_cut_by_the_turn_cap_is_an_invalid_format(tokenizer, retrieval_service):
    turns = ['<tool_call>["salt"]</tool_call>'] * 16 + ['<answer>["never reached"]</answer>']
    output, _ = run_episode(tokenizer, retrieval_service.url, turns)
    assert _runs(output.response_mask) == 16 and len(output.extra_fields[STEPS_KEY]) == 15
    score = compute_score("qampari", "", GOLD, dict(output.extra_fields))
    assert (score["score"], score["format_valid"]) == (-1.0, 0.0)
    code = compute_score("qampari", "", GOLD, dict(output.extra_fields), invalid_format_reward=0.0)
    assert code["score"] == 0.0


def test_reward_needs_the_spader_agent_loop_and_ground_truth():
    with pytest.raises(KeyError, match="spader_tool_agent"):
        compute_score("qampari", '<answer>["A"]</answer>', GOLD, {})
    with pytest.raises(ValueError, match="neither 'entities' nor 'target'"):
        compute_score("qampari", "", {"answers": []}, {FINAL_TURN_KEY: '<answer>["A"]</answer>'})
    # target only: one alias per entity; numpy arrays from a parquet read-back work too
    np = pytest.importorskip("numpy")
    gt = {"target": np.array(["Xu", "Yi"], dtype=object), "entities": None}
    assert compute_score("x", "", gt, {FINAL_TURN_KEY: '<answer>["xu"]</answer>'})["score"] == pytest.approx(
        2 / 3
    )


def test_composed_agent_settings_name_the_registered_pieces():
    cfg = compose("spader", paper_overrides("spader"))
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    assert (multi_turn.format, cfg.actor_rollout_ref.rollout.agent.default_agent_loop) == (
        "spader",
        "spader_tool_agent",
    )
    assert OmegaConf.select(cfg, "data.return_raw_chat") is True


def test_real_episodes_through_the_trainer_mode(tokenizer, retrieval_service, fake_tq):
    """Two real episodes of one prompt -> terminal reward -> TransferQueue fields as the agent-loop
    worker writes them -> spader_sync densification -> verl's advantage dispatch."""
    from loop_reference import reference_token_advantages
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import get_trainer_cls

    searcher, _ = run_episode(tokenizer, retrieval_service.url, SEARCH_THEN_ANSWER)
    direct, _ = run_episode(tokenizer, retrieval_service.url, ['<answer>["Winter Quay"]</answer>'])
    keys = []
    for i, out in enumerate([searcher, direct]):
        out.reward_score = compute_score("qampari", "", GOLD, dict(out.extra_fields))["score"]
        keys.append(f"uid0_{i}_0")
        fields = out.as_dict()
        # written by the actor's old-log-prob pass, which runs before the advantage (GPU)
        fields["old_log_probs"] = fields["rollout_log_probs"].clone()
        fake_tq.put_samples([keys[-1]], [{**fields, "uid": "uid0"}])
    trainer = get_trainer_cls("spader_sync")(
        compose("spader", [*paper_overrides("spader"), "actor_rollout_ref.model.path=/unused"])
    )
    trainer.global_steps = 1
    batch = KVBatchMeta(keys=keys, tags=[{}, {}], partition_id="train")
    metrics = {}
    trainer._compute_advantage(batch, metrics)
    rewards = [fake_tq.store[("train", k)]["rm_scores"].tolist() for k in keys]
    masks = [fake_tq.store[("train", k)]["response_mask"].tolist() for k in keys]
    # searcher: turn 1 finds nothing with 1 query, turn 2 finds entities 0 and 1 (unique in the
    # group: alpha + beta each) with 2 queries (one call: 0.01), answers F1 4/7; direct answer:
    # P 1, R 1/4 -> F1 0.4
    assert sorted(v for v in rewards[0] if v) == pytest.approx(sorted([-0.01 / 4, (10 - 0.01) / 4, 4 / 7]))
    assert [v for v in rewards[1] if v] == [pytest.approx(0.4)]
    assert metrics["spader/new_entities/mean"] == 1.0 and metrics["spader/missing_step_records"] == 0.0
    width = max(len(r) for r in rewards)
    pad = lambda rows: [r + [0] * (width - len(r)) for r in rows]  # noqa: E731
    expected = reference_token_advantages(pad(rewards), pad(masks), ["uid0", "uid0"], gamma=0.9)
    got = [fake_tq.store[("train", k)]["advantages"].tolist() for k in keys]
    for row, exp in zip(got, expected, strict=False):
        assert row == pytest.approx(exp[: len(row)], abs=1e-5)


class StopTagServer:
    """Stand-in for sglang honouring ``stop``: the scripted turn's ids end at its closing tag (no
    end-of-turn token), cut at ``max_new_tokens``, as a real server returns a turn stopped at a tag."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, list(turns)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)[
            : sampling_params["max_new_tokens"]
        ]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def test_the_terminal_reward_of_an_episode_cut_after_a_search_reaches_gae_and_grpo(
    tokenizer, retrieval_service
):
    """An observation that overflows the response budget ends the episode after a search: the
    invalid-format -1 must sit on a generated token, where verl's GAE reads it (PPO in verl's
    plain sync mode, which writes the score on the last response token)."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return, compute_grpo_outcome_advantage

    from spader.integrations.verl.estimators import spader_grpo_advantage

    search = '<tool_call>["Ilse Varga film"]</tool_call>'
    budget = len(tokenizer.encode(search, add_special_tokens=False)) + 8  # the observation cannot fit
    cut = agent_episode(
        tokenizer, StopTagServer(tokenizer, [search]), _tool(retrieval_service.url), question="Which films?",
        gold=GOLD, response_length=budget,
    )  # fmt: skip
    answered = agent_episode(
        tokenizer, StopTagServer(tokenizer, ['<answer>["Winter Quay"]</answer>']), _tool(retrieval_service.url),
        question="Which films?", gold=GOLD, response_length=budget,
    )  # fmt: skip
    assert retrieval_service.requests  # the search ran; its observation did not fit
    # the response ends on the last token the model generated (the closing tag), not on template tokens
    assert cut.response_mask[-1] == 1 and tokenizer.decode(cut.response_ids).endswith("</tool_call>")
    rows = []
    for out in (cut, answered):
        out.reward_score = compute_score("qampari", "", GOLD, dict(out.extra_fields))["score"]
        rows.append(out.as_dict())  # verl's conversion: the score on the last response token
    assert [r["rm_scores"].sum().item() for r in rows] == pytest.approx([-1.0, 0.4])
    width = max(len(r["response_mask"]) for r in rows)
    pad = lambda t: torch.nn.functional.pad(t, (0, width - len(t)))  # noqa: E731
    rewards = torch.stack([pad(r["rm_scores"]) for r in rows]).float()
    mask = torch.stack([pad(r["response_mask"]) for r in rows]).float()
    # PPO: verl's GAE (gamma = lambda = 1, a critic that predicts 0): the return of every generated
    # token of the cut episode is its -1
    _, returns = compute_gae_advantage_return(
        rewards, torch.zeros_like(rewards), mask, torch.tensor(1.0), torch.tensor(1.0)
    )
    generated = mask[0].bool()
    assert returns[0][generated].tolist() == pytest.approx([-1.0] * int(generated.sum()))
    # GRPO: verl's own, and the project's registration of it
    index = np.array(["u", "u"], dtype=object)
    for advantages, _ in (
        compute_grpo_outcome_advantage(rewards, mask, index),
        spader_grpo_advantage(rewards, mask, index=index),
    ):
        assert (advantages[0][generated] < 0).all() and (advantages[1][mask[1].bool()] > 0).all()
        assert advantages[0][generated][0].item() == pytest.approx(-(1.4 / 2) / (1.4 / 2**0.5), abs=1e-4)
