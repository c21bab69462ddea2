"""A stand-in for the ``train_policy`` job in the process-hygiene tests: it launches a command the
way :func:`spader.training.run.run_training` launches verl (``run_supervised``, the job's Ray
overrides from ``job_overrides``) and waits. Usage: ``python ray_job.py WORKDIR``.

The command is ``ray_driver.py``, which starts Ray through verl's own ``run_ppo``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spader.training.launch import job_overrides, run_supervised

HERE = Path(__file__).resolve().parent


def main() -> int:
    work = Path(sys.argv[1])
    overrides = job_overrides(
        train_file=work / "train.parquet",
        val_file=work / "val.parquet",
        model_dir=work / "model",
        gpus=1,
        ray_cpus=1,
        ckpt_dir=work / "checkpoints",
        tool_config=work / "tool_config.yaml",
        project="spader",
        run_name="hygiene",
        loggers=["console"],
        env={"VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl")},
    )
    (work / "job.pid").write_text(str(__import__("os").getpid()))
    with open(work / "job.log", "a") as log:
        return run_supervised(
            [sys.executable, str(HERE / "ray_driver.py"), str(work), *overrides],
            env={"PYTHONUNBUFFERED": "1"},
            output=log,
            grace_s=10,
        )


if __name__ == "__main__":
    sys.exit(main())
