"""The rollout engine as the training depends on it: a hung or dead engine stops the training with
a clear error (not episodes scored 0), every turn is counted (closed at a tag, run past it by the
engine), and each replica samples with its own seed (the training seed + its rank, as verl's vLLM
server), which the servers report and the step metrics show.

The episodes are real ``SpaderToolAgentLoop`` episodes against scripted servers (stand-ins for
sglang, which cannot run here) and the real search service; sglang's server class is replaced by a
fake base (``FakeSGLangServer``, named so) to check the seeded subclass."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")

from verl.workers.rollout.replica import TokenOutput

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from verl_episode import agent_episode, search_tool

from spader.integrations.verl.agent_loop import RolloutEngineError
from spader.integrations.verl.episode_metrics import SEED_FIELD, TURN_STATS, episode_metrics

GOLD = {"target": ["The Salt Orchard", "Winter Quay"], "entities": [["The Salt Orchard"], ["Winter Quay"]]}
QUESTION = "Which films did Ilse Varga direct?"


class SeededServer:
    """Stand-in for a rollout server: the next scripted turn, optionally followed by tokens past
    the closing tag (an engine that ignored the stop string), reported with its seed."""

    def __init__(self, tokenizer, turns, *, seed=None, tail=""):
        self.tokenizer, self.turns, self.seed, self.tail = tokenizer, list(turns), seed, tail

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        ids = self.tokenizer.encode(self.turns.pop(0) + self.tail, add_special_tokens=False)
        extra = {} if self.seed is None else {SEED_FIELD: self.seed}
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields=extra)


class HungServer:
    """A rollout engine that accepted the request and never answers."""

    async def generate(self, request_id, **kwargs):
        await asyncio.Event().wait()


class DeadServer:
    """A rollout engine whose Ray actor died."""

    async def generate(self, request_id, **kwargs):
        import ray.exceptions

        raise ray.exceptions.ActorDiedError()


def _episode(tokenizer, url, server, timeout_s=None):
    config = [] if timeout_s is None else [f"++spader_agent.rollout_timeout_s={timeout_s}"]
    return agent_episode(tokenizer, server, search_tool(url), question=QUESTION, gold=GOLD, config=config)


def test_a_hung_engine_stops_the_training_within_the_timeout(tokenizer, retrieval_service):
    start = time.monotonic()
    with pytest.raises(
        RolloutEngineError,
        match=r"did not answer a generation request within 1 s.*training.rollout_timeout_s",
    ):
        _episode(tokenizer, retrieval_service.url, HungServer(), timeout_s=1)
    assert time.monotonic() - start < 30


def test_a_dead_engine_stops_the_training_instead_of_scoring_episodes_zero(tokenizer, retrieval_service):
    with pytest.raises(
        RolloutEngineError, match="the rollout engine died during a generation .*ActorDiedError"
    ):
        _episode(tokenizer, retrieval_service.url, DeadServer())


TURNS = [
    '<think>look up the meadow</think><tool_call>["Quiet Meadow"]</tool_call>',
    '<think>done</think><answer>["The Salt Orchard"]</answer>',
]


def test_turns_and_the_engines_seed_are_counted_per_episode_and_step(tokenizer, retrieval_service):
    stopped = _episode(tokenizer, retrieval_service.url, SeededServer(tokenizer, TURNS, seed=8))
    ran_past = _episode(
        tokenizer, retrieval_service.url, SeededServer(tokenizer, TURNS, seed=9, tail=" and more")
    )
    unclosed = _episode(
        tokenizer, retrieval_service.url, SeededServer(tokenizer, ["I would rather not say."])
    )
    assert [stopped.extra_fields[k] for k in TURN_STATS] == [2, 2, 0]
    assert [ran_past.extra_fields[k] for k in TURN_STATS] == [2, 2, 2]  # cut at the tag by the loop
    assert [unclosed.extra_fields[k] for k in TURN_STATS] == [1, 0, 0]
    assert (stopped.extra_fields[SEED_FIELD], ran_past.extra_fields[SEED_FIELD]) == (8, 9)
    assert SEED_FIELD not in unclosed.extra_fields

    extra = [dict(o.extra_fields) for o in (stopped, ran_past, unclosed)]

    def get(*, keys, partition_id, select_fields):
        return {"extra_fields": extra}

    batch = SimpleNamespace(keys=list("abc"), partition_id="train", tags=[{}, {}, {}])
    m = episode_metrics(batch, get)
    assert m["episode/turns_closed"] == pytest.approx(4 / 5)
    assert m["episode/turns_cut"] == pytest.approx(2 / 5)
    assert (m["episode/rollout_seeds"], m["episode/rollout_seed_min"], m["episode/rollout_seed_max"]) == (
        2,
        8,
        9,
    )


class FakeSGLangServer:
    """FAKE of verl's ``SGLangHttpServer`` (sglang needs a GPU): its constructor keeps the rollout
    config and rank; its ``generate`` answers with what sglang's server arguments hold."""

    def __init__(self, config, model_config, rollout_mode=None, workers=None, replica_rank=0, **kwargs):
        self.config, self.replica_rank = config, replica_rank

    async def generate(self, *args, **kwargs):
        # what SGLangHttpServer.launch_server would have built from engine_kwargs.sglang
        self.tokenizer_manager = SimpleNamespace(
            server_args=SimpleNamespace(random_seed=self.config.engine_kwargs["sglang"]["random_seed"])
        )
        return TokenOutput(token_ids=[1], extra_fields={"global_steps": 3})


