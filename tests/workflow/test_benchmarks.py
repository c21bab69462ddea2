"""Every benchmark number in the docs comes from a record a bench script wrote: docs/benchmarks.md,
the README's table and the tables and results other pages quote are the rendering of
bench/records/*.yaml, and every bench script writes a record when it runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MAIN = 'if __name__ == "__main__":'


def _bench_module(name: str):
    """``bench/<name>.py`` imported as its script would be (bench/ on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def _records_module():
    spec = importlib.util.spec_from_file_location("bench_records", REPO / "bench" / "records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_are_rendered_from_the_records():
    proc = subprocess.run(
        [sys.executable, "bench/report.py", "check"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_records_are_complete_and_name_existing_scripts():
    records = _records_module().load_records()
    assert records
    for r in records:
        assert (REPO / r["bench"]).is_file(), r["file"]
        assert r["rows"] and all(row["what"] and row["result"] for row in r["rows"]), r["file"]
        assert str(r["date"]) in r["file"]


def _bench_files() -> tuple[list[Path], list[Path]]:
    """(scripts, section modules) under bench/: a script runs on its own (``__main__``)."""
    files = [p for p in sorted((REPO / "bench").glob("*.py")) if p.name not in ("records.py", "report.py")]
    return [p for p in files if MAIN in p.read_text()], [p for p in files if MAIN not in p.read_text()]


def _imports(text: str, module: Path) -> bool:
    return bool(re.search(rf"^\s*(from {module.stem} import|import {module.stem}\b)", text, re.MULTILINE))


def test_every_bench_script_writes_a_record():
    scripts, modules = _bench_files()
    assert len(scripts) >= 10
    texts = {p: p.read_text() for p in scripts + modules}
    writes = re.compile(r"\bwrite_(?:seed_)?record\(")  # bench/records.py's writers
    # a script writes its record itself or through a section module it imports
    silent = [
        p.name
        for p in scripts
        if not writes.search(texts[p])
        and not any(writes.search(texts[m]) and _imports(texts[p], m) for m in modules)
    ]
    assert not silent, f"bench scripts that write no record: {silent}"
    # a module that is not a script is a section of one: some bench file imports it
    orphans = [m.name for m in modules if not any(_imports(text, m) for p, text in texts.items() if p != m)]
    assert not orphans, f"bench modules no script runs (give them a __main__ that writes a record): {orphans}"


def test_a_run_writes_a_dated_record_that_renders(tmp_path):
    records = _records_module()
    path = records.write_record(
        "bench/parse.py",
        [{"what": "w", "result": "**2x**", "target": ">= 1x", "verdict": "met", "numbers": {"x": 2.0}}],
        argv=["--quick"],
        directory=tmp_path,
    )
    rec = yaml.safe_load(path.read_text())
    assert rec["source"] == "measured by bench/parse.py --quick" and rec["rows"][0]["numbers"] == {"x": 2.0}
    again = records.write_record("bench/parse.py", rec["rows"], directory=tmp_path)
    assert again != path  # a second run of the day gets its own record
    loaded = records.load_records(tmp_path)
    doc = records.render_doc(loaded)
    assert doc.count("### ") == 2 and "| w | **2x** | >= 1x | met |" in doc
    table = records.render_targets_table(loaded)
    assert table.count("`bench/parse.py`") == 1  # only the latest run's targets
    assert table in doc  # at the top of docs/benchmarks.md


def test_the_latest_run_is_the_last_written_whatever_its_commit_and_name(tmp_path):
    records = _records_module()

    def run(result, commit):
        records._git_commit = lambda: commit  # two commits of one day: hashes sort in any order
        return records.write_record(
            "bench/parse.py",
            [{"id": "x", "what": "w", "result": result, "target": "t", "verdict": "met"}],
            directory=tmp_path,
        )

    run("first", "fffffff")
    run("second", "0000000")
    run("third", "0000000")  # the day's second record of that commit: ...-parse-2.yaml
    loaded = records.load_records(tmp_path)
    assert [r["rows"][0]["result"] for r in loaded] == ["first", "second", "third"]
    assert "| third |" in records.render_targets_table(loaded)
    page = records.render_blocks("<!-- bench: bench/parse.py result=x --><!-- /bench -->", loaded)
    assert page.startswith("<!-- bench: bench/parse.py result=x -->third (")


def test_doc_blocks_are_filled_from_the_latest_record_holding_them(tmp_path):
    records = _records_module()
    table = {"title": "T", "columns": ["a", "b"], "rows": [["1", "2 | 3"]]}
    records.write_record("bench/x.py", [{"id": "r", "what": "w", "result": "old"}], directory=tmp_path,
                         tables={"t": table})  # fmt: skip
    records.write_record("bench/x.py", [{"id": "r", "what": "w", "result": "new, see [p](docs/gpu.md)"}],
                         directory=tmp_path)  # fmt: skip
    loaded = records.load_records(tmp_path)
    page = (
        "Text <!-- bench: bench/x.py result=r -->stale<!-- /bench --> more.\n\n"
        "<!-- bench: bench/x.py table=t -->\n| stale |\n<!-- /bench -->\n"
    )
    out = records.render_blocks(page, loaded)
    assert "Text <!-- bench: bench/x.py result=r -->new, see [p](gpu.md) (" in out  # the latest row
    assert "| a | b |\n|---|---|\n| 1 | 2 \\| 3 |" in out  # the table: from the run that has it
    assert "stale" not in out and "](benchmarks.md#benchxpy)" in out
    assert records.render_blocks(out, loaded) == out  # idempotent
    readme = records.render_blocks(page, loaded, in_docs=False)
    assert "](docs/benchmarks.md#benchxpy)" in readme and "[p](docs/gpu.md)" in readme
    with pytest.raises(ValueError, match="no record of bench/x.py holds table 'nope'"):
        records.render_blocks("<!-- bench: bench/x.py table=nope --><!-- /bench -->", loaded)


def test_a_page_quoting_a_missing_record_fails_the_check_naming_the_page(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    records = _records_module()
    (tmp_path / "docs").mkdir()
    records.write_record(
        "bench/x.py", [{"what": "w", "result": "r"}], directory=tmp_path / "bench" / "records"
    )
    (tmp_path / "docs" / "gpu.md").write_text("<!-- bench: bench/x.py result=gone --><!-- /bench -->\n")
    with pytest.raises(ValueError, match=r"docs/gpu.md: no record of bench/x.py holds result 'gone'"):
        report.generated(tmp_path)


def test_a_bench_script_run_writes_a_record_that_renders(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/parse.py", "--max-chars", "10000", "--records", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    (record,) = _records_module().load_records(tmp_path)
    assert record["source"] == f"measured by bench/parse.py --max-chars 10000 --records {tmp_path}"
    assert "load average" in record["machine"] and record["rows"][0]["verdict"] in ("met", "not met")
    assert record["rows"][0]["numbers"]["ns_per_char_max"] > 0


@pytest.mark.slow
def test_the_gpu_benchmark_runs_on_the_cpu_with_tiny(tmp_path):
    """bench/reranker_gpu.py needs a GPU for its numbers; ``--tiny`` runs the whole script on the CPU
    (small shapes) and writes its record where ``--records`` says."""
    proc = subprocess.run(
        [sys.executable, "bench/reranker_gpu.py", "--tiny", "--records", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = _records_module().load_records(tmp_path)
    assert [row["id"] for row in record["rows"]] == ["shapes"]
    assert len(record["tables"]["shapes"]["rows"]) == 9 and "cpu" in record["rows"][0]["what"]


def test_the_replica_memory_of_a_gpu_run_adds_up_its_measured_parts():
    """The GPU-only part of bench/reranker_gpu.py on the numbers of the H200 run docs/retrieval.md
    quotes: weights + activations per token x the token cap + allocator slack + CUDA context."""
    gpu = _bench_module("reranker_gpu")
    runs = [
        {"batch": b, "tokens": t, "masked": m, "peak_activation_mib": a, "reserved_mib": r}
        for b, t, m, a, r in [(64, 160, False, 220, 1400), (256, 160, False, 880, 2426), (64, 512, False, 704, 2426),
                              (64, 512, True, 900, 2426)]
    ]  # fmt: skip
    out = {
        "runs": runs,
        "weights_mib": 1083,
        "process_gpu_mib": 3117,
        "max_reserved_mib": 2426,
        "params": 567_755_777,
    }
    m = gpu.replica_memory(out, 81_920)
    assert m["mib_per_token"] == pytest.approx(0.02148, abs=1e-5)  # the masked run is left out
    assert (m["slack_mib"], m["slack_at"], m["context_mib"]) == (463, "256 x 160", 691)
    assert m["worst_case_mib"] == pytest.approx(1083 + 0.021484 * 81_920 + 463 + 691, abs=1)
    assert gpu.memory_rows(m, out["params"])[-1][1] == "**~3,997 (3.9 GiB)**"
    assert gpu.replica_memory({"runs": [{**runs[0], "masked": False}]}, 81_920) is None  # no GPU: no table


def test_the_training_bench_builds_the_demos_typed_job_for_each_variant(tmp_path):
    train = _bench_module("train")
    for variant in ("spader", "grpo", "stepsearch", "r3rag"):
        job = train.demo_job(tmp_path, steps=2, variant=variant)
        assert job.training.max_steps == 2 and job.variant == variant
        assert job.reranker_path is not None and "path" not in job.retrieval.reranker.model_dump()
        assert (job.evidence is not None) == (variant == "stepsearch")
    with pytest.raises(SystemExit, match="not a variant"):
        train.demo_job(tmp_path, steps=2, variant="nope")


# A table of measurements (a rate or a latency in a cell, or a header naming what was measured over
# rows of numbers) outside a block rendered from a record would hold numbers no script reproduces.
_MEASURED = re.compile(r"\d\s*(ms|q/s|pairs/s|docs/s|requests/s|episodes/s|entities/s|tokens/s)\b")
_MEASURED_HEADER = re.compile(
    r"q/s|pairs/s|docs/s|requests/s|episodes/s|\bp50\b|\bp99\b|latency|\bRSS\b|speed-up"
)


def measured_tables(text: str) -> list[str]:
    """First lines of the Markdown tables of ``text`` that hold measurements."""
    found, table = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            header, body = table[0], table[2:]
            if any(_MEASURED.search(row) for row in table) or (
                _MEASURED_HEADER.search(header) and any(re.search(r"\d", row) for row in body)
            ):
                found.append(header)
            table = []
    return found


def test_the_readme_quotes_no_record():
    """The README is read in a terminal: benchmark results and their provenance live under docs/."""
    readme = (REPO / "README.md").read_text()
    assert "<!-- bench:" not in readme and "<!-- benchmarks" not in readme


def test_measured_numbers_in_doc_tables_come_from_records():
    records = _records_module()
    pages = [p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "benchmarks.md"]
    offenders = []
    for page in [*pages, REPO / "README.md"]:
        text = records.BLOCK.sub("", page.read_text())
        offenders += [f"{page.relative_to(REPO)}: {header[:100]}" for header in measured_tables(text)]
    assert not offenders, "tables of measurements not rendered from a record:\n" + "\n".join(offenders)


def test_the_check_catches_a_measured_table_outside_a_block():
    assert measured_tables("| run | time |\n|---|---|\n| ours | 59.7 q/s |\n")
    assert measured_tables("text\n\n| rate | q/s cache / none |\n|---|---|\n| 50% | 126.8 / 80.5 |\n\nmore")
    assert not measured_tables("| | MiB |\n|---|---|\n| weights | 1,083 |\n")  # memory: a plan's too
    assert not measured_tables("| key | meaning |\n|---|---|\n| `p99` | the latency quantile |\n")
