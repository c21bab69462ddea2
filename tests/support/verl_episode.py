"""What the verl integration tests build the same way: our search tool over a retrieval URL, one
call of it, and one episode of our agent loop (``SpaderToolAgentLoop``) driven by a scripted
server manager (a fake of sglang's, which cannot run here; each test passes its own)."""

from __future__ import annotations

import asyncio
from typing import Any

from paper_verl import paper_overrides
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.dataset.rl_dataset import RLHFDataset

from spader.core.prompt import build_messages
from spader.integrations.verl.agent_loop import SpaderToolAgentLoop
from spader.integrations.verl.compose import compose
from spader.integrations.verl.search_tool import SearchTool
from spader.integrations.verl.tool_config import TOOL_SCHEMA


def search_tool(url: str, **overrides) -> SearchTool:
    """The search tool as the tool config builds it, with small test defaults."""
    config = {
        "type": "native",
        "retrieval_service_url": url,
        "topk": 2,
        "initial_k": 10,
        "timeout": 5,
        "retries": 0,
        "max_queries_per_call": 3,
        "max_query_chars": 1000,
        "max_chars": 2000,
        **overrides,
    }
    return SearchTool(config, OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA))


async def call_tool(tool: SearchTool, parameters, agent_data, entities) -> Any:
    """One tool call of one rollout, as the agent loop makes it (create, execute, release)."""
    instance, _ = await tool.create(create_kwargs={"entities": entities})
    try:
        return await tool.execute(instance, parameters, agent_data=agent_data)
    finally:
        await tool.release(instance)


def agent_episode(
    tokenizer,
    server,
    tool: SearchTool,
    *,
    question: str,
    gold: dict,
    config: list[str] = (),
    model_type: str = "qwen3",
    sampling: dict | None = None,
    response_length: int = 4096,
    global_steps: int = 1,
):
    """One real ``SpaderToolAgentLoop`` episode against ``server``; returns its output.

    Args:
        config: further overrides of the composed ``spader`` config.
        global_steps: the trainer's step, which verl's agent-loop worker passes with every row.
    """
    cfg = compose(
        "spader",
        [
            *paper_overrides("spader"),
            "actor_rollout_ref.model.path=/unused",
            "actor_rollout_ref.rollout.prompt_length=1024",
            f"actor_rollout_ref.rollout.response_length={response_length}",
            *config,
        ],
    )

    async def episode():
        # built inside the running event loop, as verl's AgentLoopWorker does
        loop = SpaderToolAgentLoop(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([tool]),
            hf_model_type=model_type,
        )
        return await loop.run(
            sampling or {"temperature": 1.0},
            raw_prompt=build_messages(question),
            reward_model={"ground_truth": gold},
            extra_info={},
            tools_kwargs={},
            global_steps=global_steps,  # verl's agent-loop worker passes the trainer's step
        )

    return asyncio.run(episode())