class FakeReplica:
    def __init__(self, *args, **kwargs):
        self.server_class = None


def test_each_sglang_replica_gets_the_seed_plus_its_rank(tiny_model):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import spader.integrations.verl.plugin  # noqa: F401
    from spader.integrations.verl import sglang_replica
    from spader.integrations.verl.compose import compose

    # verl's registry serves the rollout name sglang with the seeded replica
    assert RolloutReplicaRegistry._registry["sglang"] is sglang_replica.load_replica
    cfg = compose(
        "spader",
        [f"actor_rollout_ref.model.path={tiny_model}", "actor_rollout_ref.actor.data_loader_seed=5"],
    )
    server_cls, replica_cls = sglang_replica.seeded_classes(FakeSGLangServer, FakeReplica)
    seeds = []
    for rank in range(3):
        rollout = omega_conf_to_dataclass(
            OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.rollout, resolve=True))
        )
        server = server_cls(config=rollout, model_config=None, replica_rank=rank)
        out = asyncio.run(server.generate(prompt_ids=[1], sampling_params={}, request_id="r"))
        assert out.extra_fields["global_steps"] == 3
        seeds.append(out.extra_fields[SEED_FIELD])
    assert seeds == [5, 6, 7]
    assert replica_cls().server_class is not None  # a Ray remote class of the seeded server


def test_the_cpu_replica_samples_with_its_own_seed_and_hangs_on_request(tiny_model):
    """The transformers replica: seed + rank reported with every generation; with the test-only
    ``test_hang_after`` it stops answering, and the agent loop's watchdog turns that into the
    training's error."""
    from omegaconf import open_dict

    from spader.integrations.verl.agent_loop import TurnEndingServer
    from spader.integrations.verl.compose import compose
    from spader.integrations.verl.cpu.replica import TransformersServer

    def server(rank, hang=None):
        engine = "{threads:1,batch_wait_ms:5" + ("" if hang is None else f",test_hang_after:{hang}") + "}"
        cfg = compose(
            "spader",
            [
                f"actor_rollout_ref.model.path={tiny_model}",
                "actor_rollout_ref.rollout.name=transformers",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.actor.data_loader_seed=5",
                f"++actor_rollout_ref.rollout.engine_kwargs.transformers={engine}",
            ],
        )
        rollout = cfg.actor_rollout_ref.rollout
        with open_dict(rollout):
            rollout.prompt_length, rollout.response_length = 64, 8
        return TransformersServer(rollout, cfg.actor_rollout_ref.model, replica_rank=rank)

    params = {"temperature": 1.0, "max_new_tokens": 4}
    out = asyncio.run(server(1).generate(prompt_ids=[1, 2, 3], sampling_params=dict(params), request_id="a"))
    assert out.extra_fields[SEED_FIELD] == 6

    hung = server(0, hang=1)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    watched = TurnEndingServer(hung, tok, ("</answer>",), timeout_s=2)

    async def two():
        first = await watched.generate(request_id="a", prompt_ids=[1, 2], sampling_params=dict(params))
        assert first.extra_fields[SEED_FIELD] == 5
        await watched.generate(request_id="b", prompt_ids=[1, 2], sampling_params=dict(params))

    with pytest.raises(RolloutEngineError, match="did not answer a generation request within 2 s"):
        asyncio.run(two())
