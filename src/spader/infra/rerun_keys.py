"""What each configuration key reruns: the one classification the workflow's params follow.

Snakemake reruns a job when one of its params or its set of input files changed, and then every
job downstream of it (the project's default profile, ``profiles/default/config.yaml``, leaves
modification times of scripts out). So a key reruns exactly the jobs whose params carry it and
what depends on them. :data:`TABLE` states, for every key of the typed model
(:mod:`spader.config.model`), the rules that rerun when its value changes, on the paper's DAG and,
where the demo has rules the paper has not (the warm start), on the demo's. The workflow builds
its params from it (:func:`for_rule`: a rule's param drops the keys that do not rerun that rule,
so operational settings reach no job and table-only settings reach only the tables), params are
compared as canonical values (:func:`canonical`: sorted keys, values in the model's types, so
``beta: 4`` and ``beta: 4.0`` are one value), and ``tests/workflow/test_rerun_keys.py`` changes
every key of the model to another valid value, asks Snakemake what it would run against a
finished state, and compares with :data:`TABLE`.

``spader rerun-keys write`` (alias ``python -m spader.infra.rerun_keys write``) renders the table
into ``docs/running.md`` (``check`` fails when the file is out of date).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spader.datasets import registry

__all__ = [
    "HELP",
    "LISTS",
    "ORDERED",
    "SET",
    "TABLE",
    "Rerun",
    "add_arguments",
    "canonical",
    "entry",
    "for_rule",
    "list_kind",
    "main",
    "render_table",
    "reruns_nothing",
    "run",
    "walked_on_demo",
    "walked_on_paper",
]

# --- rule sets -----------------------------------------------------------------------------------
_TRAINED = ("train_policy", "export_checkpoint", "evaluate_policy", "aggregate_results")
_EVALUATED = ("evaluate_policy", "aggregate_results")
_SEARCHED = ("build_evidence", *_TRAINED)  # the paper's jobs that search: evidence, training, evaluation
_WARM = ("warmstart_policy", *_TRAINED)  # the demo's: the warm start, then every policy
_MIXED = ("mix_training_set", "export_rl_dataset", *_SEARCHED)  # the training mix and what reads it
_INDEX = ("build_bm25_index", *_SEARCHED)
NOTHING: tuple[str, ...] = ()

#: Every rule of the paper's DAG, and of the demo's (tiny models built locally, a warm start, no
#: StepSearch evidence, no hub download).
PAPER_RULES = frozenset(
    {
        "download_dump",
        "build_bm25_index",
        "download_dataset",
        "normalize_dataset",
        "mix_training_set",
        "export_rl_dataset",
        "export_eval_set",
        "download_model",
        "build_evidence",
        *_TRAINED,
    }
)
DEMO_RULES = frozenset(
    PAPER_RULES - {"download_model", "build_evidence"} | {"build_tiny_model", "warmstart_policy"}
)


@dataclass(frozen=True)
class Rerun:
    """The rules that rerun when one of ``keys`` changes.

    Attributes:
        keys: model keys, dotted; ``*`` stands for a name the user chooses (a backbone, a variant,
            a release file).
        paper: rules of the paper's DAG that rerun (None: the paper's config has no such key).
        why: the reason, one line (rendered into the docs).
        demo: rules of the demo's DAG that rerun, for keys walked there too (None: not walked).
        scope: which jobs of those rules rerun, when not all of them (rendered into the docs).
        walked_on: for keys of one class that several sections share, the one instance the
            rerun test changes (the others are not walked).
    """

    keys: tuple[str, ...]
    paper: tuple[str, ...] | None
    why: str
    demo: tuple[str, ...] | None = None
    scope: str = ""
    walked_on: str = ""


#: The datasets of the registry; those that keep both splits in one release file (a change of
#: where it comes from reruns the evaluation set too), and the others.
_DATASETS = tuple(registry())
_ONE_FILE = tuple(d.name for d in registry().values() if d.train.file == d.test.file)
_TWO_FILES = tuple(d.name for d in registry().values() if d.train.file != d.test.file)


def _each(key: str, datasets: Sequence[str] = _DATASETS) -> tuple[str, ...]:
    """``key`` (with ``<d>``) for each dataset."""
    return tuple(key.replace("<d>", d) for d in datasets)


def _titles(datasets: Sequence[str]) -> str:
    """``QAMPARI and WebQSP``."""
    titles = [registry()[d].title for d in datasets]
    return " and ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 1 else titles)


_TRAIN = ("normalize_dataset", *_MIXED)
_TEST = ("normalize_dataset", "export_eval_set", *_MIXED)
_SOURCE_ROWS = (
    Rerun(
        (*_each("datasets.<d>.files.*.url", _ONE_FILE), *_each("datasets.<d>.files.*.hub", _ONE_FILE)),
        ("download_dataset", *_TEST),
        "where a release file comes from: its download, then what is built from it "
        f"({_titles(_ONE_FILE)} keep both splits in one file)",
        scope="that dataset",
    ),
    Rerun(
        (*_each("datasets.<d>.files.*.url", _TWO_FILES), *_each("datasets.<d>.files.*.hub", _TWO_FILES)),
        ("download_dataset", *_TRAIN),
        "where a release file comes from: its download, then what is built from it (walked: the train "
        f"split's file of {_titles(_TWO_FILES)})",
        scope="that dataset",
    ),
)
_DATASET_ROWS = (
    *(row for row in _SOURCE_ROWS if row.keys),  # a group without datasets has no row
    Rerun(
        _each("datasets.<d>.splits.train.file"),
        ("download_dataset", *_TRAIN),
        "another release file (walked: one added to the dataset): its download, the train split's "
        "records and the mix drawn from them",
        scope="that dataset",
    ),
    Rerun(
        _each("datasets.<d>.splits.train.member"),
        _TRAIN,
        "the train split's records and the mix drawn from them",
        scope="that dataset",
    ),
    Rerun(
        _each("datasets.<d>.splits.test.file"),
        ("download_dataset", *_TEST),
        "another release file (walked: one added to the dataset): its download, the evaluation set, "
        "and the mix (which leaves out every evaluation question)",
        scope="that dataset",
    ),
    Rerun(
        _each("datasets.<d>.splits.test.member"),
        _TEST,
        "the evaluation set, and the mix (which leaves out every evaluation question)",
        scope="that dataset",
    ),
)


#: Every key of the model, once. Rows are in the order the docs show them.
TABLE: tuple[Rerun, ...] = (
    Rerun(
        ("suite",),
        tuple(sorted(PAPER_RULES - {"download_model"})),
        "data outputs live under `results/<suite>/` and `resources/<suite>/`: another suite builds its own",
        demo=tuple(sorted(DEMO_RULES - {"build_tiny_model"})),
    ),
    Rerun(
        ("run",),
        ("export_rl_dataset", *_TRAINED),
        "a named run works in `results/runs/<run>/`: its training data export (the prompt is a run's "
        "setting), trainings and evaluations are its own; a download, the index, the data stages, the "
        "evidence and the demo's warm start are shared with the default run while every key they depend "
        "on (the rows below) is the default run's, else the run builds its own copy "
        "([named runs](#named-runs))",
        demo=("export_rl_dataset", *_TRAINED),
    ),
    Rerun(("targets",), NOTHING, "which backbones `all` builds: one already built is kept, a new one built"),
    Rerun(("mlflow.*",), NOTHING, "tracking only: where runs are recorded"),
    Rerun(
        ("corpus.url", "corpus.sha256"),
        ("download_dump", *_INDEX),
        "the dump itself: its download, the index and everything that searches",
    ),
    Rerun(
        ("corpus.size_bytes", "corpus.expected_documents"),
        NOTHING,
        "checks: a download or an index build fails unless it matches, a finished one is kept "
        "(`--forcerun build_bm25_index` checks an index again)",
    ),
    Rerun(("corpus.archive",), _INDEX, "another archive file is another input of the index"),
    Rerun(("corpus.prebuilt_index",), _SEARCHED, "another index is another input of every job that searches"),
    Rerun(
        (
            "retrieval.bm25.*",
            "retrieval.initial_k",
            "retrieval.topk",
            "retrieval.reranker.batch_size",
            "retrieval.reranker.max_length",
            "retrieval.reranker.max_batch_tokens",
            "retrieval.reranker.fp16",
            "retrieval.reranker.devices",
            "retrieval.service.max_queries_per_request",
            "retrieval.service.max_query_chars",
            "retrieval.service.slice_queries",
            "retrieval.service.overlap",
        ),
        _SEARCHED,
        "what a search returns: the ranking, the passages kept, queries cut to the limit, and how "
        "queries are batched for the reranker (batch shapes and precision change its scores' last bits)",
        demo=_WARM,
    ),
    Rerun(
        ("retrieval.reranker.model", "retrieval.reranker.revision"),
        ("download_model", *_SEARCHED),
        "another reranker: its download and every job that searches",
    ),
    Rerun(
        (
            "retrieval.service.host",
            "retrieval.service.startup_timeout_s",
            "retrieval.service.request_timeout_s",
            "retrieval.service.retries",
            "retrieval.service.header_timeout_s",
            "retrieval.service.body_timeout_s",
            "retrieval.service.max_connections",
            "retrieval.service.cache_entries",
            "retrieval.service.cache_bytes",
        ),
        NOTHING,
        "how the search service is reached and kept: where it listens, how long clients wait and "
        "retry, how many connections it holds, how many results it caches (a cached result is the "
        "one the service computed for the same query)",
    ),
    *_DATASET_ROWS,
    Rerun(
        ("datasets.*.files.*.hub.*",),
        None,
        "the parts of a hub location, as `datasets.<d>.files.<f>.hub`",
        demo=("download_dataset", "normalize_dataset", "mix_training_set", "export_rl_dataset", *_WARM),
        scope="that dataset",
        walked_on="the demo's QUEST train file, for every dataset (one class)",
    ),
    Rerun(
        ("mix.seed",),
        _MIXED,
        "the training mix, and the evaluation sets' questions when `mix.eval_limit` is set (as in the demo)",
        demo=("mix_training_set", "export_rl_dataset", "export_eval_set", *_WARM),
    ),
    Rerun(
        (
            "mix.counts.*",
            "mix.min_answers",
            "mix.max_answers",
            "mix.val_per_dataset",
        ),
        _MIXED,
        "the training mix: what every training and the StepSearch evidence read",
        demo=("mix_training_set", "export_rl_dataset", *_WARM),
    ),
    Rerun(
        ("mix.eval_limit",),
        ("export_eval_set", *_EVALUATED),
        "the evaluation sets (with `mix.seed` choosing the questions when a limit is set)",
    ),
    Rerun(
        ("backbones.*.model", "backbones.*.revision"),
        ("download_model", *_TRAINED),
        "another policy model: its download, its trainings and evaluations",
        scope="that backbone",
    ),
    Rerun(
        ("backbones.*.gpus",), _TRAINED, "GPUs per training job (data-parallel ranks)", scope="that backbone"
    ),
    Rerun(
        ("backbones.*.max_context_tokens",),
        _EVALUATED,
        "the token budget of a backbone's evaluation episodes",
        scope="that backbone",
    ),
    Rerun(
        ("backbones.*.warmstart",),
        None,
        "no warm start: every method starts from the tiny model as built",
        demo=_TRAINED,
    ),
    Rerun(
        ("backbones.*.warmstart.*",),
        None,
        "the warm start of a tiny policy, which every method of the backbone starts from",
        demo=_WARM,
    ),
    Rerun(
        ("backbones.*.variants", "backbones.*.prompting"),
        ("aggregate_results",),
        "which methods a backbone runs: a new one runs, the tables are rebuilt, nothing is retrained",
        scope="that backbone",
    ),
    Rerun(
        ("variants.*.table", "variants.*.label"),
        ("aggregate_results",),
        "which table a variant is a row of, and its label there: the tables are rebuilt, nothing is retrained",
        scope="the backbones that run it",
    ),
    Rerun(("variants.*.*",), _TRAINED, "a variant's training", scope="that variant (and a run it shares)"),
    Rerun(
        (
            "training.time_limit.*",
            "training.max_search_error_rate",
            "training.rollout_timeout_s",
            "training.max_work_lost_minutes",
            "training.keep_checkpoints",
        ),
        NOTHING,
        "how a training job lives with time limits (how often it saves, how much a time limit may cost), "
        "which checkpoints it keeps once exported, and when it gives up on a failing service or a hung "
        "rollout engine",
    ),
    Rerun(("training.*", "training.divergences.*"), _TRAINED, "verl's training settings: every training"),
    Rerun(
        ("training.divergences.cost_warmup.*",),
        None,
        "as `training.divergences.cost_warmup`",
        demo=("train_policy", "export_checkpoint", "evaluate_policy", "aggregate_results"),
    ),
    Rerun(
        ("agent.prompt_template", "agent.prompt_role"),
        ("export_rl_dataset", *_TRAINED),
        "the prompt and how it is sent: the training data export, every training and evaluation (and the demo's warm start)",
        demo=("export_rl_dataset", *_WARM),
    ),
    Rerun(("agent.*",), _TRAINED, "one agent turn, the same in training and evaluation", demo=_WARM),
    Rerun(("evaluation.cpu_threads",), NOTHING, "threads of a CPU evaluation job (a resource)"),
    Rerun(
        ("evaluation.max_error_share",),
        NOTHING,
        "when an evaluation gives up on a failing engine (a failure threshold: an evaluation that "
        "finished wrote the same records under any threshold it passed)",
    ),
    Rerun(
        ("evaluation.bootstrap_samples", "evaluation.bootstrap_seed", "evaluation.significance_level"),
        ("aggregate_results",),
        "the tables' intervals and tests only",
    ),
    Rerun(
        ("evaluation.topics",),
        ("aggregate_results",),
        "the unit the tables' rows pooled over datasets resample (questions, or clusters that share a topic)",
    ),
    Rerun(("evaluation.*",), _EVALUATED, "how policies are evaluated: every evaluation"),
    Rerun(
        ("stepsearch.evidence.gpus", "stepsearch.workers"),
        NOTHING,
        "GPUs of the evidence job, processes computing TF-IDF (the same numbers either way)",
    ),
    Rerun(
        ("stepsearch.evidence.*",),
        ("build_evidence", *_TRAINED),
        "StepSearch's evidence, then its training",
        scope="the stepsearch variants",
    ),
    Rerun(
        ("judge.startup_timeout_s", "judge.timeout_s", "judge.retries", "judge.concurrency"),
        NOTHING,
        "how long the judge may take and how many requests it gets at once",
    ),
    Rerun(
        ("judge.model", "judge.revision"),
        ("download_model", *_TRAINED),
        "another judge: its download, then the trainings it scores",
        scope="the r3rag variants with the LLM judge",
    ),
    Rerun(("judge.*",), _TRAINED, "how the judge scores", scope="the r3rag variants with the LLM judge"),
    Rerun(("hardware.*",), NOTHING, "the GPU memory plan only (`spader plan`)"),
    Rerun(
        ("code_reruns.*",),
        NOTHING,
        "whether a later code change reruns a stage; switching one on after such a change reruns it",
    ),
)


#: How a list-typed key of the model compares (every one is classified; a test keeps it so).
ORDERED, SET = "ordered", "set"
#: ``{key: (ORDERED or SET, why)}``. A set list is one whose order and repeats the code ignores: its
#: params compare it sorted and without repeats (:func:`canonical`), so reordering it reruns
#: nothing, and the model drops its repeats. An ordered list is one where a job reads the order
#: or counts a repeat (when in doubt, a list is ordered).
LISTS: dict[str, tuple[str, str]] = {
    "targets": (SET, "`rule all` asks for each backbone's tables; order and repeats ask for nothing more"),
    "retrieval.reranker.devices": (
        ORDERED,
        "one reranker replica per entry (a repeat is one more replica) and chunks go to them in order",
    ),
    "backbones.*.variants": (
        ORDERED,
        "of variants that train alike, the first trains the run they share; the tables' rows follow it",
    ),
    "backbones.*.prompting": (ORDERED, "the tables' rows follow it"),
    "agent.stop": (SET, "a turn ends at the earliest occurrence of any tag, whichever is listed first"),
    "evaluation.seeds": (ORDERED, "an evaluation writes its records seed by seed, in this order"),
    "hardware.calibration": (
        ORDERED,
        "of two measured records of one job, the first that applies plans it (the plan only: no job reruns)",
    ),
}


def list_kind(key: str | Sequence[str]) -> str | None:
    """:data:`ORDERED` or :data:`SET` for a list-typed key of the model (concrete or with ``*``),
    None for any other key.

    >>> list_kind(("agent", "stop")), list_kind("backbones.qwen3_8b.variants"), list_kind("agent.max_turns")
    ('set', 'ordered', None)
    """
    path = tuple(key.split(".")) if isinstance(key, str) else tuple(key)
    for pattern, (kind, _) in LISTS.items():
        parts = pattern.split(".")
        if len(parts) == len(path) and all(p == "*" or p == q for p, q in zip(parts, path, strict=True)):
            return kind
    return None


def _match(pattern: str, path: Sequence[str]) -> bool:
    """Whether a concrete key (its parts) is one of ``pattern``'s: ``*`` is one part, a final
    ``*`` any number of them."""
    parts = pattern.split(".")
    if parts[-1] == "*" and len(path) >= len(parts):
        path = path[: len(parts)]
    if len(parts) != len(path):
        return False
    return all(p == "*" or p == q for p, q in zip(parts, path, strict=True))


def _specificity(pattern: str) -> tuple[int, int]:
    return (-pattern.count("*"), len(pattern.split(".")))


def entry(key: str | Sequence[str]) -> Rerun:
    """The row of a key (a model key such as ``variants.*.beta``, a concrete dotted key, or the
    parts of a concrete key whose names hold dots): the row of its most specific pattern.

    >>> entry("retrieval.service.host").paper
    ()
    >>> entry(("variants", "spader", "beta")).paper[0]
    'train_policy'
    """
    return _entry(tuple(key.split(".")) if isinstance(key, str) else tuple(key))


@functools.lru_cache(maxsize=4096)
def _entry(path: tuple[str, ...]) -> Rerun:
    best: tuple[tuple[int, int], Rerun] | None = None
    for row in TABLE:
        for pattern in row.keys:
            if _match(pattern, path):
                rank = _specificity(pattern)
                if best is None or rank > best[0]:
                    best = (rank, row)
    if best is None:
        raise KeyError(f"config key '{'.'.join(path)}' is in no row of spader.infra.rerun_keys.TABLE")
    return best[1]


def reruns_nothing(key: str | Sequence[str]) -> bool:
    """Whether changing ``key`` reruns no job (an operational setting)."""
    row = entry(key)
    return not row.paper and not row.demo


def walked_on_paper(key: str | Sequence[str]) -> bool:
    """Whether the rerun test changes ``key`` in the paper's config (it has such a key)."""
    return entry(key).paper is not None


