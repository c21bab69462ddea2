"""The training side of config/authors.yaml on CPU: a real verl ``ToolAgentLoop`` episode of our
agent loop with the authors' protocol (no stop string, their parser, their observation JSON, every
query run, alias-blind entities), and the terminal reward read their way. The LLM server is a
scripted stand-in (sglang needs a GPU), the retrieval service the stub of conftest.py."""

import asyncio
import json

import pytest

pytest.importorskip("verl")

from verl.workers.rollout.replica import TokenOutput
from verl_episode import agent_episode, call_tool, search_tool

from spader.core.metrics import alias_blind
from spader.integrations.verl.agent_loop import AuthorsToolParser, SpaderToolParser
from spader.integrations.verl.reward import compute_score
from spader.methods.steps import STEPS_KEY

GOLD = {"entities": [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"], ["Harbour Lights"]]}
AUTHORS = [
    "++spader_agent.stop=[]",
    "++spader_agent.parser=authors",
    "++spader_agent.observation_format=authors",
    "++spader_agent.aliases=blind",
    "actor_rollout_ref.rollout.multi_turn.format=spader_authors",
]
# two calls in one turn (the model writes to its end of turn), then the answer
TURNS = [
    '<think>a</think><tool_call>["Varga family"]</tool_call> and <tool_call>["Ilse Varga", "Winter Quay"]</tool_call>',
    '<answer>["The Salt Orchard", "Winter Quay"]</answer>',
]


class RecordingServer:
    """Stand-in for the sglang server: the next scripted turn as ids; records the requests."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.params = tokenizer, list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.params.append(dict(sampling_params))
        ids = self.tokenizer.encode(self.turns.pop(0) + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def _episode(tokenizer, url, config, **tool):
    server = RecordingServer(tokenizer, TURNS)
    output = agent_episode(
        tokenizer,
        server,
        search_tool(url, **tool),
        question="Which films did Ilse Varga direct?",
        gold=GOLD,
        config=config,
    )
    return output, server


def test_their_protocol_through_the_agent_loop(tokenizer, retrieval_service):
    output, server = _episode(tokenizer, retrieval_service.url, AUTHORS, observation_format="authors")
    assert all("stop" not in p for p in server.params)  # no stop string: turns run to their end
    (step,) = output.extra_fields[STEPS_KEY]
    assert step["queries"] == 2  # the turn's last call ran
    assert retrieval_service.requests[-1]["queries"] == ["Ilse Varga", "Winter Quay"]
    # alias-blind: "The Salt Orchard" (two aliases) is never hit, Winter Quay (one) is
    assert step["hits"] == [1]
    text = tokenizer.decode(output.response_ids)
    assert '<tool_response>{\n  "result": [\n    {\n      "query": "Ilse Varga",' in text
    # the project's protocol on the same turns: the first call, numbered passages, aliases matched
    output, server = _episode(tokenizer, retrieval_service.url, [])
    assert all(p["stop"] == ["</tool_call>", "</answer>"] for p in server.params)
    assert output.extra_fields[STEPS_KEY][0]["queries"] == 1
    assert retrieval_service.requests[-1]["queries"] == ["Varga family"]


def test_their_parser_reads_the_last_call(tokenizer):
    ids = tokenizer.encode(TURNS[0], add_special_tokens=False)
    _, (call,) = asyncio.run(AuthorsToolParser(tokenizer).extract_tool_calls(ids))
    assert json.loads(call.arguments) == {"queries": ["Ilse Varga", "Winter Quay"]}
    _, (call,) = asyncio.run(SpaderToolParser(tokenizer).extract_tool_calls(ids))
    assert json.loads(call.arguments) == {"queries": ["Varga family"]}


def test_the_search_tool_runs_every_query_without_a_cap(retrieval_service):
    queries = ["Ilse Varga", "Winter Quay", "Harbour Lights", "salt", "Varga family"]

    class Data:
        assistant_turns, extra_fields = 1, {}

    asyncio.run(
        call_tool(
            search_tool(retrieval_service.url, max_queries_per_call=None),
            {"queries": queries},
            Data(),
            GOLD["entities"],
        )
    )
    assert retrieval_service.requests[-1]["queries"] == queries
    asyncio.run(call_tool(search_tool(retrieval_service.url), {"queries": queries}, Data(), GOLD["entities"]))
    assert retrieval_service.requests[-1]["queries"] == queries[:3]  # the test tool's cap


def test_their_terminal_reward():
    response = '<answer>["nothing"]</answer><tool_response>...</tool_response><answer>["Salt Orchard", "Winter Quay"]</answer>'
    extra = {"spader_final_turn": "<think>x</think>"}  # the last turn holds no answer
    theirs = compute_score("qampari", response, GOLD, extra, parser="authors")
    assert theirs["format_valid"] == 1.0 and theirs["f1"] == pytest.approx(0.8)  # P 1, R 2/3
    blind = compute_score("qampari", response, GOLD, extra, parser="authors", aliases="blind")
    assert blind["f1"] == pytest.approx(0.4)  # the two-alias entity never matches: P 1/2, R 1/3
    assert compute_score("qampari", response, GOLD, extra)["score"] == -1.0  # the project's reading
    # their reward manager's invalid format: 0 for SPADER's (a variant's reward_kwargs), -1 for GRPO
    unclosed = '<think>x</think><answer>["Winter Quay"]'
    assert (
        compute_score("q", unclosed, GOLD, extra, parser="authors", invalid_format_reward=0.0)["score"] == 0.0
    )
    assert compute_score("q", unclosed, GOLD, extra, parser="authors")["score"] == -1.0
    assert alias_blind(GOLD["entities"])[1] == ["['Winter Quay']"]


def test_their_turn_boundary_appends_the_observation_right_after_im_end(tokenizer, retrieval_service):
    """``agent.turn_boundary: authors``: their training appends the observation turn right after
    the turn's ``<|im_end|>`` (no newline); the default adds the template's newline (mask 0)."""
    im_end, newline = (
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.encode("\n", add_special_tokens=False),
    )
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")

    def after_first_turn(config):
        output, _ = _episode(
            tokenizer, retrieval_service.url, [*AUTHORS, *config], observation_format="authors"
        )
        ids = list(output.response_ids)
        at = ids.index(im_end)
        return ids[at + 1 : at + 1 + len(newline) + 1], output.response_mask[at + 1]

    theirs, mask = after_first_turn(["++spader_agent.turn_boundary=authors"])
    assert theirs[0] == im_start and mask == 0
    ours, mask = after_first_turn([])
    assert ours == [*newline, im_start] and mask == 0


def test_their_training_ends_the_episode_on_a_scalar_call_and_shows_their_training_error(
    tokenizer, retrieval_service
):
    """A JSON scalar in the last <tool_call> makes no call in their training (the episode ends,
    where their evaluation answers with an error); invalid JSON gets their parse-error message as
    their training renders it, the tool-role turn ``<tool_response>\\n...\\n</tool_response>``."""
    ids = tokenizer.encode('<tool_call>"Ilse Varga"</tool_call>', add_special_tokens=False)
    _, calls = asyncio.run(AuthorsToolParser(tokenizer).extract_tool_calls(ids))
    assert calls == []
    ids = tokenizer.encode("<tool_call>[oops</tool_call>", add_special_tokens=False)
    _, (call,) = asyncio.run(AuthorsToolParser(tokenizer).extract_tool_calls(ids))

    class Data:
        assistant_turns, extra_fields = 1, {}

    tool = search_tool(retrieval_service.url, observation_format="authors")
    response, _, metrics = asyncio.run(call_tool(tool, json.loads(call.arguments), Data(), GOLD["entities"]))
    assert response.text.startswith(
        "<tool_response>\nYour tool call could not be parsed. Error: Expecting value"
    )
    assert response.text.endswith("and try again.\n</tool_response>") and metrics["error"]
    assert Data.extra_fields[STEPS_KEY][0]["queries"] == 0
    # an episode whose first turn is a scalar call ends there, scored as it stands
    server = RecordingServer(tokenizer, ['<tool_call>"Ilse Varga"</tool_call>', '<answer>["x"]</answer>'])
    output = agent_episode(
        tokenizer, server, search_tool(retrieval_service.url), question="Q?", gold=GOLD, config=AUTHORS
    )
    assert len(server.turns) == 1 and STEPS_KEY not in output.extra_fields


def test_their_step_denominator_counts_every_entry_of_the_gold_list(retrieval_service):
    gold = [["Winter Quay"], ["Winter Quay"], ["winter quay"], ["Harbour Lights"]]

    def n_gold(**tool):
        class Data:
            assistant_turns, extra_fields = 1, {}

        asyncio.run(call_tool(search_tool(retrieval_service.url, **tool), {"queries": ["q"]}, Data(), gold))
        return Data.extra_fields["spader_n_gold"]

    assert n_gold() == 2  # the distinct entities, as recall counts them
    assert n_gold(discovery="substring") == 3  # the distinct entries, as their reward keys them
    assert n_gold(denominator="entries") == n_gold(discovery="substring", denominator="entries") == 4
