"""A local source (a ``file:`` URL or a path: the demo's releases, a user's ``WebQSP.zip``, a local
dump) is seen when it changes in place: its download's param holds the sha256 of its content
(spader.infra.sources), so an edit reruns the download and what is built from it, and an
unchanged source plans nothing.

The plans are Snakemake's own, through its API, against a finished state of the demo's DAG whose
sources are copies in the test's directory (tests/support/rerun_walk.py); the WebQSP route of the
docs runs for real (download and normalization of one release)."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from rerun_walk import finish, plan, put, read_config

from spader.infra import integrity
from spader.infra.sources import content_sha256, planned_sha256, record_source_digest, source_sha256

REPO = Path(__file__).resolve().parents[2]
WEBQSP = REPO / "resources" / "demo" / "WebQSP.zip"
TEST_MEMBER = "WebQSP/data/WebQSP.test.json"


@pytest.fixture
def local_demo(tmp_path, monkeypatch):
    """The demo's config with its WebQSP release and its dump copied to the test's directory (the
    release named by a plain path, as the config's comment tells a user to, the dump by a
    ``file:`` URL), and the finished state of its DAG."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sources = tmp_path / "manual"
    sources.mkdir()
    shutil.copy2(WEBQSP, sources / "WebQSP.zip")
    shutil.copy2(REPO / "resources" / "demo" / "chunked_wikipedia.tar.gz", sources / "dump.tar.gz")
    config = read_config("demo.yaml")
    put(config, ("datasets", "webqsp", "files", "WebQSP.zip"), {"url": str(sources / "WebQSP.zip")})
    put(config, ("corpus", "url"), f"file:{sources / 'dump.tar.gz'}")
    work = tmp_path / "work"
    finish(config, work)
    return config, work, sources


def _planned(jobs) -> set[tuple[str, str]]:
    return {(rule, dict(wc).get("dataset", "")) for rule, wc in jobs}


def test_an_unchanged_source_plans_nothing_and_an_edit_in_place_reruns_its_download(local_demo):
    config, work, sources = local_demo
    assert plan(config, work) == set()
    with zipfile.ZipFile(sources / "WebQSP.zip", "a") as z:  # a record appended in place
        z.writestr("WebQSP/data/extra.json", json.dumps({"Questions": []}))
    planned = _planned(plan(config, work))
    assert ("download_dataset", "webqsp") in planned and ("normalize_dataset", "webqsp") in planned
    assert {r for r, d in planned if r == "download_dataset" and d != "webqsp"} == set()  # only its download
    assert ("normalize_dataset", "qampari") not in planned
    assert {"mix_training_set", "export_eval_set", "warmstart_policy", "train_policy"} <= {
        r for r, _ in planned
    }


