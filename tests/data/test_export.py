"""Exports: the verl training parquet (read back the way verl reads it, and by verl's RLHFDataset
itself) and the per-dataset evaluation files."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import polars as pl
import pytest

from spader.core.prompt import build_messages
from spader.core.text import normalize
from spader.data import (
    EVAL_SCHEMA,
    MIX_SCHEMA,
    VERL_SCHEMA,
    eval_rows,
    export_eval_set,
    export_rl_dataset,
    verl_rows,
)
from spader.data.records import META_FIELDS, record_schema, records_frame, to_mix_meta, write_frame


def rec(dataset: str, rid: str, question: str, answers: list[list[str]]) -> dict:
    meta = {k: None for k in META_FIELDS[dataset]}
    meta["source_file"] = "x"
    return {
        "id": f"{dataset}:{rid}",
        "dataset": dataset,
        "split": "train",
        "question": question,
        "answers": answers,
        "answers_norm": [list(dict.fromkeys(normalize(a) for a in e)) for e in answers],
        "meta": meta,
    }


MIX = [
    rec(
        "qampari",
        "1__wikidata_simple__train",
        "Which films were directed by Ilse Varga?",
        [["The Salt Orchard", "Salt Orchard", "A sós gyümölcsös"], ["Winter Quay"]],
    ),
    rec(
        "quest",
        "train:00004",
        "Films directed by Teodor Hask or Marta Velling",
        [["Heat", "Heat (1961 film)", "Heat (1975 film)"], ["Quiet Archive", "Quiet Archive (1950 film)"]],
    ),
]


def mix_frame(records):
    parts = [to_mix_meta(records_frame([r], record_schema(r["dataset"])), r["dataset"]) for r in records]
    return pl.concat(parts)


def test_verl_rows_record_by_record():
    from spader.core.prompt import load_template

    # the prompt's messages, as agent.prompt_role sends them: one user message is an option
    (one,) = verl_rows(mix_frame(MIX[:1]), "train", load_template(role="user")).to_dicts()[0]["prompt"]
    assert one["role"] == "user" and one["content"].startswith("Answer the question below.")
    rows = verl_rows(mix_frame(MIX), "train")
    assert rows.schema == VERL_SCHEMA
    got = rows.to_dicts()
    assert got[1] == {
        "data_source": "quest",
        "prompt": build_messages("Films directed by Teodor Hask or Marta Velling"),  # system, then user
        "ability": "multi-answer-qa",
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "target": ["Heat", "Quiet Archive"],  # one canonical name per entity: a flat list of strings
                "entities": [
                    ["Heat", "Heat (1961 film)", "Heat (1975 film)"],
                    ["Quiet Archive", "Quiet Archive (1950 film)"],
                ],
            },
        },
        "extra_info": {
            "index": 1,
            "split": "train",
            "id": "quest:train:00004",
            "question": "Films directed by Teodor Hask or Marta Velling",
            "need_tools_kwargs": True,
            "tools_kwargs": {
                "search": {
                    "create_kwargs": {
                        "entities": [
                            ["Heat", "Heat (1961 film)", "Heat (1975 film)"],
                            ["Quiet Archive", "Quiet Archive (1950 film)"],
                        ],
                        "data_source": "quest",
                        "id": "quest:train:00004",
                    }
                }
            },
        },
    }
    assert got[0]["prompt"][-1]["content"] == "Question: Which films were directed by Ilse Varga?"
    assert got[0]["extra_info"]["index"] == 0


def _write_mix(tmp_path):
    train = write_frame(mix_frame(MIX), tmp_path / "mix" / "train.jsonl", MIX_SCHEMA)
    val = write_frame(mix_frame(MIX[:1]), tmp_path / "mix" / "val.jsonl", MIX_SCHEMA)
    out = tmp_path / "verl" / "train.parquet", tmp_path / "verl" / "val.parquet"
    assert export_rl_dataset(train, val, *out) == {"train": 2, "val": 1}
    return out


def test_parquet_reads_back_through_datasets(tmp_path):
    import datasets

    train, val = _write_mix(tmp_path)
    ds = datasets.load_dataset("parquet", data_files=str(train), cache_dir=str(tmp_path / "cache"))["train"]
    row = ds[0]
    assert row["data_source"] == "qampari"
    assert row["reward_model"]["ground_truth"]["entities"][0] == [
        "The Salt Orchard",
        "Salt Orchard",
        "A sós gyümölcsös",
    ]
    assert (
        row["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]["id"]
        == "qampari:1__wikidata_simple__train"
    )
    assert pl.read_parquet(val)["extra_info"].struct.field("split").to_list() == ["val"]


@pytest.mark.slow
def test_verl_rlhf_dataset_lifts_tools_kwargs(tmp_path):
    """verl's own dataset class (run in a subprocess: the pure core's tests must not import verl)."""
    train, _ = _write_mix(tmp_path)
    script = textwrap.dedent(
        """
        import json, sys
        from omegaconf import OmegaConf
        from transformers import AutoTokenizer
        from verl.utils.dataset.rl_dataset import RLHFDataset
        from spader.demo.tiny import build_tiny_qwen3

        tok = AutoTokenizer.from_pretrained(build_tiny_qwen3(sys.argv[2]))
        cfg = OmegaConf.create({"cache_dir": sys.argv[3], "max_prompt_length": 4096,
                                "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1})
        ds = RLHFDataset(sys.argv[1], tok, cfg)
        item = ds[1]
        out = {"n": len(ds), "index": item["index"], "data_source": item["data_source"],
               "tools_kwargs": item["tools_kwargs"], "raw_prompt": item["raw_prompt"],
               "target": list(item["reward_model"]["ground_truth"]["target"])}
        print("RESULT " + json.dumps(out, default=lambda x: x.tolist()))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(train), str(tmp_path / "tok"), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert out["n"] == 2 and out["index"] == 1 and out["data_source"] == "quest"
    assert out["tools_kwargs"]["search"]["create_kwargs"]["entities"][0] == [
        "Heat",
        "Heat (1961 film)",
        "Heat (1975 film)",
    ]
    assert out["raw_prompt"] == build_messages(MIX[1]["question"])  # the system message, then the user turn
    assert out["target"] == ["Heat", "Quiet Archive"]


TEST = [
    rec("webqsp", f"WebQTest-{i}", f"what is thing {i}", [[f"Thing {i}"], [f"Other {i}"]]) for i in range(12)
]


def test_eval_rows_record_by_record():
    df = records_frame([TEST[3], TEST[1], TEST[3]], record_schema("webqsp"))  # a duplicate id
    rows = eval_rows(df)
    assert rows.schema == EVAL_SCHEMA
    assert rows.to_dicts() == [
        {
            "id": "webqsp:WebQTest-1",
            "question_text": "what is thing 1",
            "ground_truth": [["Thing 1"], ["Other 1"]],
            "data_source": "webqsp",
        },
        {
            "id": "webqsp:WebQTest-3",
            "question_text": "what is thing 3",
            "ground_truth": [["Thing 3"], ["Other 3"]],
            "data_source": "webqsp",
        },
    ]


def test_eval_limit_is_a_seeded_sample_sorted_by_id(tmp_path):
    src = write_frame(
        records_frame(TEST[::-1], record_schema("webqsp")), tmp_path / "test.jsonl", record_schema("webqsp")
    )
    out = tmp_path / "eval" / "webqsp.jsonl"
    assert export_eval_set(src, out, "webqsp", limit=5, seed=9) == 5
    ids = sorted(r["id"] for r in TEST)
    expected = [ids[i] for i in sorted(random.Random(9).sample(range(12), 5))]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in lines] == expected
    assert all(list(r) == ["id", "question_text", "ground_truth", "data_source"] for r in lines)
    assert export_eval_set(src, out, "webqsp", limit=None) == 12
    assert export_eval_set(src, out, "webqsp", limit=50) == 12
