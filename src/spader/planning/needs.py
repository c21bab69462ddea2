"""What an evaluation or StepSearch's evidence job needs of the node it lands on
(:class:`spader.infra.node.Needs`), from the plan of that job (:func:`spader.planning.plan.evaluation_job`,
:func:`spader.planning.plan.evidence_job`). The job's glue hands it to the job, which checks the
node before any model loads (:func:`spader.infra.node.check_node`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from spader.infra.node import Needs
from spader.planning.plan import GIB, evaluation_job, evidence_job, load_shape, reranker_gib

log = logging.getLogger(__name__)

__all__ = ["RECORDS_FLOOR_GIB", "evaluation_needs", "evidence_needs", "snapshot_gib"]

#: Free disk a job that writes records (an evaluation's episodes, the evidence file) needs at least:
#: a floor, not a plan (their size is not planned; the DAG's total counts them in its 3 GiB of data,
#: evaluations and MLflow, spader.planning.costs.DATA_GIB).
RECORDS_FLOOR_GIB = 0.1


def _shape(model: str, model_dir: str | os.PathLike | None) -> Any:
    try:
        return load_shape(model, model_dir)
    except ValueError:
        return None


def evaluation_needs(
    job: str,
    evaluation: Mapping[str, Any],
    *,
    model: str,
    model_dir: str | os.PathLike | None,
    hardware: Mapping[str, Any],
    retrieval: Mapping[str, Any],
) -> Needs:
    """An evaluation's needs: on GPU (``evaluation.gpus`` > 0) its GPUs and the plan's peak on the
    first one (sglang's share and the reranker, or the transformers engine's weights, KV cache and
    logits at ``hardware.gpu_memory_gib``), nvcc and glibc with the sglang engine; host memory for
    the policy's bf16 weights as they load; disk for its records (:data:`RECORDS_FLOOR_GIB`).

    Args:
        job: the job's name in a refusal.
        evaluation: the ``evaluation`` section with its context budget resolved.
        model, model_dir: the policy (its hub id or backbone model, its local directory).
        hardware, retrieval: the config's sections.
    """
    shape, gpus = _shape(model, model_dir), int(evaluation["gpus"])
    unknown = ["the size of its records (a floor is checked)"]
    peak = None
    if gpus > 0 and shape is not None:
        capacity = float(hardware["gpu_memory_gib"])
        peak = evaluation_job(
            job, shape, evaluation, capacity=capacity, reranker=reranker_gib(retrieval)
        ).peak
    elif gpus > 0:
        unknown.append(f"the GPU memory peak (no shape for {model})")
    if shape is None:
        unknown.append(f"host memory (no shape for {model})")
    return Needs(
        job,
        gpus=gpus,
        gpu_peak_gib=peak,
        kernels=gpus > 0 and evaluation["engine"] == "sglang",
        host_gib=None if shape is None else shape.params * 2 / GIB,
        host_what="available for the policy's weights (bf16) as they load",
        disk_gib=RECORDS_FLOOR_GIB,
        disk_what="its records",
        unknown=tuple(unknown),
    )


def evidence_needs(
    job: str, settings: Any, *, hardware: Mapping[str, Any], retrieval: Mapping[str, Any]
) -> Needs:
    """StepSearch's evidence job's needs: on GPU (``stepsearch.evidence.gpus`` > 0) a GPU that
    holds the plan's reranker replica; disk for the evidence file (:data:`RECORDS_FLOOR_GIB`)."""
    gpus = int(settings.gpus)
    peak = None
    if gpus > 0:
        capacity = float(hardware["gpu_memory_gib"])
        peak = evidence_job(job, capacity=capacity, reranker=reranker_gib(retrieval)).peak
    return Needs(
        job,
        gpus=gpus,
        gpu_peak_gib=peak,
        disk_gib=RECORDS_FLOOR_GIB,
        disk_what="the evidence file",
        unknown=("the size of the evidence file (a floor is checked)",),
    )


def snapshot_gib(repo_id: str) -> float | None:
    """GiB a hub model's snapshot holds, as the DAG's disk plan counts it (its weights in bf16 from
    the shape shipped in ``spader/planning/shapes``; Meta's Llama repositories twice): what its
    download needs free. None for a model without a shipped shape."""
    from spader.planning.plan import hub_snapshot_gib

    gib = hub_snapshot_gib(repo_id, {})
    return gib or None
