"""A job killed by any signal takes every process it started with it: verl's Ray instance (started
by verl's own ``run_ppo`` with the job's runtime env) and processes that left the job's process
group or session. Processes of one job are found by a marker in their environment, which every
descendant inherits (Ray's workers included), so a survivor cannot hide by changing its parent,
group or title.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from spader.infra.procs import supervised_argv

HERE = Path(__file__).resolve().parent
MARK = "SPADER_HYGIENE_TEST"


def _marked(mark: str) -> list[psutil.Process]:
    """Living processes whose environment carries ``MARK=mark`` (zombies count as gone)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _wait_gone(mark: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = _marked(mark)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = []
    for p in left:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return out


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log.read_text()[-4000:] if log.exists() else ""
            raise AssertionError(f"{path.name} never appeared (job rc {proc.poll()}):\n{text}")
        time.sleep(0.2)


def _kill_marked(mark: str) -> None:
    for p in _marked(mark):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


# A job whose command leaves its process group and its session, as Ray's workers and agents do.
ESCAPING_JOB = """
import sys
from spader.training.launch import run_supervised
script = "setsid sleep 300 & sleep 300 & (trap '' TERM; exec sleep 300) & echo started > {ready}; wait"
sys.exit(run_supervised(["sh", "-c", script], env={{}}, output=None, grace_s=2))
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_killed_job_leaves_no_process(tmp_path, signum):
    mark = uuid.uuid4().hex
    ready = tmp_path / "ready"
    job = subprocess.Popen(
        [sys.executable, "-c", ESCAPING_JOB.format(ready=ready)],
        env={**os.environ, MARK: mark},
        start_new_session=True,
    )
    try:
        _wait_for(ready, job, 60, tmp_path / "none")
        assert len(_marked(mark)) >= 5  # job, supervisor, sh and three sleeps
        job.send_signal(signum)
        job.wait(timeout=30)
        # one sleep ignores SIGTERM: it goes after the 2 s grace, by SIGKILL
        assert _wait_gone(mark, 20) == []
    finally:
        _kill_marked(mark)


def test_supervisor_does_not_start_when_its_parent_is_gone(tmp_path):
    marker = tmp_path / "started"
    argv = supervised_argv(["sh", "-c", f"touch {marker}"], grace_s=1)
    argv[argv.index("--parent") + 1] = "1"  # not our parent: as if the job died before we started
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "parent process 1 is gone" in proc.stderr
    assert not marker.exists()


def test_supervisor_passes_the_exit_code_and_sweeps_leftovers(tmp_path):
    mark = uuid.uuid4().hex
    argv = supervised_argv(["sh", "-c", "setsid sleep 300 & exit 7"], grace_s=1)
    argv[argv.index("--parent") + 1] = str(os.getpid())
    proc = subprocess.run(argv, env={**os.environ, MARK: mark}, timeout=60)
    assert proc.returncode == 7
    assert _wait_gone(mark, 5) == []


@pytest.mark.slow
def test_killed_training_job_leaves_no_ray_process(tmp_path):
    """The job launches a command that starts Ray through verl's ``run_ppo`` with the job's Ray
    overrides; killing the job with SIGKILL (no handler runs in it) stops Ray's GCS, raylet,
    agents and workers too. (The other signals take the same path through the supervisor; the
    fast test above sends each of them.)"""
    signum = signal.SIGKILL
    mark = uuid.uuid4().hex
    job = subprocess.Popen(
        [sys.executable, str(HERE / "ray_job.py"), str(tmp_path)],
        env={**os.environ, MARK: mark, "RAY_USAGE_STATS_ENABLED": "0"},
        start_new_session=True,
    )
    try:
        _wait_for(tmp_path / "runner.pid", job, 300, tmp_path / "job.log")
        runner = int((tmp_path / "runner.pid").read_text())
        names = {p.name() for p in _marked(mark)}
        assert {"gcs_server", "raylet"} <= names, names  # Ray really runs under the job
        assert psutil.Process(runner).environ().get(MARK) == mark  # and its workers carry the mark
        job.send_signal(signum)
        job.wait(timeout=60)
        left = _wait_gone(mark, 45)
        assert left == [], "\n".join(left)
        assert not psutil.pid_exists(runner) or psutil.Process(runner).status() == psutil.STATUS_ZOMBIE
    finally:
        _kill_marked(mark)


# A job body that starts children which leave its group and session, one of them ignoring SIGTERM.
WATCHED_JOB = """
import subprocess, sys, time
from spader.infra.procs import start_watchdog
start_watchdog(grace_s=2)
subprocess.Popen(["setsid", "sleep", "300"])
subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 300"], start_new_session=True)
open({ready!r}, "w").write("started")
if {linger}:
    time.sleep(300)
"""


@pytest.mark.parametrize("end", ["sigkill", "normal_exit"])
def test_watchdog_stops_what_a_dead_job_started(tmp_path, end):
    """The workflow glue starts this watchdog in every job: whatever ends the job, the processes
    it started (services, engine workers) do not outlive it."""
    mark = uuid.uuid4().hex
    ready = tmp_path / "ready"
    job = subprocess.Popen(
        [sys.executable, "-c", WATCHED_JOB.format(ready=str(ready), linger=end == "sigkill")],
        env={**os.environ, MARK: mark},
        start_new_session=True,
    )
    try:
        _wait_for(ready, job, 60, tmp_path / "none")
        if end == "sigkill":
            job.kill()
        job.wait(timeout=30)
        assert _wait_gone(mark, 20) == []  # the watchdog included: it exits after its work
    finally:
        _kill_marked(mark)


def test_the_watchdog_keeps_the_job_s_stderr_and_not_its_stdout(tmp_path):
    """A caller reading a job's output to its end is not kept waiting for the watchdog, which
    still writes its line to the job's log."""
    ready = tmp_path / "ready"
    body = (
        "import time\nfrom spader.infra.procs import start_watchdog\n"
        f"dog = start_watchdog(grace_s=2)\nopen({str(ready)!r}, 'w').write(str(dog.pid))\ntime.sleep(300)\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", body], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _wait_for(ready, job, 60, tmp_path / "none")
        dog = int(ready.read_text())
        assert os.readlink(f"/proc/{dog}/fd/1") == "/dev/null"
        assert os.readlink(f"/proc/{dog}/fd/2") == os.readlink(f"/proc/{job.pid}/fd/2")
    finally:
        job.kill()
        job.communicate(timeout=30)


# A job as the workflow glue runs it: started by Snakemake through a shell, watching its workflow,
# with a child of its own (a service, say) and a grandchild that left its session.
WORKFLOW_JOB = """
import signal, subprocess, sys, time
from spader.infra.procs import raise_on_signals, start_watchdog, watch_workflow
start_watchdog(grace_s=2)
watch = watch_workflow(interval_s=0.2, grace_s={grace})
assert watch is not None, "no snakemake ancestor found"
if {ignore_hup}:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a job that does not react: ended hard
    while True:
        time.sleep(1)
child = subprocess.Popen(["sleep", "300"])
subprocess.Popen(["setsid", "sleep", "300"])
try:
    with raise_on_signals():
        open({ready!r}, "w").write("started")
        while True:
            time.sleep(1)
except BaseException as exc:  # Terminated is a BaseException, as KeyboardInterrupt
    print(f"job stopped: {{type(exc).__name__}}: {{exc}}", file=sys.stderr, flush=True)
    child.terminate()
    raise SystemExit(1)
"""


@pytest.mark.parametrize("ignores_sighup", [False, True])
def test_a_job_dies_with_the_snakemake_process_that_launched_it(tmp_path, ignores_sighup):
    """kill -9 of a stand-in Snakemake (a process whose command line is `.../snakemake ...`), which
    started the job through a shell as Snakemake runs scripts: the job stops within seconds, naming
    why, and so does what it started. Held out: a job that ignores SIGHUP is ended hard after its
    grace."""
    mark = uuid.uuid4().hex
    ready = tmp_path / "ready"
    snakemake = tmp_path / "snakemake"
    snakemake.symlink_to(sys.executable)
    job = tmp_path / "job.py"
    job.write_text(WORKFLOW_JOB.format(grace=1.0, ignore_hup=ignores_sighup, ready=str(ready)))
    log = tmp_path / "job.log"
    parent = "import subprocess, sys; subprocess.run(['bash', '-c', 'set -eu; ' + sys.argv[1] + ' 2> ' + sys.argv[2]])"
    smk = subprocess.Popen(
        [str(snakemake), "-c", parent, f"{sys.executable} {job}", str(log)],
        env={**os.environ, MARK: mark},
        start_new_session=True,
    )
    try:
        if ignores_sighup:
            deadline = time.monotonic() + 60
            while len(_marked(mark)) < 4 and time.monotonic() < deadline:  # snakemake, bash, job, watchdog
                time.sleep(0.2)
        else:
            _wait_for(ready, smk, 60, log)
        smk.kill()
        smk.wait()
        left = _wait_gone(mark, 15)
        assert left == [], "\n".join(left) + log.read_text()[-2000:]
        text = log.read_text()
        assert f"the workflow that started this job (snakemake, pid {smk.pid}) is gone" in text, text[-2000:]
        if ignores_sighup:
            assert "ending it" in text, text[-2000:]
        else:
            assert (
                f"job stopped: WorkflowGone: the workflow that started this job (snakemake, pid {smk.pid})"
                in text
            )
    finally:
        _kill_marked(mark)


def test_a_watchdog_signalled_again_and_again_still_ends_with_its_job():
    """Stop signals in quick succession (the workflow watch's SIGHUP, the parent-death SIGTERM) once
    deadlocked the watchdog inside its own signal handler, so it outlived its job (and held the
    job's output pipe open). Flooded with signals while its job runs, it waits; once the job is
    gone, it exits."""
    script = (
        "import os, subprocess, sys, time, uuid\n"
        "w = subprocess.Popen([sys.executable, '-m', 'spader.infra.procs', '--watch', uuid.uuid4().hex,"
        " '--parent', str(os.getpid())], stdin=subprocess.DEVNULL)\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    watchdog = psutil.Process(int(job.stdout.readline()))
    try:
        time.sleep(3)  # its handlers installed
        for _ in range(300):
            for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                os.kill(watchdog.pid, signum)
        time.sleep(1)
        assert watchdog.is_running() and watchdog.status() != psutil.STATUS_ZOMBIE  # its job is alive
    finally:
        job.kill()
        job.wait()
    gone, _ = psutil.wait_procs([watchdog], timeout=30)
    assert gone, "the watchdog outlived its job"
