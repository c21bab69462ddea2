"""Process hygiene: a job's child process tree never outlives the job, whatever signal ends it.

Training runs verl, which starts a private Ray instance: GCS, raylet, dashboard and runtime-env
agents, log monitor and one process per worker. Ray puts each worker in a process group of its
own, and when its driver is killed outright the agents survive as orphans (seen with Ray 2.60). So
a job does not run such a command directly but under a small supervisor
(``python -m spader.infra.procs``, :func:`supervised_argv`), which

* receives SIGTERM when the job's process dies, even by SIGKILL (``PR_SET_PDEATHSIG``), and exits
  at once if the job is already gone when it starts;
* makes itself the child subreaper, so every process the command starts stays its descendant
  even after its own parent exits;
* runs the command in a new process group whose leader gets SIGTERM should the supervisor itself
  die;
* on SIGTERM, SIGINT or SIGHUP (from the job, the scheduler or the parent-death signal) sends
  SIGTERM to the command's group and to every descendant, waits ``grace`` seconds, then SIGKILLs
  what is left; after a normal exit it removes leftovers the same way.

:func:`raise_on_signals` turns SIGTERM/SIGINT/SIGHUP into :class:`Terminated` in the job itself, so
its context managers (services, MLflow runs) close on the way out. For a job killed outright,
:func:`start_watchdog` marks everything the job starts with a token in its environment and leaves a
watchdog (``python -m spader.infra.procs --watch``) that stops every process carrying the token
once the job is gone (parent-death signal again).

Every job also dies with its workflow (:func:`watch_workflow`, started by the job glue): when the
Snakemake process that launched it is gone, however it died (SIGKILL included), nobody will
record the job's outputs, so the job stops: it is sent SIGHUP, which raises
:class:`WorkflowGone` in it (services and engines stop on the way out, the MLflow run ends
KILLED), and it exits hard ``grace`` seconds later if it has not; the watchdog then stops what it
had started. The kernel's parent-death signal (``PR_SET_PDEATHSIG``) tells a job whose parent is
that Snakemake process at once; a job started through a shell (as Snakemake runs scripts) learns it
from a thread that looks once a second. A part of a job that watches the workflow itself (a
training's :class:`spader.training.watch.JobWatch`, which stops verl and records why) defers the
signal while it runs (:func:`deferring_workflow_loss`).

A *stop request* is the gentle way out: the job creates the file named by :data:`STOP_REQUEST_ENV`
in the training process's environment, and the training loop, which checks it at every step
boundary (:func:`stop_requested`), saves a checkpoint and ends there (``spader.training.stop``
decides when to ask: a scheduler's time-limit warning, a first SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

log = logging.getLogger(__name__)

__all__ = [
    "JOB_TOKEN_ENV",
    "STOP_REQUEST_ENV",
    "STOP_SIGNALS",
    "WORKFLOW_GRACE_S",
    "ProcessRef",
    "Terminated",
    "WorkflowGone",
    "WorkflowWatch",
    "acknowledge_stop",
    "deferring_workflow_loss",
    "descendants",
    "main",
    "raise_on_signals",
    "set_child_subreaper",
    "set_parent_death_signal",
    "start_watchdog",
    "stop_requested",
    "stop_token_processes",
    "stop_tree",
    "supervise",
    "supervised_argv",
    "token_processes",
    "watch",
    "watch_workflow",
    "workflow_process",
]

#: Signals after which a job (or the supervisor) stops its children and exits.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Environment variable holding the token of the job that started a process (:func:`start_watchdog`).
JOB_TOKEN_ENV = "SPADER_JOB_TOKEN"

#: Environment variable naming the file whose existence asks a training loop to stop at its next
#: step boundary, after a checkpoint.
STOP_REQUEST_ENV = "SPADER_STOP_REQUEST"

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class Terminated(BaseException):
    """The process received a stop signal (scheduler time limit, ``scancel``, Ctrl-C, hang-up).

    A ``BaseException``, like ``KeyboardInterrupt``: code that handles failures with ``except
    Exception`` (an engine retrying a failed batch, a loop skipping a bad item) must not swallow
    a stop, which would leave the job running (seen: an evaluation retried its generation after
    the SIGHUP of a lost workflow)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"received signal {signal.Signals(signum).name}")


class WorkflowGone(Terminated):
    """The Snakemake process that launched this job is gone (the SIGHUP :func:`watch_workflow`
    sends, or the parent-death signal)."""

    def __init__(self, reason: str):
        self.signum = signal.SIGHUP
        BaseException.__init__(self, reason)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def stop_requested(environ=None) -> bool:
    """Whether this process was asked to stop at its next step boundary (the file named by
    :data:`STOP_REQUEST_ENV` exists)."""
    path = (os.environ if environ is None else environ).get(STOP_REQUEST_ENV)
    return bool(path) and os.path.exists(path)


