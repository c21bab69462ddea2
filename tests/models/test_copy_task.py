"""The warm start's copying task (spader.demo.sft): the batches it trains on, its settings, and that
a few steps of it run on the tiny models of both shapes. Whether it teaches the demo's policy to
write names it read is measured on the demo (docs/cpu-training.md)."""

from __future__ import annotations

import random

import pytest
import torch

from spader.demo.sft import WarmstartSettings, copy_batch, copy_vocabulary, train_warmstart


def test_copy_vocabulary_is_the_name_pieces_tokens(tokenizer):
    vocabulary = copy_vocabulary(tokenizer)
    assert vocabulary == sorted(set(vocabulary))
    assert not set(vocabulary) & set(tokenizer.all_special_ids)
    pieces = set(tokenizer("Var", add_special_tokens=False)["input_ids"])
    assert pieces <= set(vocabulary)


def test_a_copy_row_repeats_its_span_and_labels_only_the_repeat():
    vocabulary = list(range(100, 160))
    ids, labels, sources = copy_batch(vocabulary, 8, 32, random.Random(3))
    assert ids.shape == labels.shape == sources.shape and ids.shape[0] == 8
    for row in range(8):
        labelled = (labels[row] != -100).nonzero().flatten().tolist()
        assert labelled, row
        first, last = labelled[0], labelled[-1]
        span = last - first + 2  # the repeat's first token is not labelled (nothing predicts it)
        assert 8 <= span <= 16  # copy_length // 4 .. copy_length // 2
        repeat = ids[row, first - 1 : last + 1]
        assert torch.equal(repeat, ids[row, first - 1 - span : last + 1 - span])  # the span, again
        assert torch.equal(labels[row, first : last + 1], ids[row, first : last + 1])
        # every source is the earlier occurrence of the token at its position
        for pos in (sources[row] >= 0).nonzero().flatten().tolist():
            assert ids[row, sources[row, pos]] == ids[row, pos] and sources[row, pos] == pos - span
        assert int(ids[row].max()) < 160  # padding is 0, tokens come from the vocabulary
        assert set(ids[row, : last + 1].tolist()) <= set(vocabulary)


@pytest.mark.parametrize(
    ("key", "value"),
    [("copy_weight", -1.0), ("copy_attention_weight", -0.5), ("copy_length", 4), ("copy_batch_size", 0)],
)
def test_bad_copy_settings_are_refused(key, value):
    with pytest.raises(ValueError, match=key):
        WarmstartSettings(**{key: value})


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_warm_start_with_the_copying_task_trains_and_reports_it(tmp_path, kv_heads):
    from spader.demo.tiny import build_tiny_qwen3

    base = build_tiny_qwen3(tmp_path / "base", kv_heads=kv_heads)
    conversation = [
        {"role": "user", "content": "Which villages are in the Varbrek district?"},
        {"role": "assistant", "content": '<answer>["Dunholka"]</answer>'},
    ]
    settings = WarmstartSettings(steps=3, batch_size=1, copy_weight=1.0, copy_batch_size=2, copy_length=16)
    metrics = train_warmstart(base, [conversation], tmp_path / "out", settings, threads=1, progress=False)
    assert metrics["copy_loss_first"] is not None and metrics["copy_loss_last"] is not None
    assert len(metrics["losses"]) == 3 and all(map(torch.isfinite, torch.tensor(metrics["losses"])))
    without = train_warmstart(
        base, [conversation], tmp_path / "plain", WarmstartSettings(steps=3, batch_size=1), progress=False
    )
    assert without["copy_loss_first"] is None
