"""One trainer per work directory: a second trainer refuses while the first lives, and a lock left
by a dead trainer is taken over with a message (spader.training.workdir)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from spader.training.workdir import LOCK_FILE, WorkdirBusyError, WorkdirLock

HOLDER = """
import sys, time
from spader.training.workdir import WorkdirLock
WorkdirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of ``tmp_path / 'work'``."""
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(work)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield work, proc
    proc.kill()
    proc.wait()


def test_a_second_trainer_refuses_while_the_first_lives(holder):
    work, proc = holder
    with pytest.raises(WorkdirBusyError, match=rf"in use by another training job \(pid {proc.pid} on "):
        WorkdirLock(work).acquire()
    assert json.loads((work / LOCK_FILE).read_text())["pid"] == proc.pid  # untouched


def test_a_dead_trainers_lock_is_taken_over_with_a_message(holder, caplog):
    work, proc = holder
    proc.kill()  # dies holding the lock (as a SIGKILLed job)
    proc.wait()
    with caplog.at_level(logging.WARNING, logger="spader.training.workdir"):
        with WorkdirLock(work) as lock:
            assert json.loads((work / LOCK_FILE).read_text())["token"] == lock.token
    assert f"taking over the lock of {work} from a dead trainer (pid {proc.pid}" in caplog.text
    assert "is gone" in caplog.text
    assert not (work / LOCK_FILE).exists()  # released on exit
    assert not list(work.glob(f"{LOCK_FILE}.stale-*"))


def test_a_lock_of_another_host_is_stale_only_when_not_refreshed(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    lock = work / LOCK_FILE
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "earlier", "token": "x"}))
    with pytest.raises(WorkdirBusyError, match="pid 1 on elsewhere"):
        WorkdirLock(work, stale_after_s=600).acquire()
    old = time.time() - 3600
    os.utime(lock, (old, old))  # its holder stopped refreshing it an hour ago
    WorkdirLock(work, stale_after_s=600).acquire().release()


def test_the_holder_refreshes_its_lock(tmp_path):
    lock = WorkdirLock(tmp_path, heartbeat_s=0.0).acquire()
    old = time.time() - 3600
    os.utime(lock.path, (old, old))
    lock.heartbeat()
    assert time.time() - lock.path.stat().st_mtime < 60
    assert json.loads(lock.path.read_text())["host"] == socket.gethostname()
    lock.release()
