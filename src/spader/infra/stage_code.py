"""Per-stage code fingerprints: which package modules a workflow stage runs, and a hash of them.

Each rule's script (``workflow/scripts/<rule>.py``) is parsed, and its imports are followed
through the ``spader`` package by static analysis of ``import`` / ``from ... import`` statements
(anywhere in a module, function-level imports included) and of string literals that name a
package module (modules started by name: ``python -m spader.retrieval``, verl's entry module and
plug-in). The fingerprint of a stage hashes the syntax trees of its script and of every module
reached, so that:

* editing a module reruns exactly the stages that can execute it (and, through their outputs,
  what depends on them), nothing else;
* comments, formatting and docstrings are not code: they change no fingerprint;
* ``from spader.data import normalize_file`` depends on the module that defines
  ``normalize_file`` (re-exports are followed), not on every module the package re-exports.

Modules in :data:`RESULT_NEUTRAL` are left out and not followed: they move bytes, retry, log or
record runs, and cannot change what a stage computes. Download stages get no fingerprint at all
(their outputs are fixed by their source, checksum or pinned revision); see ``common.smk``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from spader.infra.atomic import atomic_write

__all__ = [
    "RESULT_NEUTRAL",
    "STAGE_GROUPS",
    "ModuleFacts",
    "PackageGraph",
    "affected_rules",
    "code_cache_dir",
    "module_facts",
    "planned_code",
    "recorded_code",
    "stage_fingerprints",
    "stage_group",
]

PACKAGE = "spader"

#: Modules whose edits rerun nothing: job glue and MLflow tracking (run records only), the retry
#: policy (when to try again, not what is computed), the downloader and its transfers (bytes are
#: checked against their source), integrity records (they check files, never change them), atomic
#: writes (where bytes go until they are complete), the
#: process supervisor (how a job's children are stopped), the gated-model token check and the
#: node checks with the needs they compare (preconditions: a job runs as planned or stops) and
#: this module.
RESULT_NEUTRAL = frozenset(
    {
        "spader.infra.glue",
        "spader.infra.tracking",
        "spader.infra.retry",
        "spader.infra.download",
        "spader.infra.transfer",
        "spader.infra.integrity",
        "spader.infra.atomic",
        "spader.infra.procs",
        "spader.models.gated",
        "spader.infra.node",
        "spader.planning.needs",
        "spader.infra.stage_code",
    }
)

#: Groups of computing rules, one switch each in the config (``code_reruns.<group>``): whether a
#: change to the code its jobs run reruns them. Downloads have no fingerprint at all.
STAGE_GROUPS = {
    "data": ("normalize_dataset", "mix_training_set", "export_rl_dataset", "export_eval_set"),
    "retrieval": ("build_bm25_index",),
    "models": ("build_tiny_model", "warmstart_policy"),
    "scorers": ("build_evidence",),
    "training": ("train_policy", "export_checkpoint"),
    "evaluation": ("evaluate_policy", "aggregate_results", "compare_runs"),
}

_MODULE_NAME = re.compile(rf"^{PACKAGE}(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    """Drop the docstring of the module and of every class and function (documentation only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def code_hash(source: str | ast.AST, filename: str = "<source>") -> str:
    """sha256 of a module's syntax tree without docstrings, line numbers, comments or layout.

    Args:
        source: Python source text, or its parsed tree (whose docstrings are then removed in place).
        filename: used in the SyntaxError message.
    Returns:
        Hex digest.
    """
    tree = ast.parse(source, filename=filename) if isinstance(source, str) else source
    return hashlib.sha256(ast.dump(_strip_docstrings(tree), annotate_fields=False).encode()).hexdigest()


#: Bump when what :func:`module_facts` extracts or how it hashes changes (cached facts are keyed on it).
FACTS_VERSION = 1


@dataclass(frozen=True)
class ModuleFacts:
    """What the fingerprints need of one source file, read in one pass over its syntax tree.

    Attributes:
        code_hash: :func:`code_hash` of the file.
        imports: names of ``import x`` statements, anywhere in the file.
        from_imports: ``(module, level, ((name, asname), ...), top_level)`` of every ``from``
            import, in source order (top-level ones first, as the module body lists them).
        strings: string literals that look like a dotted package module name.
    """

    code_hash: str
    imports: tuple[str, ...]
    from_imports: tuple[tuple[str | None, int, tuple[tuple[str, str | None], ...], bool], ...]
    strings: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "code_hash": self.code_hash,
            "imports": list(self.imports),
            "from_imports": [
                [m, lv, [list(n) for n in names], top] for m, lv, names, top in self.from_imports
            ],
            "strings": list(self.strings),
        }

    @classmethod
    def from_json(cls, data: dict) -> ModuleFacts:
        return cls(
            data["code_hash"],
            tuple(data["imports"]),
            tuple(
                (m, lv, tuple((n, a) for n, a in names), top) for m, lv, names, top in data["from_imports"]
            ),
            tuple(data["strings"]),
        )


