"""Training stages of the DAG: ``train_policy`` (one verl run per backbone x variant) and
``export_checkpoint`` (the run's last checkpoint as a Hugging Face model plus lineage metadata).
What every job needs (GPU memory, time, host memory, disk) is planned below, in :mod:`spader.planning`.

Modules:

* :mod:`~spader.training.preflight` - the checks that run before any GPU work (model path,
  backbone/variant selection, GPUs, retrieval service health, pinned verl version), and
  ``spader preflight``.
* :mod:`~spader.training.node` - the node a job landed on, measured (memory, its cgroup's limit,
  disk, /dev/shm, GPUs, glibc and the wheel tag, driver, nvcc) and compared with the plan.
* :mod:`~spader.training.launch` - composes the verl command line from the workflow config
  (method overrides from :mod:`spader.integrations.verl` plus this job's paths, GPUs, logging,
  checkpoint directory and resume point) and runs it as a process group.
* :mod:`~spader.training.checkpoints` - finds the latest complete verl checkpoint in a work
  directory (resume) and reads the per-step metrics of every attempt.
* :mod:`~spader.training.lineage` - MLflow wiring: verl's own logger attaches to the job's run.
* :mod:`~spader.training.run` - the ``train_policy`` job itself, in named phases.
* :mod:`~spader.training.stop` - stopping at a step boundary on a time-limit warning or SIGTERM, and
  the exit status the workflow retries.
* :mod:`~spader.training.watch` - what the job watches while verl runs (its workflow process, its
  retrieval service).
* :mod:`~spader.training.workdir` - one trainer per work directory (a lock; stale ones taken over).
* :mod:`~spader.training.ray_cluster` - where verl's Ray runs (loopback, or a cluster over the
  job's SLURM nodes) and its token authentication.
* :mod:`~spader.training.hf_export` - the ``export_checkpoint`` job (and the retention rule: the
  training's intermediate checkpoints go once its export is written).
* :mod:`~spader.training.smoke` - the GPU smoke test (``scripts/gpu_smoke.sh``).

Nothing here imports verl, ray or sglang at module import time; the functions that need verl
import it when called.
"""

# The verl release this project is built and tested against. pyproject.toml pins the same version
# in the base dependencies and in the `gpu` extra (tests/training/test_preflight.py checks that
# the three agree); preflight refuses to start training on any other version.
VERL_VERSION = "0.9.1"

# The verl entry point: a Hydra main that registers the SPADER estimator, reward
# manager and tool before handing over to verl's run_ppo.
ENTRY_MODULE = "spader.integrations.verl.main"

__all__ = ["ENTRY_MODULE", "VERL_VERSION"]
