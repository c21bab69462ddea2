"""The ``transformers`` rollout replica's server and weight adapter, in process, with the real tiny
Qwen3 and verl's own rollout and model configs: verl's generate contract (token budget as verl's
sglang server derives it, TokenOutput with log-probs), concurrent requests decoded together,
reproducible rollouts from the rollout seed, and weights received from the trainer.

The Ray actor handle through which the adapter reaches the server is replaced by
``_FakeActorHandle`` (a fake, named so): it calls the same server object in process, so the test
needs no Ray cluster. The Ray path itself runs in the end-to-end training tests."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch
from omegaconf import open_dict

from spader.integrations.verl.compose import compose
from spader.integrations.verl.cpu.replica import TransformersServer, TransformersServerAdapter


@pytest.fixture(scope="module")
def configs(tiny_model):
    cfg = compose(
        "spader",
        [
            f"actor_rollout_ref.model.path={tiny_model}",
            "actor_rollout_ref.rollout.name=transformers",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "data.max_prompt_length=64",
            "data.max_response_length=40",
            "++actor_rollout_ref.rollout.engine_kwargs.transformers={threads:1,batch_wait_ms:20}",
        ],
    )
    rollout, model = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model
    with open_dict(rollout):
        rollout.prompt_length, rollout.response_length = 64, 40  # verl copies these from data.*
    return rollout, model


def _server(configs):
    return TransformersServer(configs[0], configs[1], replica_rank=0)


def _prompt(server, text: str) -> list[int]:
    tok = server.engine.tokenizer
    return tok(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


async def _generate_all(server, prompts, params):
    return await asyncio.gather(
        *[
            server.generate(prompt_ids=p, sampling_params=dict(params), request_id=f"r{i}")
            for i, p in enumerate(prompts)
        ]
    )


def test_concurrent_requests_are_decoded_together_with_verls_budget(configs):
    server = _server(configs)
    prompts = [_prompt(server, f"Question {i}") for i in range(3)] * 2
    outs = asyncio.run(_generate_all(server, prompts, SAMPLING))
    stats = server.get_stats()
    assert stats["requests"] == 6 and stats["batches"] < 6  # gathered into shared forward batches
    for p, out in zip(prompts, outs, strict=True):
        # no max_tokens: min(response_length, prompt_length + response_length - len(prompt))
        budget = min(40, 64 + 40 - len(p))
        assert 0 < len(out.token_ids) <= budget and len(out.log_probs) == len(out.token_ids)
        # the replica reports the seed it samples with: the rollout's seed + its rank (0 here)
        assert out.stop_reason in ("stop", "length")
        assert out.extra_fields == {"global_steps": None, "rollout_seed": int(configs[0].seed)}
        assert all(lp <= 0.0 for lp in out.log_probs)
    # the two rollouts of one prompt sample differently (distinct derived seeds)
    assert outs[0].token_ids != outs[3].token_ids
    # an explicit budget and stop string are honoured; a prompt beyond the context is refused
    tok = server.engine.tokenizer
    stop_out = asyncio.run(
        server.generate(
            prompt_ids=prompts[0], sampling_params={"max_tokens": 5, "temperature": 0}, request_id="b"
        )
    )
    assert len(stop_out.token_ids) <= 5
    text = tok.decode(outs[0].token_ids, skip_special_tokens=False)
    if len(text) > 3:
        cut = asyncio.run(
            server.generate(
                prompt_ids=prompts[0],
                sampling_params={**SAMPLING, "stop": [text[:3]], "seed": 1},
                request_id="c",
            )
        )
        assert cut.stop_reason in ("stop", "length")
    with pytest.raises(ValueError, match="exceeds the model's context"):
        asyncio.run(
            server.generate(prompt_ids=[1] * (server.max_model_len + 1), sampling_params={}, request_id="d")
        )
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(
            server.generate(prompt_ids=prompts[0], sampling_params={}, request_id="e", image_data=[object()])
        )


def test_rollouts_are_reproducible_from_the_rollout_seed(configs):
    prompts = None
    results = []
    for _ in range(2):
        server = _server(configs)
        prompts = prompts or [_prompt(server, "Which rivers?")] * 4 + [_prompt(server, "Which films?")] * 4
        outs = asyncio.run(_generate_all(server, prompts, SAMPLING))
        results.append(Counter(tuple(o.token_ids) for o in outs))
    assert results[0] == results[1]  # the same multiset of rollouts, whatever the arrival order
    assert len(results[0]) > 2


class _FakeActorHandle:
    """FAKE Ray actor handle: ``handle.method.remote(...)`` awaits the in-process server's method."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name):
        method = getattr(self.target, name)

        class _Remote:
            @staticmethod
            def remote(*args, **kwargs):
                return method(*args, **kwargs)

        return _Remote


def test_the_adapter_loads_the_trainers_weights_into_the_rollout_model(configs):
    server = _server(configs)
    model = server.engine.model
    prompt = _prompt(server, "Which rivers?")
    greedy = {"temperature": 0, "max_tokens": 12}
    before = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=greedy, request_id="a")).token_ids
    # the trainer's weights: the same names, different values (as after an update)
    g = torch.Generator().manual_seed(0)
    new = {k: torch.randn(v.shape, generator=g) * 0.5 for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # one tensor under two names, as the actor sends it
        new["lm_head.weight"] = new["model.embed_tokens.weight"]
    adapter = TransformersServerAdapter(configs[0], configs[1], device_mesh=None)
    assert adapter.is_leader_rank and adapter.replica_rank == 0
    adapter._server = _FakeActorHandle(server)
    asyncio.run(adapter.update_weights(iter(new.items()), global_steps=3))
    for k, v in model.state_dict().items():
        assert torch.equal(v, new[k]), k
    after = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=greedy, request_id="b"))
    assert after.extra_fields["global_steps"] == 3 and after.token_ids != before
    with pytest.raises(ValueError, match="does not have"):
        asyncio.run(adapter.update_weights(iter([("no.such.weight", torch.zeros(1))])))
    with pytest.raises(NotImplementedError, match="delta_flush"):
        asyncio.run(adapter.update_weights(iter([]), wire_format="delta_flush"))
