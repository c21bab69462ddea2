"""The pieces a training job stops verl with: its stop control (signals to a stop request), the
lineage's retry rule, and the watch of its workflow and retrieval service. The end-to-end runs are
in tests/training/test_run.py (FAKE trainer) and tests/cpu_training/ (verl on the CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from spader.infra.procs import STOP_REQUEST_ENV, Terminated, acknowledge_stop, stop_requested
from spader.training.lineage import lineage_of, retry_refusal
from spader.training.stop import (
    RESUME_EXIT_CODE,
    StopControl,
    TimeLimitWatch,
    catch_stop_requests,
    parse_slurm_duration,
    read_stop_ack,
    slurm_signal_option,
)
from spader.training.watch import JobWatch, ProcessRef, ServiceHealth


def test_warning_signal_and_first_sigterm_request_a_stop_second_sigterm_stops(tmp_path):
    stop = StopControl(tmp_path / "stop_request")
    env = {STOP_REQUEST_ENV: str(stop.request_file)}
    with stop.handling_signals():
        assert not stop_requested(env)
        os.kill(os.getpid(), signal.SIGURG)  # SLURM's warning
        time.sleep(0.1)
        assert stop_requested(env) and "time-limit warning (SIGURG)" in stop.reason
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)  # the hard limit after it
            time.sleep(1)
    stop = StopControl(tmp_path / "stop_request")  # a new attempt starts without the old request
    assert not stop_requested(env)
    with stop.handling_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
    assert stop.reason == "SIGTERM" and stop_requested(env)
    acknowledge_stop(7, early=True, environ=env)
    assert read_stop_ack(stop.request_file) == {"step": 7, "early": True}
    stop.clear()
    assert read_stop_ack(stop.request_file) is None and not stop_requested(env)


def test_a_warning_before_the_stop_control_exists_is_kept_for_it(tmp_path):
    """SLURM warns once, possibly while the job is still importing: the job script's first statement
    catches it, and the job's stop control, once it starts, asks verl to stop at its first step
    boundary (on the old code the warning was lost: nothing handled SIGURG yet)."""
    previous = signal.getsignal(signal.SIGURG)
    try:
        catch_stop_requests()
        os.kill(os.getpid(), signal.SIGURG)
        time.sleep(0.1)
        stop = StopControl(tmp_path / "stop_request")  # an old request file is cleared...
        assert not stop.requested and not stop.request_file.exists()
        with stop:  # ...and the kept warning asks verl to stop as soon as the control is active
            assert "time-limit warning (SIGURG)" in stop.reason and stop.request_file.exists()
            os.kill(os.getpid(), signal.SIGURG)  # later warnings reach the active control directly
            time.sleep(0.1)
        with StopControl(tmp_path / "stop_request") as again:  # the request was handed over once
            assert not again.requested
    finally:
        signal.signal(signal.SIGURG, previous)


def test_the_time_left_in_the_allocation_asks_for_the_stop():
    """Nothing depends on catching the one warning signal: the job reads the time its allocation has
    left and asks for the stop itself once that is warning_s or less."""
    assert parse_slurm_duration("1-02:03:04") == 93784
    assert parse_slurm_duration("2:03:04") == 7384 and parse_slurm_duration("9:30") == 570
    assert parse_slurm_duration("UNLIMITED") is None and parse_slurm_duration("NOT_SET") is None
    left = iter([900.0, None, 610.0, 590.0, 100.0])
    asked = []
    watch = TimeLimitWatch(600, job_id="42", time_left=lambda job: next(left), request=asked.append)
    assert [watch.check() for _ in range(4)] == [False, False, False, True]
    assert asked == [
        "SLURM job 42 has 590 s left before its time limit (training.time_limit.warning_s is 600)"
    ]
    assert watch.check() and len(asked) == 1  # asked once
    readings = []
    with TimeLimitWatch(600, job_id="7", interval_s=0.05, time_left=readings.append, request=asked.append):
        time.sleep(0.3)
    assert len(readings) >= 3 and readings[0] == "7"  # read from the start, then every interval
    assert not TimeLimitWatch(600, job_id="", time_left=readings.append).check()  # no SLURM job: nothing


def test_the_warning_signal_is_ignored_by_processes_that_do_not_ask_for_it():
    """Why SIGURG: SLURM signals every process of the job step; SIGURG's default action is to
    ignore it, SIGUSR1's is to terminate (Snakemake inside the allocation among them)."""
    assert slurm_signal_option(900) == "--signal=URG@900"
    for signum, survives in ((signal.SIGURG, True), (signal.SIGUSR1, False)):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        time.sleep(0.5)
        proc.send_signal(signum)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        assert (proc.poll() is None) is survives, signum
        proc.kill()
        proc.wait()
    assert RESUME_EXIT_CODE == 75


