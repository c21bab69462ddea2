"""The repository stands on its own and follows the ecosystem's conventions: no references to
documents it does not contain, no mention of a repository path or package module that is gone, a license that matches the package metadata, a generated config
reference that is up to date, a workflow-catalog file, and packaging metadata that is true."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# Documents that do not exist in this repository, and the tracker of the project that wrote it.
_OUTSIDE_DOCS = re.compile(r"\bshared/|\bspec/\w+\.md|\b(integration|environment|slurm|conventions)\.md")
_BARE_DOC = re.compile(r"(?<![\w/.-])(method|data|baselines)\.md")
_ISSUE = re.compile(r"(?i)\bissues?\s*#\s*\d+|(?<![\w/(&'\"-])#\d+(?![\w-])")
_DOC_PATH = re.compile(r"\bdocs/([\w-]+\.md)")


def _repository_files() -> list[Path]:
    """Tracked files and new files that are not ignored (what a fresh clone would hold)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = []
    for rel in filter(None, out.split("\0")):
        path = REPO / rel
        if rel == THIS or rel in ("LICENSE",) or rel.startswith("requirements/") or not path.is_file():
            continue
        files.append(path)
    return files


def _lines():
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (parquet, archives, images)
        rel = path.relative_to(REPO).as_posix()
        for n, line in enumerate(text.splitlines(), 1):
            yield rel, n, line


def test_no_reference_to_documents_outside_the_repository():
    offenders = [
        f"{rel}:{n}: {line.strip()}"
        for rel, n, line in _lines()
        if _OUTSIDE_DOCS.search(line) or (not rel.startswith("docs/") and _BARE_DOC.search(line))
    ]
    assert not offenders, "point these at docs/ instead:\n" + "\n".join(offenders)


def test_no_issue_numbers():
    offenders = [f"{rel}:{n}: {line.strip()}" for rel, n, line in _lines() if _ISSUE.search(line)]
    assert not offenders, "say what the code does instead of citing an issue:\n" + "\n".join(offenders)


# A repository path as prose names it (`tests/workflow/test_dag.py`, `workflow/rules/`): one of the
# repository's own folders, not a template (`{suite}`, `<rule>`, `*.py`). Outputs and downloads
# (results/, resources/, logs/) are not the repository's.
_REPO_PATH = re.compile(
    r"(?<![\w./$~-])((?:tests|src|docs|workflow|bench|config|profiles|slurm|scripts|\.ci)/[\w./-]*[\w/])(?![\w{<*\[])"
)
# A module of the package (`spader.core.rewards.terminal_reward`); `spader.<name>` where name is
# no subpackage or module is something else (an MLflow tag, a config key).
_MODULE_REF = re.compile(r"(?<![\w./-])spader(?:\.\w+)+")
_COMMENT = re.compile(r"(?:^|\s)#\s.*")  # a comment, near enough for prose
_PROSE_SUFFIXES = (".md", ".rst", ".smk", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".sh")


