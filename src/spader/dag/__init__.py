"""The workflow's DAG, planned from the checked configuration: what each rule's jobs read
(inputs), what reruns them (params), what a training job asks a scheduler for, and the checks at a
run's start and end. The rules (``workflow/rules/*.smk``) call it and import no framework glue:
what this needs of verl's composition (the shared training runs) and of the training jobs (the
judge's params, the SLURM signal, the plan of every job) comes through here.

* :mod:`~spader.dag.jobs` - :class:`Jobs`: stage paths, models, params and input functions.
* :mod:`~spader.dag.resources` - :class:`TrainingResources`: nodes, GPUs, CPUs, memory, runtime.
* :mod:`~spader.dag.start` - a start's checks and warnings, a named run's own stages, failed jobs.
"""

from .jobs import Jobs, workflow_file
from .resources import TrainingResources

__all__ = ["Jobs", "TrainingResources", "workflow_file"]