def module_facts(source: str, filename: str = "<source>") -> ModuleFacts:
    """The imports, module-naming strings and code hash of one file (docstrings count as strings
    for the imports, as the module's text names what it starts; the hash leaves them out)."""
    tree = ast.parse(source, filename=filename)
    top = {id(node) for node in tree.body}
    imports, from_imports, strings = [], [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple((alias.name, alias.asname) for alias in node.names)
            from_imports.append((node.module, node.level, names, id(node) in top))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value)
        ):
            strings.append(node.value)
    return ModuleFacts(code_hash(tree), tuple(imports), tuple(from_imports), tuple(strings))


def code_cache_dir() -> Path:
    """Where parsed facts of source files are cached, keyed on the files' bytes (the user's cache
    directory, as Snakemake keeps its own caches): a workflow start reads them instead of parsing
    the package again."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spader" / f"code-facts-v{FACTS_VERSION}-py{sys.version_info[0]}{sys.version_info[1]}"


class _FactsStore:
    """:func:`module_facts` per file, memoised on the file's bytes (in memory, and in ``cache_dir``
    when one is given; an unreadable or unwritable cache is only a slower start)."""

    #: facts by cache directory and the sha256 of a file's bytes, shared by every store of the
    #: process: a process that parses the workflow many times (the rerun tests) reads each once
    _shared: ClassVar[dict[tuple[str | None, str], ModuleFacts]] = {}

    def __init__(self, cache_dir: str | os.PathLike | None):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None

    def of(self, path: Path) -> ModuleFacts:
        data = path.read_bytes()
        key = hashlib.sha256(data).hexdigest()
        cached = self.cache_dir / f"{key}.json" if self.cache_dir is not None else None
        memo = (str(self.cache_dir) if self.cache_dir is not None else None, key)
        if memo in self._shared and (cached is None or cached.is_file()):
            return self._shared[memo]
        facts = None
        if cached is not None and cached.is_file():
            try:
                facts = ModuleFacts.from_json(json.loads(cached.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                facts = None
        if facts is None:
            facts = module_facts(data.decode("utf-8"), str(path))
            if cached is not None:
                try:
                    atomic_write(cached, json.dumps(facts.to_json()))
                except OSError:
                    pass
        self._shared[memo] = facts
        return facts


class PackageGraph:
    """The static import graph of the ``spader`` package found in ``package_dir``."""

    def __init__(
        self,
        package_dir: str | os.PathLike | None = None,
        neutral: Iterable[str] = RESULT_NEUTRAL,
        cache_dir: str | os.PathLike | None = None,
    ):
        """Args:
        package_dir: directory of the ``spader`` package (default: the one Python imports,
            i.e. the code the jobs run).
        neutral: module names left out of every fingerprint and not followed.
        cache_dir: where parsed facts of files are kept between processes (default: none,
            every file is parsed once per graph); see :func:`code_cache_dir`.
        """
        if package_dir is None:
            spec = importlib.util.find_spec(PACKAGE)
            if spec is None or not spec.submodule_search_locations:
                raise ImportError(f"package {PACKAGE!r} is not importable")
            package_dir = next(iter(spec.submodule_search_locations))
        self.package_dir = Path(package_dir)
        self.neutral = frozenset(neutral)
        self._facts = _FactsStore(cache_dir)
        self._deps: dict[str, frozenset[str]] = {}

    @cached_property
    def modules(self) -> dict[str, Path]:
        """{dotted module name: file}, packages by their ``__init__.py``."""
        out = {}
        for path in sorted(self.package_dir.rglob("*.py")):
            rel = path.relative_to(self.package_dir).with_suffix("")
            parts = [PACKAGE, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
        return out

    def _is_package(self, name: str) -> bool:
        return name in self.modules and self.modules[name].name == "__init__.py"

    def _tree(self, name: str) -> ast.Module:
        path = self.modules[name]
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def facts(self, name: str) -> ModuleFacts:
        """:class:`ModuleFacts` of module ``name``."""
        return self._facts.of(self.modules[name])

    def _absolute(self, importer: str, module: str | None, level: int) -> str | None:
        """The absolute module name of a (possibly relative) ``from`` import in ``importer``."""
        if level == 0:
            return module
        base = importer.split(".")
        if not self._is_package(importer):
            base = base[:-1]
        if level > 1:
            base = base[: -(level - 1)]
        return ".".join([*base, module] if module else base)

    def _provider(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """Modules that ``from module import name`` depends on: the submodule ``name``, or the
        module that defines ``name`` (re-exports, i.e. top-level ``from x import name``, are
        followed), or ``module`` itself."""
        if f"{module}.{name}" in self.modules:
            return {f"{module}.{name}"}
        if module not in self.modules or module in seen:
            return {module} if module in self.modules else set()
        for source_name, level, names, top_level in self.facts(module).from_imports:
            if not top_level:
                continue
            source = self._absolute(module, source_name, level)
            for imported, asname in names:
                if (asname or imported) == name and source:
                    return self._provider(source, imported, seen | {module})
        return {module}

    def _string_target(self, text: str) -> str | None:
        """A package module named by a string (``-m`` targets run ``__main__``; ``mod.attr`` is
        ``mod``)."""
        if not _MODULE_NAME.match(text):
            return None
        parts = text.split(".")
        for end in range(len(parts), 1, -1):
            name = ".".join(parts[:end])
            if name in self.modules:
                main = f"{name}.__main__"
                return main if end == len(parts) and main in self.modules else name
        return None

    def imports_of_tree(self, tree: ast.AST, importer: str) -> set[str]:
        """Package modules a syntax tree imports or names (neutral ones included).

        Args:
            tree: parsed module or script.
            importer: its dotted name (for relative imports; a script is ``__main__``).
        Returns:
            Dotted module names within the package.
        """
        return self.imports_of(module_facts(ast.unparse(tree)), importer)

    def imports_of(self, facts: ModuleFacts, importer: str) -> set[str]:
        """Package modules a file imports or names (neutral ones included), from its facts."""
        found = {name for name in facts.imports if name in self.modules}
        for module, level, names, _ in facts.from_imports:
            source = self._absolute(importer, module, level)
            if source and (source == PACKAGE or source.startswith(PACKAGE + ".")):
                for imported, _asname in names:
                    found |= self._provider(source, imported)
        for text in facts.strings:
            target = self._string_target(text)
            if target:
                found.add(target)
        found.discard(importer)
        return found

    def deps(self, name: str) -> frozenset[str]:
        """Direct package dependencies of module ``name``."""
        if name not in self._deps:
            self._deps[name] = frozenset(self.imports_of(self.facts(name), name))
        return self._deps[name]

    def closure(self, roots: Iterable[str]) -> set[str]:
        """``roots`` and every module they reach, neutral modules left out and not followed."""
        todo = [r for r in roots if r not in self.neutral]
        reached: set[str] = set()
        while todo:
            name = todo.pop()
            if name in reached:
                continue
            reached.add(name)
            todo.extend(d for d in self.deps(name) if d not in self.neutral and d not in reached)
        return reached

    def script_modules(self, script: str | os.PathLike) -> set[str]:
        """Package modules a workflow script runs (its import closure)."""
        return self.closure(self.imports_of(self._facts.of(Path(script)), "__main__"))

    def fingerprint(self, script: str | os.PathLike) -> str:
        """Hash of the script's code and of every module it runs (16 hex digits)."""
        path = Path(script)
        h = hashlib.sha256(self._facts.of(path).code_hash.encode())
        for name in sorted(self.script_modules(path)):
            h.update(f"\0{name}\0{self.facts(name).code_hash}".encode())
        return h.hexdigest()[:16]