def _is_referenced_path(path: str) -> bool:
    """Whether a path-like word names a repository path that should exist: a file (it has a
    suffix), a folder (ends in `/`), or a folder of the code (`tests/support`); not prose such as
    `docs/s` (documents per second)."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return "." in last or path.endswith("/") or path.split("/", 1)[0] in ("tests", "src", "workflow", "bench")


def _python_prose(text: str) -> dict[int, str]:
    """Line -> its docstring text or its comment (a test's code builds trees of its own, which its
    prose does not describe)."""
    lines = text.splitlines()
    prose = {n: m.group(0) for n, line in enumerate(lines, 1) if (m := _COMMENT.search(line))}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return prose
    statements = list(tree.body)
    while statements:  # statements only: expressions hold no docstring
        node = statements.pop()
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            prose.update((n, lines[n - 1]) for n in range(node.lineno, node.end_lineno + 1))
        for field in ("body", "orelse", "finalbody", "handlers"):
            statements += getattr(node, field, [])
    return prose


def _reference_lines():
    """(file, line number, text) of what may name repository paths and modules: the prose files,
    the workflow, the package, the benchmarks and scripts in full; the tests' comments and
    docstrings."""
    for path in _repository_files():
        rel = path.relative_to(REPO).as_posix()
        if rel == "CHANGELOG.md" or rel.startswith(("bench/records/", "tests/fixtures/")):
            continue  # what was (renamed modules, measurements); copies of others' files
        if path.suffix == ".py":
            text = path.read_text(encoding="utf-8")
            if rel.startswith("tests/"):
                yield from ((rel, n, line) for n, line in sorted(_python_prose(text).items()))
            else:
                yield from ((rel, n, line) for n, line in enumerate(text.splitlines(), 1))
        elif path.suffix in _PROSE_SUFFIXES or path.name == "Snakefile":
            yield from (
                (rel, n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            )


@functools.cache
def _module_file(name: str) -> Path | None:
    base = REPO.joinpath("src", *name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _module_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _module_ref_missing(ref: str) -> bool:
    """Whether `spader.a.b...` names a subpackage of the package that lacks the module or the
    name (`spader.core.densify`, `spader.config.HardwareConfig`)."""
    parts = ref.split(".")
    if _module_file(".".join(parts[:2])) is None:
        return False  # spader.host, spader.beta: not the package's
    for end in range(len(parts), 1, -1):
        path = _module_file(".".join(parts[:end]))
        if path is not None:
            return end < len(parts) and not re.search(rf"\b{parts[end]}\b", _module_text(path))
    return True


def _stale_references(lines) -> list[str]:
    stale = []
    for rel, n, line in lines:
        stale += [
            f"{rel}:{n}: {m.group(1)}"
            for m in _REPO_PATH.finditer(line)
            if _is_referenced_path(m.group(1)) and not (REPO / m.group(1).rstrip(".")).exists()
        ]
        stale += [
            f"{rel}:{n}: {m.group(0)}" for m in _MODULE_REF.finditer(line) if _module_ref_missing(m.group(0))
        ]
    return stale


def test_mentioned_paths_and_modules_exist():
    """A renamed or removed file, folder or module leaves no mention behind in the docs, the
    workflow, the configs, the package's comments and docstrings or the tests' prose."""
    stale = _stale_references(_reference_lines())
    assert not stale, "these name a path or module that does not exist:\n" + "\n".join(stale)


def test_the_stale_reference_check_catches_what_it_should():
    planted = [
        ("docs/x.md", 1, "see `tests/baselines/` and tests/core/test_densify.py, docs/gone.md."),
        ("src/x.py", 2, "# (spader.core.densify.densify_rewards, spader.config.HardwareConfig)"),
        ("src/x.py", 3, "spader.training.scorer_launch.BaselineLaunch and workflow/rules/training.smk"),
    ]
    assert [entry.split(": ", 1)[1] for entry in _stale_references(planted)] == [
        "tests/baselines/",
        "tests/core/test_densify.py",
        "docs/gone.md",
        "spader.core.densify.densify_rewards",
        "spader.config.HardwareConfig",
        "workflow/rules/training.smk",
        "spader.training.scorer_launch.BaselineLaunch",
    ]
    fine = [
        ("docs/x.md", 1, "`results/{suite}/data/`, `workflow/scripts/<rule>.py`, 300 docs/s, tests/*.py"),
        ("src/x.py", 2, "spader.host, spader.core.rewards.terminal_reward, docs/method.md, tests/support/"),
        (
            "src/x.py",
            3,
            "`config/data/index hashes`, spader.integrations.verl.scorer_rewards.StepSearchRewards",
        ),
    ]
    assert _stale_references(fine) == []


def test_referenced_docs_exist():
    missing = {
        f"{rel}:{n}: docs/{m.group(1)}"
        for rel, n, line in _lines()
        for m in _DOC_PATH.finditer(line)
        if not (REPO / "docs" / m.group(1)).is_file()
    }
    assert not missing, "\n".join(sorted(missing))


def test_the_reference_patterns_catch_what_they_should():
    brief = "/".join(
        ["..", "sha" + "red", "spec", "method.md"]
    )  # spelt out of parts: this file is scanned too
    assert _OUTSIDE_DOCS.search(f"see {brief}") and _OUTSIDE_DOCS.search("integration.md 1")
    assert _BARE_DOC.search("(method.md, 'Rewards')") and not _BARE_DOC.search("docs/method.md")
    hash_ = "#"
    assert _ISSUE.search(f"(issue {hash_}3)") and _ISSUE.search(f"issues {hash_}5, {hash_}6")
    assert _ISSUE.search(f"item {hash_}12")
    assert not _ISSUE.search("color='#1f77b4'") and not _ISSUE.search("data.md#72-norm_v1")


# A section number of a page of docs/ quoted where the page is cited ("docs/data.md 7.4"): the
# numbers move when a section is added, so code and config name the section instead.
_SECTION_NUMBER = re.compile(r"\bdocs/[\w-]+\.md,?\s+(?:sections?\s+)?\d")


def test_code_names_docs_sections_not_their_numbers():
    offenders = [
        f"{rel}:{n}: {line.strip()}"
        for rel, n, line in _lines()
        if not rel.startswith("docs/") and not rel.endswith(".md") and _SECTION_NUMBER.search(line)
    ]
    assert not offenders, 'name the section (docs/data.md, "Training mix"):\n' + "\n".join(offenders)
    assert _SECTION_NUMBER.search("(docs/data.md 7.4)") and _SECTION_NUMBER.search("docs/data.md section 1")
    assert not _SECTION_NUMBER.search('(docs/data.md, "Training mix")')


def test_license_matches_the_package_metadata():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_packaging_metadata_is_true():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project, setuptools = pyproject["project"], pyproject["tool"]["setuptools"]
    # one version source: the package's __version__
    assert "version" not in project and "version" in project["dynamic"]
    assert setuptools["dynamic"]["version"] == {"attr": "spader.__version__"}
    # every package-data pattern ships at least one file
    package = REPO / "src" / "spader"
    for pattern in setuptools.get("package-data", {}).get("spader", []):
        assert list(package.glob(pattern)), f"package-data pattern {pattern!r} matches no file"
    # tarfile's extraction filters exist from 3.11.4 (3.12 in the 3.12 line): a use of them needs that floor
    uses_filter = any(re.search(r"extractall\([^)]*filter=", p.read_text()) for p in package.rglob("*.py"))
    floor = re.match(r">=(\d+)\.(\d+)(?:\.(\d+))?", project["requires-python"]).groups()
    floor = tuple(int(x or 0) for x in floor)
    assert sys.version_info[:3] >= floor
    if uses_filter:
        assert floor >= (3, 11, 4), f"tarfile filters need Python >= 3.11.4, requires-python says {floor}"


def test_workflow_catalog_file():
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    usage = catalog["usage"]
    assert usage["report"] is True
    assert set(usage["software-stack-deployment"]) == {"conda", "apptainer", "apptainer+conda"}
    assert (REPO / "workflow" / "Snakefile").is_file() and (REPO / "config" / "README.md").is_file()


@pytest.mark.parametrize("tool", ["ruff", "snakefmt", "lint-imports"])
def test_style_tools_are_pinned_in_the_test_extra_and_the_lock(tool):
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    package = {"lint-imports": "import-linter"}.get(tool, tool)
    (pin,) = [p for p in extra if p.startswith(f"{package}==")]
    assert pin in (REPO / "requirements" / "cpu-lock.txt").read_text().splitlines()
    ci = (REPO / ".ci" / "run").read_text()
    assert f".venv/bin/{tool}" in ci


def _lock(name: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / name).read_text().splitlines():
        if line and not line.startswith("#"):
            package, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", package).lower()] = version
    return pins


@pytest.mark.parametrize(("name", "extra"), [("cpu-lock.txt", "test"), ("gpu-lock.txt", "gpu")])
def test_locks_pin_every_requirement_without_a_local_version_label(name, extra):
    """A pin with a local label (`+cpu`) resolves only where one machine serves that build; each
    lock pins the project's own requirements exactly as pyproject.toml does (CI resolves both
    against the public index: .ci/run)."""
    lock = _lock(name)
    assert not [f"{p}=={v}" for p, v in lock.items() if "+" in v]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"] + project["optional-dependencies"][extra]:
        match = re.fullmatch(
            r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", requirement.split("#")[0].strip()
        )
        if match:  # exact pins must be the lock's version
            package = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            assert lock.get(package) == match.group(2), f"{name}: {requirement} vs {lock.get(package)}"


def test_the_two_locks_agree_outside_the_gpu_stack():
    cpu, gpu = _lock("cpu-lock.txt"), _lock("gpu-lock.txt")
    differ = {p for p in cpu.keys() & gpu.keys() if cpu[p] != gpu[p]}
    gpu_stack = re.compile(r"^(torch|torchvision|torchaudio|triton|setuptools|nvidia-.*|cuda-.*)$")
    assert {p for p in differ if not gpu_stack.match(p)} == set()


#: Where no function may be longer than this (``def`` line to last line, docstring included): the
#: package, the workflow's scripts and the benchmarks. Tests may be longer.
MAX_FUNCTION_LINES = 60


def long_functions(source: str, path: str) -> list[str]:
    """``path:line name (n lines)`` of every function of ``source`` over MAX_FUNCTION_LINES."""
    return [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_is_longer_than_sixty_lines():
    files = [p for d in ("src", "workflow", "bench") for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 100
    found = [f for p in files for f in long_functions(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_the_function_length_check_counts_docstrings_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(57))
    fits = f'def f():\n    """Doc."""\n{body}\n    return x0\n'  # 60 lines
    assert long_functions(fits, "a.py") == []
    longer = f'def f():\n    """Doc.\n\n    More."""\n{body}\n'
    assert long_functions(longer, "a.py") == ["a.py:1 f (61 lines)"]
    nested = "class C:\n    async def g(self):\n" + "\n".join(f"        y = {i}" for i in range(61)) + "\n"
    assert long_functions(nested, "b.py") == ["b.py:2 g (62 lines)"]
