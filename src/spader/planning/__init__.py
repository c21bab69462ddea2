"""The plan of every GPU job of the DAG, before any of them runs (docs/gpu.md).

* :mod:`~spader.planning.plan` - each job's per-GPU memory peak and what it asks a scheduler for,
  and ``spader plan``.
* :mod:`~spader.planning.costs` - a training job's time range from named inputs, the save cadence,
  its host memory and disk, the DAG's disk.
* :mod:`~spader.planning.calibration` - the measured constants of
  ``scripts/gpu_memory_calibration.py`` that replace the plan's estimates for a shape.

The jobs themselves run in :mod:`spader.training`, which checks a node and a job against this plan.
"""