def test_retry_rule_counts_failures_in_a_row():
    def attempt(status):
        return [{"event": "start"}, {"event": "end", "status": status, "error": f"E {status}"}]

    failed_twice = attempt("failed") + attempt("failed")
    assert retry_refusal(failed_twice, attempt=1, failure_retries=0) is None  # by hand
    assert retry_refusal(failed_twice, attempt=3, failure_retries=2) is None
    assert "last 2 attempt(s) failed" in retry_refusal(failed_twice, attempt=3, failure_retries=1)
    assert retry_refusal(failed_twice + attempt("stopped"), attempt=4, failure_retries=0) is None
    assert retry_refusal([*failed_twice, {"event": "start"}], attempt=4, failure_retries=0) is None  # killed
    refused = [*failed_twice, {"event": "refused"}]
    assert retry_refusal(refused, attempt=4, failure_retries=1) is not None


def test_lineage_is_the_run_that_started_from_scratch():
    assert lineage_of([], resume_step=0, run_id="a") == "a"
    history = [{"event": "start", "lineage": "a"}, {"event": "end"}, {"event": "start", "lineage": "a"}]
    assert lineage_of(history, resume_step=3, run_id="b") == "a"
    assert lineage_of(history, resume_step=0, run_id="c") == "c"  # retrained from scratch


class _Service(BaseHTTPRequestHandler):
    counts: ClassVar[dict[str, int]] = {"queries": 0, "failed_queries": 0}

    def do_GET(self):
        body = {"queries": self.counts["queries"], "failed_queries": self.counts["failed_queries"]}
        if self.path == "/health":
            body = {"status": "ok", "pid": os.getpid(), "stats": body}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_search_error_rate_above_the_threshold_is_a_problem():
    """The failed share of an interval's queries, from the service's own counters (/stats)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        health = ServiceHealth(url, max_error_rate=0.2, min_queries=50)
        assert health.pid == os.getpid()
        _Service.counts.update(queries=40, failed_queries=40)
        assert health.problem() is None  # too few queries to judge
        _Service.counts.update(queries=140, failed_queries=50)  # 50 of 140 since the start: 36%
        problem = health.problem()
        assert problem and "failed 50 of 140 search queries (36%)" in problem
        assert "training.max_search_error_rate (20%)" in problem
        _Service.counts.update(queries=240, failed_queries=60)  # 10 of the last 100
        assert health.problem() is None
    finally:
        server.shutdown()


def test_the_watch_stops_the_command_once_its_workflow_is_gone(tmp_path):
    """A stand-in workflow process dies; the watch stops the command it was given."""
    workflow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    import psutil

    ref = ProcessRef(workflow.pid, psutil.Process(workflow.pid).create_time())
    try:
        with JobWatch(workflow=ref, interval_s=0.1) as watch:
            watch.attach(command)
            workflow.kill()
            workflow.wait()
            assert command.wait(timeout=10) == -signal.SIGTERM
        assert watch.kind == "workflow" and f"pid {workflow.pid}) is gone" in watch.reason
    finally:
        command.kill()
        workflow.kill()


def test_the_workflow_of_a_job_is_its_nearest_snakemake_ancestor(tmp_path):
    """A job started (through a shell) by a process running Snakemake finds that process."""
    snakemake = tmp_path / "snakemake"
    snakemake.symlink_to(sys.executable)  # a process whose command line is `.../snakemake ...`
    job = "from spader.training.watch import workflow_process; print(workflow_process().pid)"
    parent = "import os, subprocess, sys; print(os.getpid()); subprocess.run(['sh', '-c', sys.argv[1]])"
    out = subprocess.run(
        [str(snakemake), "-c", parent, f"{sys.executable} -c '{job}'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pids = out.stdout.split()
    assert len(pids) == 2 and pids[0] == pids[1], out.stdout + out.stderr