def stage_fingerprints(
    scripts_dir: str | os.PathLike,
    package_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> dict[str, str]:
    """Code fingerprint of every stage script in ``scripts_dir``.

    Args:
        scripts_dir: ``workflow/scripts`` (one ``<rule>.py`` per rule).
        package_dir: the ``spader`` package directory (default: the imported one).
        cache_dir: where parsed facts of files are kept between runs (:func:`code_cache_dir`).
    Returns:
        {rule name (script file stem): fingerprint}.
    """
    graph = PackageGraph(package_dir, cache_dir=cache_dir)
    return {p.stem: graph.fingerprint(p) for p in sorted(Path(scripts_dir).glob("*.py"))}


def stage_group(rule: str) -> str:
    """The :data:`STAGE_GROUPS` group of a computing rule.

    >>> stage_group("train_policy")
    'training'
    """
    for group, rules in STAGE_GROUPS.items():
        if rule in rules:
            return group
    raise KeyError(f"rule {rule!r} is in no stage group (spader.infra.stage_code.STAGE_GROUPS)")


def recorded_code(output: str | os.PathLike) -> str | None:
    """The code param a job's output was built with, as its job recorded it (integrity record's
    ``extra.code``), or None (no output, no record, or built before records carried it)."""
    from spader.infra import integrity

    try:
        rec = integrity.read_record(output)
    except integrity.IntegrityError:
        return None
    return (rec.extra or {}).get("code") if rec is not None else None


def planned_code(fingerprint: str, output: str | os.PathLike, *, reruns: bool) -> str:
    """The ``code`` param of a job: the fingerprint of its code now, or, when its stage group's
    code changes rerun nothing (``reruns`` False), the param its existing output was built with
    (so that Snakemake sees no change), falling back to the fingerprint.

    >>> planned_code("new", "/nonexistent/out.json", reruns=False)
    'new'
    """
    if reruns:
        return fingerprint
    return recorded_code(output) or fingerprint


def _module_name(target: str, graph: PackageGraph) -> str:
    """A dotted module name from a dotted name or a path to a file of the package."""
    if target in graph.modules:
        return target
    path = Path(target).resolve()
    for name, file in graph.modules.items():
        if file.resolve() == path:
            return name
    raise KeyError(f"{target!r} is neither a module of the {PACKAGE} package nor one of its files")


def affected_rules(
    targets: Iterable[str], scripts_dir: str | os.PathLike, package_dir: str | os.PathLike | None = None
) -> dict[str, list[str]]:
    """The rules whose fingerprint covers any of ``targets``: what changing them would rerun.

    Args:
        targets: module names (``spader.core.text``) or files of the package
            (``src/spader/core/text.py``); a script of ``scripts_dir`` counts for its own rule.
        scripts_dir: ``workflow/scripts``.
        package_dir: the ``spader`` package directory (default: the imported one).
    Returns:
        ``{rule: [the targets it runs]}`` in rule order; result-neutral modules affect nothing.
    """
    graph = PackageGraph(package_dir)
    scripts = {p.resolve(): p.stem for p in Path(scripts_dir).glob("*.py")}
    modules, own_scripts = set(), set()
    for target in targets:
        if Path(target).resolve() in scripts:
            own_scripts.add(scripts[Path(target).resolve()])
        else:
            modules.add(_module_name(target, graph))
    out: dict[str, list[str]] = {}
    for path, rule in sorted(scripts.items(), key=lambda kv: kv[1]):
        hits = sorted(modules & graph.script_modules(path))
        if rule in own_scripts:
            hits.insert(0, f"workflow/scripts/{rule}.py")
        if hits:
            out[rule] = hits
    return out


HELP = "list the rules whose jobs a change to these files or modules reruns (affected)"


def add_arguments(parser) -> None:
    from spader.config.command import add_config_arguments

    parser.add_argument("action", choices=["affected"])
    parser.add_argument("targets", nargs="+", help="files of src/spader or workflow/scripts, or module names")
    parser.add_argument("--scripts", default="workflow/scripts", help="the workflow's scripts directory")
    add_config_arguments(parser)


def run(args) -> int:
    from spader.config.command import configured

    switches = configured(args).code_reruns
    try:
        rules = affected_rules(args.targets, args.scripts)
    except KeyError as exc:  # an unknown file or module: one line (spader.config.command)
        raise ValueError(exc.args[0]) from exc
    out = sys.stdout
    if not rules:
        out.write("no rule runs this code: a change reruns nothing\n")
    grouped = {rule for rules_ in STAGE_GROUPS.values() for rule in rules_}
    for rule, via in rules.items():
        if rule not in grouped:
            verdict = "kept (a download: no fingerprint)"
        else:
            group = stage_group(rule)
            verdict = "reruns" if getattr(switches, group) else f"kept (code_reruns.{group}: false)"
        out.write(f"{rule:<20} {verdict:<34} via {', '.join(via)}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m spader.infra.stage_code affected FILE_OR_MODULE... [--configfile F ...]``
    (``spader stage-code``)."""
    from spader.config.command import run_command

    return run_command("python -m spader.infra.stage_code", add_arguments, run, argv, description=HELP)


if __name__ == "__main__":
    raise SystemExit(main())
