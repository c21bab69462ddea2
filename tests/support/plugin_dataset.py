"""A dataset from a package outside the repository, as a researcher would add one: a package whose
entry point (group ``spader.datasets``) names one :class:`spader.datasets.Dataset`, made visible
to a process by putting its directory on ``PYTHONPATH`` (the ``.dist-info`` beside the package is
what ``importlib.metadata`` finds, no installation needed).

The dataset ``trivia``: JSON Lines records ``{"id", "q", "answers": [names], "topic"}``, train
and test in two release files, a ``meta`` field of its own (``topic``) and no questions in the
paper's mix (its entry's count is 0; a config overlay draws from it).
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

NAME = "trivia"
FILES = {"train": "trivia_train.jsonl", "test": "trivia_test.jsonl"}

#: The module the entry point names: only the entry (the registry loads it while the package's
#: configuration is being imported), the extractor named by its path.
ENTRY = f'''
from spader.datasets import Dataset, ReleaseFile, Split

DATASET = Dataset(
    name="{NAME}",
    title="Trivia",
    files=(
        ReleaseFile("{FILES["train"]}", "https://example.org/trivia/{FILES["train"]}"),
        ReleaseFile("{FILES["test"]}", "https://example.org/trivia/{FILES["test"]}"),
    ),
    train=Split("{FILES["train"]}"),
    test=Split("{FILES["test"]}"),
    extract="triviads.records:extract",
    layout="jsonl",
    meta={{"topic": "string"}},
    paper_count=0,
)
'''

#: The extractor: one raw record to ``(source id, question, alias groups, meta)``.
RECORDS = """
from spader.data.readers import optional, require
from spader.data.records import Drop


def extract(obj, src, line, split):
    answers = require(obj, "answers", list, src, line)
    if not answers:
        raise Drop("empty_answer_list")
    meta = {"topic": optional(obj, "topic", str, src, line)}
    return require(obj, "id", str, src, line), require(obj, "q", str, src, line), [[a] for a in answers], meta
"""


def write_package(root: Path, entry: str = "triviads:DATASET", module: str = ENTRY) -> Path:
    """``root/triviads/`` and ``root/triviads-0.1.dist-info/`` declaring ``trivia = <entry>``."""
    package = root / "triviads"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(textwrap.dedent(module))
    (package / "records.py").write_text(textwrap.dedent(RECORDS))
    info = root / "triviads-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: triviads\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[spader.datasets]\n{NAME} = {entry}\n")
    return root


def write_releases(root: Path, n: int = 8) -> dict[str, Path]:
    """The release files: ``n`` questions per split (the last of the train split without answers)."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, name in FILES.items():
        rows = [
            {
                "id": f"{split}-{i}",
                "q": f"Which cities lie on river {split} {i}?",
                "answers": [f"Town {i}", f"Port {i}"],
                "topic": "geo",
            }
            for i in range(n)
        ]
        if split == "train":
            rows[-1]["answers"] = []
        out[split] = root / name
        out[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def env_with(root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``root`` first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env
