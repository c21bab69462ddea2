"""The bundled CPU demo data (``resources/demo/``), regenerated with ``python -m spader.demo <dir>``.

A small fictional world (:mod:`spader.demo.world`) written out in the real formats: the QAMPARI
Wikipedia chunk dump (``chunked_wikipedia.tar.gz``, docs/data.md 1.4) and each dataset's release files
(:mod:`spader.demo.releases`), beside the topic of each test question (``topics.tsv``,
:mod:`spader.evaluation.topics`: ``evaluation.topics`` of config/demo.yaml). The output is
deterministic byte for byte, so the committed files can be compared with a fresh regeneration.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path

from spader.data.layout import dump_jsonl, dump_mintaka_json
from spader.demo.archive import write_tar_gz, write_zip
from spader.demo.releases import held_out_topics, mintaka_splits, qampari_splits, quest_splits, webqsp_splits
from spader.demo.world import EVAL_TOPICS, SEED, World, build_world

log = logging.getLogger(__name__)

__all__ = ["DEMO_FILES", "chunk_lines", "generate"]

DEMO_FILES = (
    "chunked_wikipedia.tar.gz",
    "qampari.zip",
    "mintaka_train.json",
    "mintaka_dev.json",
    "mintaka_test.json",
    "WebQSP.zip",
    "quest/train_aug.jsonl",
    "quest/val.jsonl",
    "quest/test.jsonl",
    "topics.tsv",
)

_CHUNK_FILES = 3


def chunk_lines(world: World) -> list[dict]:
    """The world's passages, both sides, as chunk records (docs/data.md 1.4 line format)."""
    out = []
    for i, p in enumerate(world.corpus):
        out.append(
            {
                "id": p.id,
                "contents": f"{p.title} {p.text}",
                "meta": {
                    "revid": str(900_000 + i),
                    "url": f"https://en.wikipedia.org/wiki?curid={p.page_id}",
                    "title": p.title,
                    "file_path": f"text/AA/wiki_{i % _CHUNK_FILES:02d}",
                    "page_id": str(p.page_id),
                    "content": p.text,
                    "chunk_id": p.id,
                },
            }
        )
    return out


def generate(outdir: str | os.PathLike, seed: int = SEED) -> list[Path]:
    """Write the demo corpus and release files under ``outdir``.

    Returns:
        The written paths (:data:`DEMO_FILES` under ``outdir``).
    """
    out = Path(outdir)
    (out / "quest").mkdir(parents=True, exist_ok=True)
    world = build_world(seed, n_eval=EVAL_TOPICS)
    rng = random.Random(seed + 1)

    lines = chunk_lines(world)
    chunks = {
        f"wikipedia_chunks/chunks_v5/wikipedia_chunks_{k}.jsonl": dump_jsonl(lines[k::_CHUNK_FILES]).encode()
        for k in range(_CHUNK_FILES)
    }
    write_tar_gz(out / "chunked_wikipedia.tar.gz", chunks)

    qampari = qampari_splits(world)
    write_zip(
        out / "qampari.zip",
        {f"qampari_data/{s}_data.jsonl": dump_jsonl(r).encode() for s, r in qampari.items()},
    )
    mintaka = mintaka_splits(world, rng)
    for split, records in mintaka.items():
        (out / f"mintaka_{split}.json").write_text(dump_mintaka_json(records), encoding="utf-8")
    webqsp = webqsp_splits(world)
    write_zip(
        out / "WebQSP.zip",
        {
            f"WebQSP/data/WebQSP.{s}.json": json.dumps(doc, indent=2, ensure_ascii=False).encode()
            for s, doc in webqsp.items()
        },
    )
    quest = quest_splits(world)
    for split, records in quest.items():
        (out / "quest" / f"{split}.jsonl").write_text(dump_jsonl(records), encoding="ascii")
    # the topic of each test question (spader.evaluation.topics: header, then "id<TAB>topic")
    topics = held_out_topics(world, qampari["test"], mintaka["test"], webqsp["test"], quest["test"])
    lines = ["id\ttopic", *(f"{qid}\t{topic}" for qid, topic in topics)]
    (out / "topics.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths = [out / name for name in DEMO_FILES]
    log.info("demo: %d passages, %d files under %s", len(lines), len(paths), out)
    return paths