def acknowledge_stop(step: int, *, early: bool, environ=None) -> None:
    """Record, next to the stop request, that the training loop saved ``step`` and stopped there
    (``early``: before its last step), so the job tells a stop from the end of training."""
    path = (os.environ if environ is None else environ).get(STOP_REQUEST_ENV)
    if path:
        with open(f"{path}.ack", "w", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), "early": bool(early)}) + "\n")


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent thread exits (Linux).

    Returns:
        Whether the request was accepted (False on other systems).
    """
    return _prctl(_PR_SET_PDEATHSIG, int(signum))


def set_child_subreaper() -> bool:
    """Become the reaper of orphaned descendants (Linux): they stay our descendants."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def descendants(pid: int | None = None) -> list[int]:
    """PIDs of all living descendants of ``pid`` (default: this process), deepest last."""
    import psutil

    try:
        children = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c.pid for c in children if _alive(c)]


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_all(pgid: int | None, pids: Sequence[int], signum: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap() -> None:
    """Collect exited children (orphans re-parented to us included) so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM the group of ``proc`` and every descendant of this process, SIGKILL survivors.

    Args:
        proc: the command (leader of its own process group), or None to sweep descendants only.
        grace_s: seconds to wait between SIGTERM and SIGKILL.
    """
    pgid = proc.pid if proc is not None else None
    _signal_all(pgid, descendants(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if (proc is None or proc.poll() is not None) and not descendants():
            break
        time.sleep(0.1)
    left = descendants()
    if left or (proc is not None and proc.poll() is None):
        log.warning("%d processes still running %.0f s after SIGTERM; killing them", len(left), grace_s)
    _signal_all(pgid, left, signal.SIGKILL)
    if proc is not None:
        proc.wait()
    for _ in range(50):  # SIGKILL is asynchronous: wait until the kernel has removed them
        _reap()
        if not descendants():
            break
        time.sleep(0.05)


@contextlib.contextmanager
def raise_on_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, each of ``signals`` raises :class:`Terminated` in the main thread (the
    previous handlers come back afterwards). Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        if signum == signal.SIGHUP and _WATCH is not None:
            if _WATCH.raised:  # the loss is being handled: a repeated signal must not cut the clean-up
                return
            lost = _WATCH.lost(hangup=True)
            if lost:
                _WATCH.raised = True
                raise WorkflowGone(lost)
        raise Terminated(signum)

    previous = {s: signal.signal(s, _raise) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def supervised_argv(argv: Sequence[str], *, grace_s: float) -> list[str]:
    """``argv`` wrapped in the supervisor, tied to this process as its parent."""
    return [
        sys.executable,
        "-m",
        "spader.infra.procs",
        "--parent",
        str(os.getpid()),
        "--grace",
        str(grace_s),
        "--",
        *argv,
    ]


def _child_setup() -> None:
    # Runs in the command's process between fork and exec (the supervisor has a single thread, so
    # this is safe): SIGTERM should the supervisor die without stopping it.
    set_parent_death_signal(signal.SIGTERM)


def supervise(argv: Sequence[str], *, parent: int | None, grace_s: float) -> int:
    """Run ``argv`` under this process's supervision (see the module docstring).

    Args:
        argv: the command.
        parent: PID of the job that started us; if it is gone already we exit without starting.
        grace_s: seconds between SIGTERM and SIGKILL when stopping.
    Returns:
        The command's exit code, or ``128 + signal`` when a stop signal ended it.
    """
    set_parent_death_signal(signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        log.error("parent process %d is gone; not starting %s", parent, argv[0])
        return 128 + signal.SIGTERM
    set_child_subreaper()
    proc = None
    try:
        with raise_on_signals():
            proc = subprocess.Popen(list(argv), start_new_session=True, preexec_fn=_child_setup)
            rc = proc.wait()
    except Terminated as t:
        log.warning("%s; stopping %s and its processes", t, argv[0])
        stop_tree(proc, grace_s)
        return 128 + t.signum
    # Leftovers of a command that exited on its own (Ray agents of a crashed driver, say).
    if descendants():
        stop_tree(None, min(grace_s, 10.0))
    return rc


def token_processes(token: str) -> list:
    """Living processes (other than this one) whose environment has ``JOB_TOKEN_ENV=token``."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if (
                p.pid != os.getpid()
                and p.status() != psutil.STATUS_ZOMBIE
                and p.environ().get(JOB_TOKEN_ENV) == token
            ):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_token_processes(token: str, grace_s: float) -> int:
    """SIGTERM every process of the job ``token``, SIGKILL those alive ``grace_s`` later.

    Returns:
        How many processes were found.
    """
    import psutil

    procs = token_processes(token)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def start_watchdog(grace_s: float = 10.0) -> subprocess.Popen:
    """Mark this job's future children with a token in their environment and start a watchdog
    that stops every process carrying it once this process is gone, however it died.

    Everything the job starts afterwards inherits the token (services, engines and their
    workers, Ray and its workers), so no change of parent, group or session hides a process.

    Returns:
        The watchdog (it exits on its own after this process).
    """
    import uuid

    token = uuid.uuid4().hex
    os.environ[JOB_TOKEN_ENV] = token
    argv = [sys.executable, "-m", "spader.infra.procs", "--watch", token, "--parent", str(os.getpid())]
    # stderr stays the job's (its log gets the watchdog's one line); stdout is not held open
    return subprocess.Popen(
        [*argv, "--grace", str(grace_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def watch(token: str, *, parent: int | None, grace_s: float) -> int:
    """The watchdog's body: wait for ``parent`` to die, then stop the processes of ``token``.

    Stop signals only wake the wait (the parent-death signal among them): once the work below
    starts it must finish. The parent-death signal can come twice: when a job's main thread ends
    before its other threads, the kernel hands the watchdog to one of them (the parent pid stays
    the job's) and signals it, and again when that thread ends; a second signal ending the watchdog
    in the middle of its work would leave the job's processes running.
    """
    # A plain flag, not a threading.Event: Event.set takes a lock, and a second signal arriving
    # while the first handler holds it deadlocks the watchdog for good (seen: SIGHUP from the
    # workflow watch, then the parent-death SIGTERM), leaving the job's processes running.
    woken: list[int] = []

    def wake(signum, frame):
        woken.append(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, wake)
    set_parent_death_signal(signal.SIGTERM)
    while not (woken if parent is None else os.getppid() != parent):
        time.sleep(0.2)
    n = stop_token_processes(token, grace_s)
    if n:
        log.warning("job %s is gone; stopped %d processes it had started", parent, n)
    return 0


#: Seconds a job may take to stop by itself once its workflow is gone (after the SIGHUP) before
#: it is ended hard.
WORKFLOW_GRACE_S = 30.0


@dataclasses.dataclass(frozen=True)
class ProcessRef:
    """A process to outlive never: the Snakemake process a job belongs to, the job's retrieval
    service (``create_time`` tells a reused PID apart)."""

    pid: int
    create_time: float

    def alive(self) -> bool:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.create_time and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def workflow_process(pid: int | None = None) -> ProcessRef | None:
    """The nearest ancestor of ``pid`` (default: this process) that runs Snakemake, or None (a
    job started by hand or by a test). Inside a SLURM allocation that is the job step's
    Snakemake, never the submitting one: a batch job outlives that one by design."""
    import psutil

    try:
        proc = psutil.Process(pid or os.getpid())
        for parent in proc.parents():
            try:
                cmd = parent.cmdline()
            except (psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if any(os.path.basename(a) == "snakemake" or a == "snakemake" for a in cmd[:3]) or (
                len(cmd) > 2 and cmd[1:3] == ["-m", "snakemake"]
            ):
                return ProcessRef(parent.pid, parent.create_time())
    except psutil.NoSuchProcess:
        return None
    return None


class WorkflowWatch:
    """A daemon thread that ends this job once ``workflow`` is gone (see the module docstring).

    Args:
        workflow: the Snakemake process of the job.
        interval_s: seconds between two looks.
        grace_s: seconds between the SIGHUP and the hard exit.
    """

    def __init__(self, workflow: ProcessRef, *, interval_s: float = 1.0, grace_s: float = WORKFLOW_GRACE_S):
        self.workflow = workflow
        self.parent = os.getppid()
        self.armed = False  # the kernel sends SIGHUP when the workflow (this process's parent) dies
        self.raised = False  # WorkflowGone was raised in the job
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.reason: str | None = None
        self._deferred_s: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workflow-watch", daemon=True)

    def start(self) -> WorkflowWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def lost(self, *, hangup: bool = False) -> str | None:
        """Why the job must stop, when its workflow is gone (checked now).

        Args:
            hangup: asked on a SIGHUP. With the parent-death signal armed, a SIGHUP is the kernel
                saying the workflow's thread that started this job ended, which happens only when
                the workflow dies; at that moment the dying process still looks alive (its other
                threads are still exiting, and the job is handed to one of them first).
        """
        orphaned = self.parent == self.workflow.pid and os.getppid() != self.parent
        if self.reason is None and ((hangup and self.armed) or orphaned or not self.workflow.alive()):
            self.reason = f"the workflow that started this job (snakemake, pid {self.workflow.pid}) is gone"
        return self.reason

    @contextlib.contextmanager
    def deferring(self, seconds: float) -> Iterator[None]:
        with self._lock:
            self._deferred_s.append(seconds)
        try:
            yield
        finally:
            with self._lock:
                self._deferred_s.remove(seconds)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.lost():
                break
        else:
            return
        with self._lock:
            deferred = max(self._deferred_s, default=0.0)
        if deferred:
            log.error("%s; the running part of this job stops itself (within %.0f s)", self.reason, deferred)
            deadline = time.monotonic() + deferred
            while time.monotonic() < deadline and not self._stop.wait(self.interval_s):
                with self._lock:
                    if not self._deferred_s:
                        break
            if self._stop.is_set():
                return
        log.error("%s; stopping this job", self.reason)
        if not self.raised:  # not yet told by the kernel's parent-death signal
            os.kill(os.getpid(), signal.SIGHUP)
        if self._stop.wait(self.grace_s):
            return
        log.error("job still running %.0f s after its workflow was lost; ending it", self.grace_s)
        logging.shutdown()
        os._exit(128 + signal.SIGHUP)


_WATCH: WorkflowWatch | None = None


def watch_workflow(
    workflow: ProcessRef | None = None, *, interval_s: float = 1.0, grace_s: float = WORKFLOW_GRACE_S
) -> WorkflowWatch | None:
    """End this job once the Snakemake process that launched it is gone (module docstring).

    Args:
        workflow: the process to outlive never (default: :func:`workflow_process`).
        interval_s: seconds between two looks.
        grace_s: seconds the job has to stop after its SIGHUP.

    Returns:
        The watch (None when no Snakemake process launched this one: nothing to watch).
    """
    global _WATCH
    workflow = workflow or workflow_process()
    if workflow is None:
        return None
    if _WATCH is not None:
        _WATCH.stop()
    watch = WorkflowWatch(workflow, interval_s=interval_s, grace_s=grace_s)
    if os.getppid() == workflow.pid:  # the kernel tells at once (the shell exec'd the job)
        watch.armed = set_parent_death_signal(signal.SIGHUP)
    _WATCH = watch.start()
    return _WATCH


@contextlib.contextmanager
def deferring_workflow_loss(seconds: float) -> Iterator[None]:
    """Within the block the job handles the loss of its workflow itself: the watch waits up to
    ``seconds`` for it before sending SIGHUP (nothing happens without a watch)."""
    watch = _WATCH
    if watch is None:
        yield
        return
    with watch.deferring(seconds):
        yield


HELP = "supervise a job's command, or watch a job's processes (used by the workflow's jobs)"


#: What to give, in words (the usage error of a call without a command or a token).
USAGE = (
    "give the command to supervise after -- (spader procs [--parent PID] [--grace S] -- COMMAND "
    "[ARG ...]), or the job token to watch (spader procs --watch TOKEN [--parent PID] [--grace S])"
)


def _pid(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


_pid.__name__ = "process id"  # argparse names the type in its message: "invalid process id value"
_seconds.__name__ = "number of seconds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parent", type=_pid, default=None, help="PID of the job (exit if it is gone)")
    parser.add_argument("--grace", type=_seconds, default=60.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--watch", default=None, metavar="TOKEN", help="be the watchdog of this job token")
    # not "command": that is the name ``spader`` gives its subcommand
    parser.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to supervise"
    )


def run(ns: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    command = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if ns.watch is not None:
        if command or not ns.watch.strip():
            raise ValueError(f"--watch takes a job token and no command: {USAGE}")
        return watch(ns.watch, parent=ns.parent, grace_s=ns.grace)
    if not command:
        raise ValueError(f"no command given: {USAGE}")
    if shutil.which(command[0]) is None:
        raise ValueError(f"cannot run {command[0]!r}: no such program (on PATH, or at that path, executable)")
    return supervise(command, parent=ns.parent, grace_s=ns.grace)


def main(args: Sequence[str] | None = None) -> int:
    """``python -m spader.infra.procs --parent PID --grace S -- command...`` (supervisor) or
    ``python -m spader.infra.procs --watch TOKEN --parent PID --grace S`` (watchdog); ``spader procs``."""
    # a job's supervisor starts with every job: argparse only, no configuration machinery
    parser = argparse.ArgumentParser(prog="python -m spader.infra.procs", description=HELP)
    add_arguments(parser)
    ns = parser.parse_args(sys.argv[1:] if args is None else args)
    try:
        return run(ns)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
