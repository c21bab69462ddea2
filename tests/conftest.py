"""Shared test helpers (the `smk` fixture): run the real `snakemake` CLI of the project's venv in
the repository or in a copy of it, and parse its dry-run job listing; the session's run of the
README's CPU demo (`demo_run`), started in the background at the session's first test."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake_env(cwd: Path) -> dict[str, str]:
    """The environment of a snakemake run in ``cwd``: XDG_CACHE_HOME is kept inside the work dir;
    in a copy of the repository, the copy's own package is imported (jobs run it and code
    fingerprints hash it)."""
    env = dict(os.environ, XDG_CACHE_HOME=str(Path(cwd) / ".cache"))
    if Path(cwd).resolve() != REPO.resolve() and (Path(cwd) / "src" / "spader").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(cwd) / "src"), env.get("PYTHONPATH")]))
    return env


def run_snakemake(
    *args: str, cwd: Path = REPO, check: bool = True, timeout: float = 900
) -> subprocess.CompletedProcess:
    """Run the project's snakemake (environment: :func:`snakemake_env`)."""
    proc = subprocess.run(
        [SNAKEMAKE, *args], cwd=cwd, env=snakemake_env(cwd), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


@dataclass
class Job:
    rule: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, str]:
        out = {}
        for part in self.fields.get("resources", "").split(", "):
            if "=" in part:
                k, v = part.split("=", 1)
                out[k.strip()] = v.strip()
        return out

    @property
    def wildcards(self) -> dict[str, str]:
        out = {}
        for part in self.fields.get("wildcards", "").split(", "):
            if "=" in part:
                k, v = part.split("=", 1)
                out[k.strip()] = v.strip()
        return out


_RULE = re.compile(r"^(?:local)?rule (\w+):$")
_FIELD = re.compile(r"^    (\w+): (.*)$")


def parse_jobs(text: str) -> list[Job]:
    """Jobs of a `snakemake -n` listing (rule name plus its indented fields)."""
    jobs: list[Job] = []
    current: Job | None = None
    for line in text.splitlines():
        m = _RULE.match(line)
        if m:
            current = Job(m.group(1))
            jobs.append(current)
            continue
        if current is not None:
            f = _FIELD.match(line)
            if f:
                current.fields[f.group(1)] = f.group(2)
            elif line and not line.startswith(" "):
                current = None
    return jobs


def dry_run_jobs(*args: str, cwd: Path = REPO) -> list[Job]:
    proc = run_snakemake("-n", "--forceall", "--nolock", *args, cwd=cwd)
    return parse_jobs(proc.stdout + proc.stderr)


def copy_repo(dest: Path) -> Path:
    """Copy the working tree as a fresh clone would see it (tracked + untracked, not ignored)."""
    files = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        src = REPO / rel
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        elif src.is_file():
            shutil.copy2(src, target)
    return dest


def demo_commands() -> list[list[str]]:
    """The README's CPU demo commands (the default run, then the authors' run beside it), each
    without its ``snakemake``."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## CPU demo", 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL).group(1).strip()
    commands = []
    for line in filter(None, (line.strip() for line in block.splitlines())):
        args = line.split()
        assert args[0].endswith("snakemake"), line
        commands.append(args[1:])
    return commands


def demo_args() -> list[str]:
    """The README's first CPU demo command (the default run), without its ``snakemake``."""
    return demo_commands()[0]


class Smk:
    """What the tests use (conftest modules are not importable under --import-mode=importlib)."""

    repo = REPO
    env = staticmethod(snakemake_env)
    run = staticmethod(run_snakemake)
    dry_run_jobs = staticmethod(dry_run_jobs)
    parse_jobs = staticmethod(parse_jobs)
    copy_repo = staticmethod(copy_repo)
    demo_args = staticmethod(demo_args)
    demo_commands = staticmethod(demo_commands)


@pytest.fixture(scope="session")
def smk() -> Smk:
    return Smk()


class BackgroundDemo:
    """The README's CPU demo command running in a fresh copy of the repository while other tests
    run: it waits mostly on its own jobs, so the session's other tests use the cores it leaves."""

    # A guard against a hung demo, not its budget (bench/demo.py measures that): beside the rest of
    # the suite on a slow 2-core machine that also ran other work, the demo once passed 60 minutes.
    TIMEOUT_S = 5000.0

    def __init__(self, root: Path):
        self.work = copy_repo(root / "repo")
        self.output = root / "snakemake.out"
        self.started = time.monotonic()
        self.finished: float | None = None
        # the README's commands one after the other, in one process group (stopped together)
        script = " && ".join(shlex.join([SNAKEMAKE, *args]) for args in demo_commands())
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", script],
                cwd=self.work,
                env=snakemake_env(self.work),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.finished = time.monotonic()

    def result(self) -> dict:
        """Wait for the demo; ``{"work": the copy, "elapsed": its wall seconds, "log": snakemake's
        output}``. Raises AssertionError when it failed or ran past :attr:`TIMEOUT_S`."""
        self._waiter.join(max(0.0, self.started + self.TIMEOUT_S - time.monotonic()))
        log = self.output.read_text(errors="replace")
        if self.finished is None:
            self.stop()
            raise AssertionError(f"the demo ran past {self.TIMEOUT_S:.0f} s:\n{log[-8000:]}")
        if self.proc.returncode != 0:
            raise AssertionError(f"the demo failed ({self.proc.returncode}):\n{log[-12000:]}")
        return {"work": self.work, "elapsed": self.finished - self.started, "log": log}

    def stop(self) -> None:
        """End the demo's process group when it is still running (the session ends early)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)


def pytest_collection_modifyitems(config, items):
    """The tests that read the session's demo run go last (in their order), so that the run, started
    in the background at the session's first test, overlaps every other test."""
    readers = [item for item in items if "demo_run" in getattr(item, "fixturenames", ())]
    if readers:
        items[:] = [item for item in items if item not in readers] + readers


@pytest.fixture(scope="session", autouse=True)
def _background_demo(request, tmp_path_factory):
    """Start the demo at the session's first test when a selected test reads it (``demo_run``)."""
    if not any("demo_run" in item.fixturenames for item in request.session.items):
        yield None
        return
    demo = BackgroundDemo(tmp_path_factory.mktemp("demo"))
    yield demo
    demo.stop()


@pytest.fixture(scope="session")
def demo_run(_background_demo) -> dict:
    """The session's run of the README's CPU demo in a fresh copy of the repository, shared by the
    tests that read it (tests/workflow/test_demo.py, which then mutates the copy, runs after the
    others).

    Returns:
        ``{"work": the copy, "elapsed": its wall seconds, "log": snakemake's output}``.
    """
    run = _background_demo.result()
    print(f"demo wall time: {run['elapsed']:.0f} s")
    return run


# Tiny random models (spader.demo.tiny), built once per test session and shared by every test
# directory: their outputs are meaningless by design (no weights can be downloaded here).
@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen3 with its chat template."""
    from spader.demo.tiny import build_tiny_qwen3

    # one key/value head: the shape the suite's expectations were written against
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "qwen3", kv_heads=1)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tiny_model) -> Path:
    return tiny_model


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    """The tiny Qwen3's tokenizer, loaded as the engines load it."""
    from spader.agent.generation import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory) -> Path:
    """A tiny random cross-encoder of bge-reranker-v2-m3's architecture."""
    from spader.demo.tiny import build_tiny_reranker

    return build_tiny_reranker(tmp_path_factory.mktemp("tiny") / "reranker")
