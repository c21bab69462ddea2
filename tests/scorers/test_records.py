"""The search tool's turn details for the step-level baselines: the real tool and
``RetrievalClient`` over the stdlib retrieval stand-in of tests/verl (a Lucene index is not needed
to test what the tool records)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

from verl_episode import call_tool, search_tool

from spader.integrations.verl.tool_config import write_tool_config
from spader.methods.steps import FINAL_TURN_KEY, STEPS_KEY, parse_step_records, parse_turn_details

ENTITIES = [["The Salt Orchard"], ["Winter Quay"]]
TURN = '<think>Find Varga\'s films first.</think><tool_call>["ilse varga film", "salt orchard"]</tool_call>'


class AgentData:
    """The attributes of verl's AgentData the tool reads."""

    def __init__(self, turns, text):
        self.assistant_turns = turns
        self.extra_fields = {FINAL_TURN_KEY: text}


def tool(url, **overrides):
    return search_tool(url, **{"max_chars": 4000, **overrides})


def call(t, parameters, data):
    return asyncio.run(call_tool(t, parameters, data, ENTITIES))


def test_turn_details_are_recorded_when_asked(retrieval_service):
    data = AgentData(2, TURN)
    response, _, _ = call(
        tool(retrieval_service.url, record_turns=True), {"queries": ["ilse varga film", "salt orchard"]}, data
    )
    (raw,) = data.extra_fields[STEPS_KEY]
    (details,) = parse_turn_details(data.extra_fields, "t")
    (spader_record,) = parse_step_records(data.extra_fields, "t")  # SPADER's view of the same record
    assert spader_record.turn == details.turn == 2 and spader_record.hits == {0, 1}
    # every shown passage of both queries, in rank order, with its text and search score
    expected = [p for q in ("ilse varga film", "salt orchard") for p in retrieval_service.rank(q, 2)]
    assert details.passage_ids == tuple(p["id"] for p in expected)
    assert details.passage_texts == tuple(f"{p['title']} {p['text']}" for p in expected)
    assert details.scores == tuple(p["score"] for p in expected)
    assert details.queries == ("ilse varga film", "salt orchard")
    assert details.reasoning == "Find Varga's films first."
    assert details.observation == response.text[:512] and raw["error"] is None


def test_nothing_extra_by_default_and_errors_show_no_passages(retrieval_service):
    data = AgentData(1, TURN)
    call(tool(retrieval_service.url), {"queries": ["winter quay"]}, data)
    assert set(data.extra_fields[STEPS_KEY][0]) == {"turn", "queries", "hits", "error"}
    with pytest.raises(ValueError, match="record turn details"):
        parse_turn_details(data.extra_fields, "t")
    data = AgentData(1, "<tool_call>oops</tool_call>")
    call(
        tool(retrieval_service.url, record_turns=True),
        {"queries": [], "error": "the tool call must be a JSON list"},
        data,
    )
    (details,) = parse_turn_details(data.extra_fields, "t")
    assert details.passage_ids == () and details.error and details.observation.startswith("Error:")


def test_tool_config_carries_the_switch(tmp_path):
    import yaml

    retrieval = {
        "topk": 5,
        "initial_k": 50,
        "service": {
            "request_timeout_s": 9,
            "retries": 1,
            "max_query_chars": 9,
            "max_queries_per_request": 64,
        },
    }
    path = write_tool_config(
        tmp_path / "t.yaml",
        service_url="http://127.0.0.1:1",
        retrieval=retrieval,
        max_chars=100,
        max_queries_per_call=10,
        record_turns=True,
    )
    assert yaml.safe_load(path.read_text())["tools"][0]["config"]["record_turns"] is True
