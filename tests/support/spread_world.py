"""A training world whose answers are spread over passages: finding more of them takes more searches.

Built with the project's own code like :mod:`cpu_world` (passages indexed by the real BM25
indexer, questions exported to verl's parquet by the data export, the tiny Qwen3 warm-started by
the demo's warm-start code), and trained by the same CPU training job (:func:`cpu_world.train_job`).

Each topic is a district with six villages; a passage names one village and where in the district
it lies, ``"Dunholka is a village in the north of Varbrek."``, and the search service returns the
two best passages per query. A search for ``"Varbrek north"`` shows the two northern villages,
``"Varbrek south"`` the southern ones, ``"Varbrek east"`` the eastern ones: a trajectory surfaces
two new villages per search, and all six only with three searches.

The warm start is scripted on the training questions with the project's prompt and observation
functions: the question, one, two or three searches (north, then south, then east), each
observation exactly as the search tool shows it, and an answer listing the villages the
observations showed. Each length is scripted equally often, so after its first observation the
policy searches again about two times in three, after its second about one time in two: it
searches and answers with what it read, and it has one choice that more entities reward - keep
searching - for reinforcement learning to move.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

from cpu_world import SHORT_TEMPLATE, TrainWorld, _retrieval_settings, indexed_corpus

FACETS = ("north", "south", "east")
PER_FACET = 2
TOPK = 2  # passages per query: one facet's villages
AGENT = {
    "max_turns": len(FACETS) + 2,  # room for a search more than the warm start ever makes
    "max_turn_tokens": 64,
    "max_tool_response_chars": 600,
    "max_queries_per_call": 1,
    "stop": ["</tool_call>", "</answer>"],
    "prompt_template": None,
}
_SYL = ["var", "hol", "bre", "mor", "dun", "kes", "tal", "ven", "ros", "lind", "ost", "sel", "gar", "nor"]
_END = ["a", "en", "ow", "ik", "is", "ov", "el", "ka"]


def _names(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < count:
        name = (rng.choice(_SYL) + rng.choice(_SYL) + rng.choice(_END)).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def topics(n: int, seed: int = 7) -> list[dict]:
    """``n`` districts, each ``{"subject", "villages": {facet: [names]}}``."""
    rng = random.Random(seed)
    taken: set[str] = set()
    out = []
    for subject in _names(rng, n, taken):
        names = _names(rng, len(FACETS) * PER_FACET, taken)
        villages = {f: names[i * PER_FACET : (i + 1) * PER_FACET] for i, f in enumerate(FACETS)}
        out.append({"subject": subject, "villages": villages})
    return out


def question(topic: dict) -> str:
    return f"Which villages are in {topic['subject']}?"


def query(topic: dict, facet: str) -> str:
    return f"{topic['subject']} {facet}"


def passages(all_topics: list[dict]) -> list[dict]:
    """One passage per village (chunk records of the dump's format)."""
    out = []
    for t, topic in enumerate(all_topics):
        for facet, names in topic["villages"].items():
            for name in names:
                page = 5000 + len(out)
                text = f"{name} is a village in the {facet} of {topic['subject']}."
                out.append(
                    {
                        "id": f"{page}__0",
                        "contents": f"{name} {text}",
                        "meta": {"title": name, "content": text, "page_id": str(page), "topic": t},
                    }
                )
    return out


def scripted(topic: dict, searches: int, search, template) -> list[dict]:
    """One scripted episode with ``searches`` searches (the first facets in order), its
    observations from ``search`` as the tool renders them, and an answer naming every village
    they showed, first seen first."""
    from spader.core.matching import passage_hits
    from spader.core.prompt import fit_observation, observation_message
    from spader.demo.trajectories import answer_text, search_text

    gold = [[n] for names in topic["villages"].values() for n in names]
    messages = list(template.messages(question(topic)))
    found: list[int] = []
    for facet in FACETS[:searches]:
        q = query(topic, facet)
        messages.append({"role": "assistant", "content": search_text([q])})
        text, shown = fit_observation([q], search([q]), AGENT["max_tool_response_chars"])
        messages.append(observation_message(text))
        for k in sorted(passage_hits(shown, gold), key=lambda k: text.find(gold[k][0])):
            if k not in found:
                found.append(k)
    messages.append({"role": "assistant", "content": answer_text([gold[k][0] for k in found])})
    return messages


def build_world(
    root: str | os.PathLike,
    *,
    n_train: int = 4,
    n_val: int = 2,
    warm_steps: int = 120,
    warm_lr: float = 3e-3,
) -> TrainWorld:
    """Write the world under ``root``: index, parquet files, base and warm-started models."""
    import polars as pl
    import torch  # noqa: F401  (loaded before the JVM: torch loaded after it crashes the process)

    from spader.core.prompt import PromptTemplate
    from spader.data.export import verl_rows
    from spader.retrieval.backend import Bm25RerankBackend, SearchSettings

    root = Path(root)
    all_topics = topics(n_train + n_val)
    index = indexed_corpus(root, passages(all_topics))

    template = PromptTemplate(SHORT_TEMPLATE, source="spread training world")
    records = [
        {
            "id": f"spread:{i}",
            "dataset": "qampari",
            "question": question(t),
            "answers": [[n] for names in t["villages"].values() for n in names],
        }
        for i, t in enumerate(all_topics)
    ]
    paths = {}
    for split, rows in (("train", records[:n_train]), ("val", records[n_train:])):
        paths[split] = root / f"{split}.parquet"
        verl_rows(pl.DataFrame(rows), split, template).write_parquet(paths[split])

    retrieval = _retrieval_settings()
    retrieval["topk"] = TOPK
    base, model = root / "base", root / "warm"
    if not (model / "config.json").exists():  # built once per directory
        backend = Bm25RerankBackend(index, SearchSettings.from_config(retrieval), threads=1)

        def search(queries):
            found = backend.search(list(queries), topk=TOPK, initial_k=int(retrieval.get("initial_k", 50)))
            return [[p.to_dict() for p in ps] for ps in found]

        conversations = [
            scripted(t, k, search, template) for t in all_topics[:n_train] for k in range(1, len(FACETS) + 1)
        ]
        (root / "warmstart.jsonl").write_text(
            "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in conversations), encoding="utf-8"
        )
        _warm_start(conversations, base, model, warm_steps, warm_lr)
    return TrainWorld(
        root=root,
        train=paths["train"],
        val=paths["val"],
        index=index,
        base_model=base,
        model=model,
        retrieval=retrieval,
        agent=dict(AGENT),
        questions=records,
    )


def _warm_start(conversations, base: Path, model: Path, steps: int, lr: float) -> None:
    from spader.demo.tiny import TINY_MARKER, build_tiny_qwen3
    from spader.demo.warmstart import WarmstartSettings, train_warmstart

    build_tiny_qwen3(base, kv_heads=1)  # the shape this world's margins were measured with
    settings = WarmstartSettings(
        steps=steps, batch_size=len(conversations), lr=lr, warmup_ratio=0.05, first_turn_examples=False
    )
    train_warmstart(base, conversations, model, settings, threads=2, progress=False)
    shutil.copy(base / TINY_MARKER, model / TINY_MARKER)
