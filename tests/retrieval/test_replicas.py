"""Reranker replicas: one per device, each batch's pairs spread over them (two CPU replicas stand in
for two GPUs: the same code path), results identical to one replica; the training job pins the
service's reranker to every GPU of the job."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from sections import search_settings

from spader.config import resolved_config
from spader.retrieval.backend import Bm25RerankBackend, SearchSettings
from spader.retrieval.replicas import parse_devices
from spader.retrieval.reranker import chunk_slices

REPO = Path(__file__).resolve().parents[2]
QUERIES = [
    "films directed by Ilse Varga",
    "river flowing into Lake Ørnes",
    "Saint-Malo Express album",
    "village church cheese market",
    "Lucene inverted index",
]


def test_parse_devices():
    assert parse_devices("cpu") == ("cpu",)
    assert parse_devices("cuda:0,cuda:1") == ("cuda:0", "cuda:1")
    assert parse_devices(["cuda:3", "cpu"]) == ("cuda:3", "cpu")
    for bad, message in (([], "at least one device"), ("gpu0", "'gpu0' is neither"), ("cuda:x", "neither")):
        with pytest.raises(ValueError, match=message):
            parse_devices(bad)
    assert search_settings(devices=["cpu", "cpu"]).devices == ("cpu", "cpu")
    with pytest.raises(ValueError, match=r"(?s)reranker\.devices.*input_value='tpu'"):
        SearchSettings.from_config({"reranker": {"devices": ["tpu"]}})


@pytest.mark.parametrize("n, replicas", [(1, 1), (7, 2), (100, 1), (100, 2), (5000, 1), (5000, 3), (9000, 8)])
def test_chunks_cover_the_pairs_once_in_equal_shares(n, replicas):
    chunks = chunk_slices(n, replicas)
    covered = np.concatenate([np.arange(n)[c] for c in chunks])
    assert covered.tolist() == list(range(n))
    sizes = [c.stop - c.start for c in chunks]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= 2048
    assert len(chunks) % replicas == 0 or len(chunks) == n  # every replica gets as many chunks
    assert chunk_slices(0, replicas) == []


@pytest.fixture(scope="module")
def one_and_two(bm25_index, tiny_reranker):
    settings = dict(reranker=str(tiny_reranker), fp16=False, rerank_batch_size=4, initial_k=8, topk=4)
    one = Bm25RerankBackend(bm25_index, search_settings(**settings, devices=["cpu"]), threads=2)
    two = Bm25RerankBackend(bm25_index, search_settings(**settings, devices="cpu,cpu"), threads=2)
    return one, two


def test_two_cpu_replicas_give_the_results_of_one(one_and_two, monkeypatch):
    one, two = one_and_two
    assert len(two.reranker.replicas) == 2 and two.describe()["reranker_device"] == "cpu,cpu"
    worked = []
    for r, replica in enumerate(two.reranker.replicas):
        original = replica.score_chunks

        def spy(chunks, *args, _r=r, _original=original):
            worked.append((_r, sum(c.stop - c.start for c in chunks)))
            return _original(chunks, *args)

        monkeypatch.setattr(replica, "score_chunks", spy)
    a = one.search(QUERIES, topk=4, initial_k=8)
    b = two.search(QUERIES, topk=4, initial_k=8)
    assert [[p.id for p in hits] for hits in a] == [[p.id for p in hits] for hits in b]
    np.testing.assert_allclose(
        [p.score for hits in a for p in hits], [p.score for hits in b for p in hits], rtol=0, atol=1e-5
    )
    pairs = sum(len(h) for h in one.candidates(QUERIES, topk=4, initial_k=8))
    shares = dict(worked)
    assert sorted(shares) == [0, 1] and sum(shares.values()) == pairs  # both replicas scored half
    assert abs(shares[0] - shares[1]) <= 1
    assert one.pairs_reranked == two.pairs_reranked


def test_a_failing_replica_fails_the_call(one_and_two, monkeypatch):
    _, two = one_and_two

    def broken(*args):  # FAKE: a device error inside one replica
        raise RuntimeError("CUDA error: out of memory (fake)")

    monkeypatch.setattr(two.reranker.replicas[1], "score_chunks", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        two.reranker.score([("query", "passage")] * 10)


def test_reranker_on_job_gpus():
    from spader.retrieval.service import reranker_on_job_gpus, serve_command

    cfg = resolved_config(REPO / "config" / "config.yaml")["retrieval"]
    job = reranker_on_job_gpus(cfg, 8)
    assert job["reranker"]["devices"] == [f"cuda:{i}" for i in range(8)]
    assert cfg["reranker"]["devices"] is None  # the input is not changed
    cmd = serve_command("idx", SearchSettings.from_config(job))
    assert cmd[cmd.index("--devices") + 1] == ",".join(f"cuda:{i}" for i in range(8))
    pinned = dict(cfg, reranker=dict(cfg["reranker"], devices=["cuda:1"]))
    assert reranker_on_job_gpus(pinned, 8)["reranker"]["devices"] == ["cuda:1"]
    off = dict(cfg, reranker=dict(cfg["reranker"], model=None))
    assert reranker_on_job_gpus(off, 8)["reranker"]["devices"] is None
    assert reranker_on_job_gpus(cfg, 0)["reranker"]["devices"] is None


class _Started(Exception):
    pass


@pytest.mark.slow
def test_training_job_pins_the_service_to_its_gpus(bm25_index, tmp_path):
    """run_training composes the verl launch, then starts the service: a FAKE service factory
    (no GPUs here) records the settings and stops the job before verl would start."""
    from spader.config import resolved_config
    from spader.demo.tiny import build_tiny_qwen3
    from spader.retrieval.service import serve_command
    from spader.training.run import TrainJob, run_training

    config = resolved_config(REPO / "config" / "config.yaml", verl_config_dir=REPO / "config" / "verl")
    for split in ("train", "val"):
        pl.DataFrame(
            {
                "data_source": ["qampari"],
                "prompt": [[{"role": "user", "content": "Which films did Ilse Varga direct?"}]],
                "reward_model": [{"style": "rule", "ground_truth": {"target": ["The Salt Orchard"]}}],
            }
        ).write_parquet(tmp_path / f"{split}.parquet")
    retrieval = json.loads(json.dumps(config["retrieval"]))
    retrieval["reranker"]["path"] = str(tmp_path / "reranker")
    job = TrainJob(
        backbone="tiny",
        variant="spader",
        backbone_spec={"model": "tiny:qwen3", "gpus": 4},
        variant_spec=config["variants"]["spader"],
        training=config["training"],
        retrieval=retrieval,
        train_file=tmp_path / "train.parquet",
        val_file=tmp_path / "val.parquet",
        index_dir=bm25_index,
        model_dir=build_tiny_qwen3(tmp_path / "qwen3"),
        verl_config_dir=REPO / "config" / "verl",
        workdir=tmp_path / "work",
        final_json=tmp_path / "final.json",
        threads=16,
    )
    seen = {}

    @contextlib.contextmanager
    def fake_service(index_dir, settings, *, log_path, threads):
        seen.update(settings=settings, threads=threads)
        raise _Started
        yield  # pragma: no cover

    with pytest.raises(_Started):
        run_training(job, service=fake_service, available_gpus=4)
    cmd = serve_command(bm25_index, seen["settings"], threads=seen["threads"])
    assert cmd[cmd.index("--devices") + 1] == "cuda:0,cuda:1,cuda:2,cuda:3"
    assert cmd[cmd.index("--threads") + 1] == "2"
