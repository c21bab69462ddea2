"""Which stages a named run shares with the default run, and which it builds itself.

A named run (config key ``run``, e.g. ``config/authors.yaml``) works in ``results/runs/<run>/``.
Some stages do not depend on what it changes (the downloads, the index, the data stages, the tiny
models, the demo's warm start, StepSearch's evidence: :data:`SHARED_STAGES`); their outputs then
live in the default run's directory, built once for both. A stage is shared only when every
setting it depends on equals the default run's: a key whose row in the rerun table
(:data:`spader.infra.rerun_keys.TABLE`, on the paper's DAG or the demo's) names the stage and whose
value differs gives the named run its own copy of that stage, in its own directory, and of every
shared stage that reads it (:func:`own_stages`). Otherwise a named run with ``mix.seed: 7``
would train on the default run's seed-42 mix, and its recorded config would be wrong about it.

*The default run* is the configuration the named run overlays: the workflow's
``config/config.yaml`` and the ``--configfile`` files before the first one that names a run
(:func:`default_run_files`): ``config/demo.yaml`` for ``--configfile config/demo.yaml
config/authors.yaml config/demo_authors.yaml``. A ``--config`` on the command line belongs to the
named run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.config.files import load_yaml
from spader.infra.rerun_keys import canonical, entry

__all__ = ["SHARED_STAGES", "default_run_files", "differing_keys", "own_stages", "summary"]

#: The stages a named run can share with the default run, each with the shared stages whose
#: outputs it reads (in an order where a stage follows what it reads).
SHARED_STAGES: dict[str, tuple[str, ...]] = {
    "download_dump": (),
    "build_bm25_index": ("download_dump",),
    "download_dataset": (),
    "normalize_dataset": ("download_dataset",),
    "mix_training_set": ("normalize_dataset",),
    "export_eval_set": ("normalize_dataset",),
    "download_model": (),
    "build_tiny_model": (),
    "warmstart_policy": (
        "mix_training_set",
        "export_eval_set",
        "build_bm25_index",
        "download_model",
        "build_tiny_model",
    ),
    "build_evidence": ("mix_training_set", "build_bm25_index", "download_model", "download_dataset"),
}

#: The key that names a run: it differs by definition and changes no shared stage.
_RUN_KEY = ("run",)


def default_run_files(
    workflow_file: str | os.PathLike | None, configfiles: Sequence[str | os.PathLike]
) -> list[Path]:
    """The config files of the default run that a named run overlays: ``workflow_file`` (None:
    Snakemake was told to replace the workflow's config) and the ``configfiles`` given before the
    first one that sets ``run``.

    Raises:
        ConfigError: a file cannot be read.
    """
    files = [Path(workflow_file)] if workflow_file is not None else []
    for path in configfiles:
        if load_yaml(path).get("run"):
            break
        files.append(Path(path))
    return files


def _leaves(value: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key parts, canonical value)`` of every leaf of a config (an empty map is a leaf)."""
    if isinstance(value, Mapping) and value:
        for name, item in value.items():
            yield from _leaves(item, (*prefix, str(name)))
    else:
        yield prefix, canonical(value)


def differing_keys(config: Mapping[str, Any], default: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The keys (as parts) whose values differ between two resolved configs, a key only one of
    them has included; ``run`` left out.

    >>> differing_keys({"run": "x", "mix": {"seed": 7, "k": [1]}}, {"run": None, "mix": {"seed": 42, "k": [1]}})
    [('mix', 'seed')]
    """
    ours, theirs = dict(_leaves(config)), dict(_leaves(default))
    missing = object()
    return sorted(
        key
        for key in ours.keys() | theirs.keys()
        if key != _RUN_KEY and ours.get(key, missing) != theirs.get(key, missing)
    )


def _stages_of(key: tuple[str, ...]) -> set[str]:
    """The shared stages that a change of ``key`` reruns, on the paper's DAG or the demo's (a key
    the table does not know: every one)."""
    try:
        row = entry(key)
    except KeyError:
        return set(SHARED_STAGES)
    return (set(row.paper or ()) | set(row.demo or ())) & SHARED_STAGES.keys()


def own_stages(
    config: Mapping[str, Any],
    default: Mapping[str, Any] | None,
    changed: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[str]]:
    """The shared stages that a named run with the resolved ``config`` builds itself, each with
    why: the keys that differ from the ``default`` run's and that it depends on, directly or
    through a stage it reads (dotted). ``changed`` adds stages for other reasons (a local source
    whose content changed since the default run copied it: ``{stage: [what]}``). ``default``
    None (the default run's config is unknown): every stage, for ``"the default run's config"``.

    >>> c = {"mix": {"seed": 7}, "agent": {"stop": []}}
    >>> own_stages(c, {"mix": {"seed": 42}, "agent": {"stop": []}})["warmstart_policy"]
    ['mix.seed']
    """
    if default is None:
        return {stage: ["the default run's config"] for stage in SHARED_STAGES}
    why: dict[str, set[str]] = {stage: set(what) for stage, what in (changed or {}).items()}
    for key in differing_keys(config, default):
        for stage in _stages_of(key):
            why.setdefault(stage, set()).add(".".join(key))
    for stage, reads in SHARED_STAGES.items():  # what reads an own stage's outputs is own too
        for upstream in reads:
            if upstream in why:
                why.setdefault(stage, set()).update(why[upstream])
    return {stage: sorted(why[stage]) for stage in SHARED_STAGES if stage in why}


def summary(run: str, own: Mapping[str, Sequence[str]], *, most: int = 4) -> str:
    """One line for the log: the stages a named run builds itself and why.

    >>> summary("probe", {"mix_training_set": ["mix.seed"]})
    "named run 'probe' builds its own mix_training_set (mix.seed differs from the default run's); shares the other stages with the default run"
    >>> summary("authors", {})
    "named run 'authors' shares every data, index and model stage with the default run"
    """
    if not own:
        return f"named run '{run}' shares every data, index and model stage with the default run"
    parts = []
    for stage, keys in own.items():
        shown = ", ".join(keys[:most]) + (f" and {len(keys) - most} more" if len(keys) > most else "")
        verb = "differs" if len(keys) == 1 else "differ"
        parts.append(f"{stage} ({shown} {verb} from the default run's)")
    return (
        f"named run '{run}' builds its own {'; '.join(parts)}; shares the other stages with the default run"
    )
