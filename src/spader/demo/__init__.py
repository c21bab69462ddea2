"""The bundled CPU demo data (``resources/demo/``), regenerated with ``spader demo <dir>``.

A small fictional world (:mod:`spader.demo.world`) written out in the real formats: the QAMPARI
Wikipedia chunk dump (``chunked_wikipedia.tar.gz``, docs/data.md, "The chunked Wikipedia corpus")
and each dataset's release files, by the ``demo_writer`` of its registry entry
(:mod:`spader.datasets`; the paper's are in :mod:`spader.demo.releases`), beside the topic of each
test question (``topics.tsv``, :mod:`spader.evaluation.topics`: ``evaluation.topics`` of
config/demo.yaml). The output is
deterministic byte for byte, so the committed files can be compared with a fresh regeneration.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

from spader.data.layout import dump_jsonl
from spader.datasets import registry
from spader.demo.archive import write_tar_gz
from spader.demo.releases import held_out_topics
from spader.demo.world import EVAL_TOPICS, SEED, World, build_world

log = logging.getLogger(__name__)

__all__ = ["DEMO_FILES", "chunk_lines", "generate"]

#: What :func:`generate` writes for the paper's datasets (resources/demo, committed).
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
    """The world's passages, both sides, as chunk records (the line format of docs/data.md, "The
    chunked Wikipedia corpus")."""
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
    """Write the demo corpus and, for each dataset of the registry that has a demo writer, its
    release files under ``outdir``.

    Returns:
        The written paths (for the paper's datasets, :data:`DEMO_FILES` under ``outdir``).
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    world = build_world(seed, n_eval=EVAL_TOPICS)
    rng = random.Random(seed + 1)

    lines = chunk_lines(world)
    chunks = {
        f"wikipedia_chunks/chunks_v5/wikipedia_chunks_{k}.jsonl": dump_jsonl(lines[k::_CHUNK_FILES]).encode()
        for k in range(_CHUNK_FILES)
    }
    write_tar_gz(out / "chunked_wikipedia.tar.gz", chunks)
    names = ["chunked_wikipedia.tar.gz"]
    for entry in registry().values():  # in the registry's order, each drawing from one generator
        writer = entry.writer()
        if writer is not None:
            names += writer(out, world, rng)
    # the topic of each test question (spader.evaluation.topics: header, then "id<TAB>topic"),
    # read from the test splits as written
    topics = held_out_topics(world, out)
    lines = ["id\ttopic", *(f"{qid}\t{topic}" for qid, topic in topics)]
    (out / "topics.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    names.append("topics.tsv")
    paths = [out / name for name in names]
    log.info("demo: %d passages, %d files under %s", len(lines), len(paths), out)
    return paths
