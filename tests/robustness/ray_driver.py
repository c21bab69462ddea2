"""Fake verl trainer for the process-hygiene tests (no model can run here): the project's real
``spader`` variant config composed with the job's overrides, then verl's own ``run_ppo``, which
starts Ray exactly as in training (``ray.init`` with verl's runtime env merged with the job's).
Its task runner only records its PID and sleeps. Usage: ``python ray_driver.py WORKDIR OVERRIDES...``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import ray


@ray.remote(num_cpus=1)
class SleepingTaskRunner:
    """Takes the place of verl's TaskRunner: reports where it runs, then waits to be killed."""

    def run(self, config) -> None:
        work = Path(config.trainer.default_local_dir).parent
        (work / "runner.pid").write_text(str(os.getpid()))
        time.sleep(3600)


def main() -> None:
    from verl.trainer.main_ppo import run_ppo

    from spader.integrations.verl.compose import compose

    work = Path(sys.argv[1])
    cfg = compose("spader", sys.argv[2:])
    (work / "driver.pid").write_text(str(os.getpid()))
    run_ppo(cfg, task_runner_class=SleepingTaskRunner)


if __name__ == "__main__":
    main()
