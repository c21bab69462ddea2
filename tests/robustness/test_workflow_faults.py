"""Faults through the real workflow (demo config, a copy of the repository): a ``snakemake`` killed
while the corpus downloads, a corrupted intermediate met by the next rule, and MLflow runs left
RUNNING by a SIGKILL of snakemake and its job. Tracking is off except where it is tested."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DUMP = "resources/demo/corpus/chunked_wikipedia.tar.gz"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


class SlowServer:
    """Serves the demo dump with an ETag and Range/If-Range, ``rate`` bytes per second."""

    def __init__(self, data: bytes, rate: int):
        self.data, self.rate = data, rate
        self.requests: list[dict] = []
        self.sent = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.requests.append({"range": rng, "if_range": self.headers.get("If-Range")})
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header(
                        "Content-Range", f"bytes {start}-{len(outer.data) - 1}/{len(outer.data)}"
                    )
                self.send_header("ETag", '"dump-v1"')
                self.send_header("Content-Length", str(len(outer.data) - start))
                self.end_headers()
                step = max(1, outer.rate // 20)
                try:
                    for i in range(start, len(outer.data), step):
                        self.wfile.write(outer.data[i : i + step])
                        self.wfile.flush()
                        outer.sent += len(outer.data[i : i + step])
                        time.sleep(0.05)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/chunked_wikipedia.tar.gz"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _snakemake(work: Path, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "XDG_CACHE_HOME": str(work.parent / "cache")}
    return subprocess.Popen(
        [SNAKEMAKE, *args, "--cores", "1", "--configfile", "config/demo.yaml", "overlay.yaml"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kw,
    )


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def work(tmp_path, smk):
    work = smk.copy_repo(tmp_path / "repo")
    (work / "overlay.yaml").write_text("mlflow:\n  enabled: false\n")
    return work


def _stopped(server, quiet_s: float = 3.0, timeout: float = 60.0) -> None:
    """Wait until the server has sent nothing for ``quiet_s`` seconds (its client is gone)."""
    deadline = time.monotonic() + timeout
    while True:
        sent = server.sent
        time.sleep(quiet_s)
        if server.sent == sent:
            return
        assert time.monotonic() < deadline, "the download went on after its workflow was gone"


@pytest.mark.parametrize("how", ["sigkill_snakemake", "sigint"])
def test_interrupted_run_keeps_the_download(work, how):
    """However the workflow ends mid-download (Ctrl-C, or snakemake killed outright), its download
    job ends with it (spader.infra.procs.watch_workflow), keeps the partial file, and the rerun
    resumes the transfer where it stopped."""
    data = (work / "resources/demo/chunked_wikipedia.tar.gz").read_bytes()
    server = SlowServer(data, rate=len(data) // 20)  # ~20 s for the whole file
    try:
        (work / "overlay.yaml").write_text(f"mlflow:\n  enabled: false\ncorpus:\n  url: {server.url}\n")
        part = work / (DUMP + ".part")
        proc = _snakemake(work, DUMP)
        _wait(lambda: part.exists() and part.stat().st_size > 0, 120, "the transfer to start")
        if how == "sigkill_snakemake":
            os.kill(proc.pid, signal.SIGKILL)  # snakemake alone: its download job must not go on
            proc.communicate(timeout=60)
            _stopped(server)
            assert _finish(_snakemake(work, DUMP, "--unlock"))[0] == 0  # what snakemake asks one to do
        else:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals snakemake and its job
            rc, out = _finish(proc, 120)
            assert rc != 0, out
        assert not (work / DUMP).exists() and server.sent < len(data)
        kept = part.stat().st_size if part.exists() else 0
        sent = server.sent
        server.requests.clear()

        rc, out = _finish(_snakemake(work, DUMP, "--rerun-incomplete"))
        assert rc == 0, out
        assert (work / DUMP).read_bytes() == data
        # the partial transfer resumes where it stopped, with the validator of its first response
        assert kept > 0 and server.requests[0]["range"] == f"bytes={kept}-"
        assert server.requests[0]["if_range"] == '"dump-v1"'
        assert server.sent - sent == len(data) - kept
    finally:
        server.close()


def test_corrupted_intermediate_names_file_and_rule(work):
    target = "results/demo/data/eval/quest.jsonl"
    rc, out = _finish(_snakemake(work, target))
    assert rc == 0, out
    normalized = work / "results/demo/data/normalized/quest/test.jsonl"
    lines = normalized.read_text().splitlines(keepends=True)
    normalized.write_text("".join(lines[:-2]))  # two records lost; the file is still valid JSON Lines
    rc, out = _finish(_snakemake(work, target))
    assert rc != 0
    log = (work / "logs/export_eval_set/demo/quest.log").read_text()
    assert "IntegrityError" in log and f"{Path('results/demo/data/normalized/quest/test.jsonl')}" in log
    assert "rule 'normalize_dataset'" in log and "--forcerun normalize_dataset" in log


def test_runs_left_running_by_a_sigkill_are_marked_killed(work):
    import mlflow

    (work / "overlay.yaml").write_text("mlflow:\n  enabled: true\n")
    target = "results/demo/data/normalized/quest/test.jsonl"
    proc = _snakemake(work, target)
    db = work / "results/mlflow/mlflow.db"
    norm_log = work / "logs/normalize_dataset/demo/quest/test.log"
    _wait(lambda: norm_log.exists(), 300, "the normalize job to start")
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake and its job: a crashed node
    proc.communicate(timeout=60)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("spader")
    running = {r.info.run_id for r in client.search_runs([exp.experiment_id]) if r.info.status == "RUNNING"}
    assert running  # at least the pipeline run
    assert _finish(_snakemake(work, target, "--unlock"))[0] == 0

    rc, out = _finish(_snakemake(work, target, "--rerun-incomplete"))
    assert rc == 0, out
    runs = {r.info.run_id: r for r in client.search_runs([exp.experiment_id])}
    assert all(runs[i].info.status == "KILLED" for i in running)
    assert all("is gone" in runs[i].data.tags["spader.killed_reason"] for i in running)
    assert not [r for r in runs.values() if r.info.status == "RUNNING"]


def test_a_failed_job_prints_its_cause_on_the_console(work):
    """The console shows a failed job's one-line cause, not only "message: None" and a log path: the
    job writes it to its stderr as it fails, and the run's onerror hook lists every failed job with
    the cause from its log (what a cluster run, whose jobs' stderr goes to SLURM logs, relies on)."""
    (work / "overlay.yaml").write_text(
        "mlflow:\n  enabled: false\n"
        "datasets:\n  quest:\n    files:\n      test.jsonl: {url: file:resources/demo/quest/gone.jsonl}\n"
    )
    rc, out = _finish(_snakemake(work, "resources/demo/datasets/quest/test.jsonl"))
    assert rc != 0
    cause = "DownloadError: source file " + str(work / "resources/demo/quest/gone.jsonl") + " does not exist"
    assert f"Error: download_dataset failed: {cause}" in out, out[-3000:]
    summary = out.split("Failed jobs and their causes:", 1)[1]
    assert f"download_dataset (suite=demo, dataset=quest, file=test.jsonl): {cause}" in summary
    assert "[log: logs/download_dataset/demo/quest/test.jsonl.log]" in summary


def test_a_job_killed_outright_is_summarised_with_its_signal(work):
    """A job killed alone by SIGKILL (as the kernel's out-of-memory killer ends one) writes no cause;
    the run's summary names the signal Snakemake saw instead of "no cause recorded"."""
    import psutil

    data = (work / "resources/demo/chunked_wikipedia.tar.gz").read_bytes()
    server = SlowServer(data, rate=len(data) // 30)  # ~30 s for the whole file
    try:
        (work / "overlay.yaml").write_text(f"mlflow:\n  enabled: false\ncorpus:\n  url: {server.url}\n")
        part = work / (DUMP + ".part")
        proc = _snakemake(work, DUMP)
        _wait(lambda: part.exists() and part.stat().st_size > 0, 120, "the transfer to start")
        job = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "download_dump.py" in " ".join(p.cmdline())
        ]
        assert len(job) == 1, job
        job[0].kill()  # the job alone; snakemake goes on and reports it
        rc, out = _finish(proc, 120)
    finally:
        server.close()
    assert rc != 0
    summary = out.split("Failed jobs and their causes:", 1)[1]
    assert (
        "download_dump (suite=demo): killed by SIGKILL (signal 9), which no process can catch: the kernel's out-of-memory killer sends it"
        in summary
    ), out[-3000:]
    assert "no cause recorded" not in summary


def test_what_only_the_user_can_supply_stops_the_run_before_any_job(work):
    """A target that needs WebQSP.zip without its url, or a gated model without a hub token, stops
    before any job starts, with one line naming the key or the token and what to do (a dry run
    only warns, as every start does)."""
    (work / "overlay.yaml").write_text(
        "mlflow:\n  enabled: false\ndatasets:\n  webqsp:\n    files:\n      WebQSP.zip: {url: null}\n"
    )
    rc, out = _finish(_snakemake(work, "results/demo/data/normalized/webqsp/test.jsonl"))
    assert rc != 0
    assert (
        "this run cannot start:\nconfig key 'datasets.webqsp.files.WebQSP.zip.url' is not set: WebQSP is not "
        "redistributable: download WebQSP.zip from https://www.microsoft.com/en-us/download/details.aspx?id=52763, "
        "then set this key to its local path\n"
    ) in out, out[-3000:]
    assert not (work / "resources/demo/datasets").exists() and not (work / "logs").exists()  # no job ran

    hf_home = work.parent / "hf"  # no token anywhere
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_TOKEN_PATH")}
    proc = subprocess.run(
        [SNAKEMAKE, "resources/models/hub/meta-llama--Llama-3.1-8B-Instruct", "--cores", "1",
         "--configfile", "config/demo.yaml", "overlay.yaml"],
        cwd=work, env={**env, "HF_HOME": str(hf_home), "XDG_CACHE_HOME": str(work.parent / "cache")},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "this run cannot start:\nmeta-llama/Llama-3.1-8B-Instruct is a gated model and no hub token is "
        "configured: accept its licence at https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct with your "
        f"account, then set HF_TOKEN or run `hf auth login` (it writes {hf_home / 'token'})"
    ) in out, out[-3000:]
    assert not (work / "resources/models/hub").exists() and not (work / "logs").exists()