def walked_on_demo(key: str | Sequence[str]) -> bool:
    """Whether the rerun test changes ``key`` in the demo's config too."""
    return entry(key).demo is not None


def takes(rule: str, key: Sequence[str]) -> bool:
    """Whether rule ``rule``'s params carry ``key``: it reruns that rule (on the paper's DAG,
    or on the demo's for the demo's own rules)."""
    row = entry(key)
    if rule in PAPER_RULES and row.paper is not None:
        return rule in row.paper
    return rule in (row.demo or ()) or (row.demo is None and bool(row.paper))


def for_rule(rule: str, section: Sequence[str], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (the config section at ``section``) without the keys that do not rerun ``rule``:
    rule ``rule``'s param of that section.

    >>> for_rule("evaluate_policy", ["evaluation"], {"temperature": 1.0, "bootstrap_seed": 0})
    {'temperature': 1.0}
    """
    out: dict[str, Any] = {}
    for name, value in values.items():
        path = (*section, name)
        if isinstance(value, Mapping) and value:
            kept = for_rule(rule, path, value)
            if kept:
                out[name] = kept
        elif takes(rule, path):
            out[name] = value
    return out


def canonical(value: Any, at: Sequence[str] = ()) -> Any:
    """``value`` as a param: maps with sorted keys (recursively), tuples as lists, models as their
    fields, and the lists of :data:`LISTS` that are sets sorted with repeats left out, so that two
    configs meaning the same thing give the same ``repr`` (what Snakemake's params trigger
    compares).

    Args:
        value: the value (a config section, a key's value).
        at: where ``value`` sits in the config (its key's parts): a set list is known by its key.

    >>> canonical({"b": 1, "a": (2.0, {"d": None, "c": True})})
    {'a': [2.0, {'c': True, 'd': None}], 'b': 1}
    >>> canonical({"stop": ["</tool_call>", "</answer>", "</tool_call>"]}, ("agent",))
    {'stop': ['</answer>', '</tool_call>']}
    """
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): canonical(value[k], (*at, str(k))) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        items = [canonical(v) for v in value]
        if at and list_kind(at) == SET:
            unique = {json.dumps(v, sort_keys=True): v for v in items}
            items = [unique[k] for k in sorted(unique)]
        return items
    return value


# --- the docs ------------------------------------------------------------------------------------
DOCS = Path("docs/running.md")
_BEGIN = "<!-- reruns: generated by `spader rerun-keys write` from spader/infra/rerun_keys.py -->"
_END = "<!-- /reruns -->"
#: Names of the rule sets the table uses, longest first (the legend above it says what they hold).
GROUPS = (
    ("searching", _SEARCHED),
    ("warm", _WARM),
    ("trained", _TRAINED),
    ("evaluated", _EVALUATED),
)


def _rules(rules: tuple[str, ...] | None, every: frozenset[str]) -> str:
    if rules is None:
        return "–"
    if not rules:
        return "nothing"
    missing = sorted(every - set(rules))
    if set(rules) <= every and len(missing) <= 1:
        return "every job" + (f" but `{missing[0]}`" if missing else "")
    for name, group in GROUPS:
        if tuple(rules[-len(group) :]) == group:
            return ", ".join([*(f"`{r}`" for r in rules[: -len(group)]), f"*{name}*"])
    return ", ".join(f"`{r}`" for r in rules)


def _keys(keys: tuple[str, ...]) -> str:
    """The keys of a row, a key that the row holds for every dataset written once with ``<d>``."""
    out: list[str] = []
    for key in keys:
        parts = key.split(".")
        if parts[0] == "datasets" and parts[1] in _DATASETS:
            generic = ".".join(["datasets", "<d>", *parts[2:]])
            if set(_each(generic)) <= set(keys):
                key = generic
        if key not in out:
            out.append(key)
    return "<br>".join(f"`{k}`" for k in out)


def render_table() -> str:
    """The Markdown table of :data:`TABLE`, with a legend of the rule sets it names."""
    legend = "; ".join(f"*{name}*: {', '.join(f'`{r}`' for r in group)}" for name, group in GROUPS)
    lines = [
        _BEGIN,
        "",
        f"Rule sets: {legend}.",
        "",
        "| keys | reruns (paper) | reruns (demo) | which jobs | why |",
        "|---|---|---|---|---|",
    ]
    for row in TABLE:
        lines.append(
            f"| {_keys(row.keys)} | {_rules(row.paper, PAPER_RULES)} | {_rules(row.demo, DEMO_RULES)} "
            f"| {row.scope or 'all'} | {row.why} |"
        )
    lines += [
        "",
        "Lists: a list whose order the code ignores is compared as a set (its order and repeats "
        "rerun nothing; the configuration keeps each item once); any other list is compared in order.",
        "",
        "| list key | compared | why |",
        "|---|---|---|",
        *(
            f"| `{key}` | {'as a set' if kind == SET else 'in order'} | {why} |"
            for key, (kind, why) in LISTS.items()
        ),
        "",
        _END,
    ]
    return "\n".join(lines)


def _splice(text: str, block: str) -> str:
    pattern = re.compile(re.escape(_BEGIN) + ".*?" + re.escape(_END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{DOCS}: no generated block ({_BEGIN} ... {_END}) to replace")
    return pattern.sub(lambda _: block, text)


HELP = (
    "the table of what each config key reruns: write it into docs/running.md, check that the file is "
    "up to date (exit 1 if not), or show it"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``spader rerun-keys write|check|show [--root DIR]``."""
    parser.add_argument("action", choices=["write", "check", "show"])
    parser.add_argument("--root", default=".", help="repository root (default: the current directory)")


def run(args: argparse.Namespace) -> int:
    """Write, check or show the table (see :data:`HELP`)."""
    if args.action == "show":
        sys.stdout.write(render_table() + "\n")
        return 0
    path = Path(args.root) / DOCS
    text = path.read_text(encoding="utf-8")
    updated = _splice(text, render_table())
    if args.action == "write":
        path.write_text(updated, encoding="utf-8")
        return 0
    if updated != text:
        sys.stderr.write(f"{DOCS} is out of date; run spader rerun-keys write\n")
        return 1
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m spader.infra.rerun_keys write|check|show [--root DIR]`` (an alias of
    ``spader rerun-keys``)."""
    parser = argparse.ArgumentParser(prog="python -m spader.infra.rerun_keys", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(list(argv) if argv is not None else None))


if __name__ == "__main__":
    raise SystemExit(main())
