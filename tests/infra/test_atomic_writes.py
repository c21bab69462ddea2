"""A write that fails half way (a full disk: simulated with a file-size limit, so that every
writer, Python's and polars' Rust one alike, gets EFBIG) leaves no temporary file among the outputs
or the integrity records, and the previous content of its target untouched. One process runs every
case under ``RLIMIT_FSIZE`` and reports what it finds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CASES = r"""
import json, os, resource, signal, sys
from pathlib import Path
import polars as pl

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
root = Path(sys.argv[1])

def limited(limit, fn):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        fn()
        return "no error"
    except BaseException as exc:
        return type(exc).__name__
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

def files(base):
    return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())

from spader.data.records import MIX_SCHEMA, build_entities, records_frame, write_frame
from spader.evaluation.episodes import write_jsonl
from spader.infra import integrity
from spader.infra.atomic import atomic_path, atomic_write
from spader.infra.procs import Terminated

def frame(n):
    meta = dict.fromkeys(MIX_SCHEMA["meta"].to_schema())
    rows = []
    for i in range(n):
        answers, norm = build_entities([[f"Answer number {i} " + "x" * 40]])
        rows.append({"id": f"q:{i}", "dataset": "quest", "split": "train", "question": f"Question {i}?",
                     "answers": answers, "answers_norm": norm, "meta": meta})
    return records_frame(rows, MIX_SCHEMA)

report = {}
results = root / "results" / "demo"
old, new = frame(3), frame(400)  # the new table is far larger than the limit

def case(name, limit, fn, target=None):
    before = target.read_bytes() if target is not None and target.exists() else None
    error = limited(limit, fn)
    after = target.read_bytes() if target is not None and target.exists() else None
    report[name] = {"error": error, "files": files(root), "unchanged": before == after}

# the project's writers: a record table (.jsonl, .parquet: polars' own writer), evaluation records
jsonl = results / "mix" / "train.jsonl"
write_frame(old, jsonl, MIX_SCHEMA)
case("write_frame jsonl", 4096, lambda: write_frame(new, jsonl, MIX_SCHEMA), jsonl)
parquet = results / "verl" / "train.parquet"
write_frame(old, parquet, MIX_SCHEMA)
case("write_frame parquet", 4096, lambda: write_frame(new, parquet, MIX_SCHEMA), parquet)
episodes = results / "eval" / "rag" / "quest.jsonl"
write_jsonl(episodes, [{"id": 1}])
case("write_jsonl", 4096, lambda: write_jsonl(episodes, [{"id": i, "pad": "y" * 200} for i in range(100)]), episodes)
# an integrity record that does not fit (the data file itself is small)
small = results / "small.txt"
small.write_text("small\n")
case("integrity record", 64, lambda: integrity.write_record(small, producer="some_rule"), integrity.record_path(small))
# the helpers themselves: bytes that do not fit, and a stop signal in the middle of a write
target = results / "helper.bin"
case("atomic_write", 1024, lambda: atomic_write(target, b"z" * 10_000), target)

def stopped():
    with atomic_path(results / "stopped.txt") as tmp:
        tmp.write_text("half")
        raise Terminated(signal.SIGTERM)

case("atomic_path stopped", 1 << 20, stopped)
print(json.dumps(report))
"""


def test_a_failed_write_leaves_no_temporary_file_and_the_old_content(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CASES, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == {
        "write_frame jsonl", "write_frame parquet", "write_jsonl", "integrity record", "atomic_write",
        "atomic_path stopped",
    }  # fmt: skip
    for name, seen in report.items():
        assert seen["error"] != "no error", (name, seen)  # the limit really stopped the write
        leftovers = [f for f in seen["files"] if f.endswith(".tmp") or "/.tmp" in f or ".tmp." in f]
        assert leftovers == [], (name, seen["files"])
        assert seen["unchanged"], name
    assert "results/demo/stopped.txt" not in report["atomic_path stopped"]["files"]


FULL = r"""
import resource, signal, sys
from spader.infra.atomic import atomic_write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    atomic_write(sys.argv[1], b"z" * 10_000)
except OSError as exc:
    print(f"{type(exc).__name__}|{exc}|{exc.errno}")
"""


def test_an_output_that_cannot_be_written_is_named_not_its_temporary_file(tmp_path):
    import errno
    import os

    import pytest

    from spader.infra.atomic import atomic_path, atomic_write

    (tmp_path / "a-file").write_text("x\n")
    (tmp_path / "a-dir").mkdir()
    cases = {
        tmp_path / "a-file" / "out.json": (
            NotADirectoryError,
            f"{tmp_path / 'a-file'} is a file, not a directory",
        ),
        tmp_path / "a-file" / "deeper" / "out.json": (NotADirectoryError, f"{tmp_path / 'a-file'} is a file"),
        tmp_path / "a-dir": (IsADirectoryError, "it is a directory"),
    }
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if not os.access(locked, os.W_OK):  # a user's directory without write permission
        cases[locked / "out.json"] = (PermissionError, "Permission denied")
    else:  # root writes anywhere but where the kernel says no
        cases[Path("/sys/kernel/spader-out.json")] = (OSError, "")
    for target, (kind, detail) in cases.items():
        with pytest.raises(kind) as err:
            atomic_write(target, "data")
        message = str(err.value)
        assert message.startswith(f"cannot write {target}: {detail}"), message
        assert ".tmp" not in message and "Errno" not in message, message
    assert not list(tmp_path.rglob("*.tmp"))

    full = subprocess.run(
        [sys.executable, "-c", FULL, str(tmp_path / "big.json")], capture_output=True, text=True, timeout=60
    )
    kind, message, code = full.stdout.strip().split("|")
    assert message == f"cannot write {tmp_path / 'big.json'}: File too large" and int(code) == errno.EFBIG

    # an error about another file inside the block (an input it reads) is left as it is
    with pytest.raises(FileNotFoundError) as err, atomic_path(tmp_path / "out.json") as tmp:
        tmp.write_text((tmp_path / "missing-input.json").read_text())
    assert "missing-input.json" in str(err.value) and "cannot write" not in str(err.value)