def test_a_dump_changed_in_place_with_its_size_and_time_kept_is_seen(local_demo):
    config, work, sources = local_demo
    dump = sources / "dump.tar.gz"
    st = dump.stat()
    data = bytearray(dump.read_bytes())
    data[-1] ^= 0xFF  # one byte flipped in the gzip trailer: same size
    dump.write_bytes(bytes(data))
    os.utime(dump, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the modification time restored
    planned = {rule for rule, _ in plan(config, work)}
    assert {"download_dump", "build_bm25_index", "warmstart_policy"} <= planned
    assert "download_dataset" not in planned


def test_digests_are_cached_on_the_files_identity_and_read_again_when_it_changes(tmp_path):
    source = tmp_path / "release.json"
    source.write_text('{"a": 1}\n')
    cache = tmp_path / "cache"
    first = content_sha256(source, cache)
    assert first == integrity.sha256_file(source) and len(list(cache.iterdir())) == 1
    (next(cache.iterdir())).write_text("f" * 64 + "\n")  # what a start reads back, without hashing
    assert content_sha256(source, cache) == "f" * 64
    source.write_text('{"a": 2}\n')  # a change: read again
    assert content_sha256(source, cache) == integrity.sha256_file(source)
    assert source_sha256("https://example.org/release.json", tmp_path) is None
    assert source_sha256(f"file:{tmp_path / 'missing.json'}", tmp_path) is None
    assert source_sha256("release.json", tmp_path, cache) == integrity.sha256_file(source)


def test_a_copy_made_before_downloads_noted_the_digest_keeps_its_param(tmp_path):
    """The first start with content digests reruns nothing that did not change: a copy recorded
    without ``source_sha256`` whose content is the source's plans with the param it was built with
    (none); a changed source, or a copy that noted it, plans with the digest."""
    copy = tmp_path / "resources" / "demo" / "datasets" / "webqsp" / "WebQSP.zip"
    copy.parent.mkdir(parents=True)
    shutil.copy2(WEBQSP, copy)
    integrity.write_record(copy, extra={"source": "resources/demo/WebQSP.zip"})  # as downloads did
    digest = content_sha256(WEBQSP)
    assert planned_sha256(digest, copy) is None
    assert planned_sha256("0" * 64, copy) == "0" * 64  # the source changed since
    record_source_digest(copy, digest)
    assert planned_sha256(digest, copy) == digest


def test_a_source_replaced_in_place_is_copied_again_with_the_digest_planned(tmp_path):
    """The download of a changed local source copies the new content: the digest it is given wins
    over the earlier copy's record (its size too) and over the verified twin kept for relinking."""
    from spader.infra.download import fetch, keep_path

    source, dest = tmp_path / "WebQSP.zip", tmp_path / "resources" / "demo" / "WebQSP.zip"
    source.write_bytes(b"old release\n")
    fetch(str(source), dest, sha256=content_sha256(source))
    source.write_bytes(b"a new release, longer\n")
    dest.unlink()  # as Snakemake removes the output of a job it reruns
    fetch(str(source), dest, sha256=content_sha256(source))
    assert dest.read_bytes() == keep_path(dest).read_bytes() == b"a new release, longer\n"
    assert integrity.read_record(dest).sha256 == content_sha256(source)


def test_a_named_run_copies_a_source_itself_when_it_changed_since_the_default_run_copied_it(smk, tmp_path):
    """A named run shares the default run's copy of a local source only while the source holds
    what was copied; after an edit in place (which the default run has not seen yet) it copies the
    release itself, and builds what reads it itself."""
    manual = tmp_path / "manual" / "WebQSP.zip"
    manual.parent.mkdir()
    shutil.copy2(WEBQSP, manual)
    copy = tmp_path / "work" / "resources" / "demo" / "datasets" / "webqsp" / "WebQSP.zip"
    copy.parent.mkdir(parents=True)
    shutil.copy2(WEBQSP, copy)  # the default run's copy, as its download records it
    integrity.write_record(copy, extra={"source": str(manual), "source_sha256": content_sha256(manual)})
    (tmp_path / "webqsp.yaml").write_text(
        json.dumps({"datasets": {"webqsp": {"files": {"WebQSP.zip": {"url": str(manual)}}}}})
    )
    (tmp_path / "probe.yaml").write_text("run: probe\n")
    target = "results/demo/data/verl/train.parquet"  # the run's own: what reads the release
    args = [
        "-s",
        str(REPO / "workflow" / "Snakefile"),
        "-d",
        str(tmp_path / "work"),
        "-n",
        "--forceall",
        target,
    ]
    args += [
        "--configfile",
        str(REPO / "config" / "demo.yaml"),
        str(tmp_path / "webqsp.yaml"),
        str(tmp_path / "probe.yaml"),
    ]

    def download() -> str:
        proc = smk.run(*args, cwd=tmp_path)
        jobs = smk.parse_jobs(proc.stdout + proc.stderr)
        (job,) = [j for j in jobs if j.rule == "download_dataset" and j.wildcards["dataset"] == "webqsp"]
        return job.fields["output"]

    assert download() == "../../../resources/demo/datasets/webqsp/WebQSP.zip"
    with zipfile.ZipFile(manual, "a") as z:
        z.writestr("WebQSP/data/extra.json", "{}")
    assert download() == "resources/demo/datasets/webqsp/WebQSP.zip"


@pytest.mark.slow
def test_the_webqsp_route_works_after_an_in_place_replacement(smk, tmp_path):
    """The docs' route for WebQSP (a local path in `datasets.webqsp.files["WebQSP.zip"].url`), run
    for real: a release replaced in place by one with a question fewer is copied again and its
    split normalized again; an unchanged one plans nothing."""
    manual = tmp_path / "manual" / "WebQSP.zip"
    manual.parent.mkdir()
    shutil.copy2(WEBQSP, manual)
    overlay = tmp_path / "webqsp.yaml"
    overlay.write_text(json.dumps({"datasets": {"webqsp": {"files": {"WebQSP.zip": {"url": str(manual)}}}}}))
    work = tmp_path / "work"
    work.mkdir()
    target = "results/demo/data/normalized/webqsp/test.jsonl"
    args = ["-s", str(REPO / "workflow" / "Snakefile"), "-d", str(work), "--cores", "1", target]
    args += ["--configfile", str(REPO / "config" / "demo.yaml"), str(overlay)]
    smk.run(*args, cwd=tmp_path)
    before = (work / target).read_text().splitlines()
    assert not smk.parse_jobs(smk.run(*args, "-n", cwd=tmp_path).stdout)  # nothing to do
    with zipfile.ZipFile(WEBQSP) as z:
        members = {name: z.read(name) for name in z.namelist()}
    test = json.loads(members[TEST_MEMBER])
    test["Questions"] = test["Questions"][1:]
    members[TEST_MEMBER] = json.dumps(test).encode()
    with zipfile.ZipFile(manual, "w") as z:  # replaced in place
        for name, data in members.items():
            z.writestr(name, data)
    proc = smk.run(*args, "-n", cwd=tmp_path)
    assert {j.rule for j in smk.parse_jobs(proc.stdout + proc.stderr)} == {
        "download_dataset",
        "normalize_dataset",
    }
    smk.run(*args, cwd=tmp_path)
    after = (work / target).read_text().splitlines()
    assert len(after) == len(before) - 1
    copied = work / "resources" / "demo" / "datasets" / "webqsp" / "WebQSP.zip"
    assert copied.read_bytes() == manual.read_bytes()
    assert integrity.read_record(copied).extra["source_sha256"] == integrity.sha256_file(manual)
