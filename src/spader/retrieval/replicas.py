"""Data-parallel reranking: one cross-encoder replica per device, each batch's pairs spread over them.

In a training job every GPU of the node runs the policy's sglang shard and verl's workers. One
reranker on ``cuda:0`` would leave GPU 0 with less free memory than the others (sglang refuses to
start a tensor-parallel group whose GPUs differ by more than a tenth in free memory) and would do
all the reranking on one GPU. One replica per GPU gives every GPU the same footprint and lets all
of them rerank: the pairs of a batch are cut into near-equal contiguous chunks, a whole number of
chunks per replica, and each replica scores its chunks on its own thread (torch releases the GIL
during the forward pass; each replica has its own tokenizer, which is not thread-safe).

Scores do not depend on which replica computes a chunk when the devices are of one kind; a
different number of replicas can cut the pairs into other chunks, which changes batch
composition and so the scores by float noise only (``tests/retrieval/test_replicas.py``).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from spader.retrieval.reranker import CrossEncoderReranker, chunk_slices, default_device

log = logging.getLogger(__name__)

__all__ = ["RerankerReplicas", "parse_devices"]


def parse_devices(devices: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """Normalise the ``retrieval.reranker.devices`` setting.

    Args:
        devices: ``None`` (the default device: first GPU, else CPU), ``"cpu"``, a comma-separated
            string (``"cuda:0,cuda:1"``, what the command line carries) or a list of devices.

    Returns:
        The devices, one per replica, e.g. ``("cuda:0", "cuda:1")``.

    Raises:
        ValueError: an empty list or a device that is neither ``cpu`` nor ``cuda:<index>``.
    """
    if devices is None:
        return (default_device(),)
    items = devices.split(",") if isinstance(devices, str) else list(devices)
    items = [str(d).strip() for d in items]
    if not items or any(not d for d in items):
        raise ValueError(f"reranker devices {devices!r}: give at least one device, e.g. cpu or cuda:0")
    for d in items:
        if d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit()):
            raise ValueError(f"reranker device {d!r} is neither 'cpu' nor 'cuda:<index>'")
    return tuple(items)


class RerankerReplicas:
    """Score (query, passage) pairs with one :class:`CrossEncoderReranker` per device.

    Args:
        model: hub id or local model directory (loaded once per device).
        devices: one replica per entry (the same device may repeat: two CPU replicas each run
            their own forward passes).
        batch_size, max_length, fp16, max_batch_tokens: as for :class:`CrossEncoderReranker`.
        threads: torch CPU threads in all (split between CPU replicas).
    """

    def __init__(
        self,
        model: str | os.PathLike,
        devices: tuple[str, ...],
        *,
        batch_size: int = 64,
        max_length: int = 512,
        fp16: bool = True,
        threads: int = 1,
        max_batch_tokens: int | None = None,
    ):
        if not devices:
            raise ValueError("RerankerReplicas needs at least one device")
        self.devices = tuple(devices)
        self.name = str(model)
        on_cpu = sum(d == "cpu" for d in self.devices)
        if on_cpu:
            import torch

            # Intra-op threads are per calling thread: CPU replicas share the job's threads.
            torch.set_num_threads(max(1, threads // on_cpu))
        self.replicas = [
            CrossEncoderReranker(
                model,
                batch_size=batch_size,
                max_length=max_length,
                fp16=fp16,
                device=d,
                max_batch_tokens=max_batch_tokens,
            )
            for d in self.devices
        ]
        self._workers = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="rerank")
        log.info("reranker %s: %d replica(s) on %s", model, len(self.replicas), ", ".join(self.devices))

    def abort(self) -> None:
        """Abandon the scoring in progress at each replica's next batch (the service is stopping)."""
        for replica in self.replicas:
            replica.aborted.set()

    @property
    def device(self) -> str:
        """The devices, comma-separated (what ``/health`` shows)."""
        return ",".join(self.devices)

    def reserve_peak(self) -> dict[str, float]:
        """Run the largest batch of ``max_length``-token pairs scoring can form (``batch_size``
        pairs, fewer under ``max_batch_tokens``: the most activation memory any batch needs) on
        every GPU replica, so PyTorch's allocator holds the replica's peak memory from the start
        (before sglang measures what is free), and return that footprint.

        Returns:
            ``{device: MiB reserved}`` for the CUDA replicas (empty on CPU).
        """
        import torch

        out = {}
        for replica in self.replicas:
            if not replica.device.startswith("cuda"):
                continue
            vocab = int(replica.model.config.vocab_size)
            rows = replica.rows_for(replica.max_length)
            ids = torch.randint(5, vocab, (rows, replica.max_length), device=replica.device)
            with torch.inference_mode():
                replica.model(input_ids=ids).logits.float().cpu()
            out[replica.device] = round(torch.cuda.max_memory_reserved(replica.device) / 2**20, 1)
        return out

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Relevance logits of ``pairs`` in input order, computed by all replicas at once.

        Args:
            pairs: ``(query, passage)`` tuples, any number.

        Returns:
            ``(len(pairs),)`` float32 array.
        """
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        queries = self.replicas[0].cut_queries([q for q, _ in pairs])
        passages = [p for _, p in pairs]
        scores = np.empty(len(pairs), dtype=np.float32)
        chunks = chunk_slices(len(pairs), len(self.replicas))
        shares = [chunks[r :: len(self.replicas)] for r in range(len(self.replicas))]
        if len(self.replicas) == 1:  # no thread hop for the common case
            self.replicas[0].score_chunks(shares[0], queries, passages, scores)
            return scores
        futures = [
            self._workers.submit(replica.score_chunks, share, queries, passages, scores)
            for replica, share in zip(self.replicas, shares, strict=True)
            if share
        ]
        for f in futures:  # every replica finishes (or fails) before the first error is raised
            f.exception()
        for f in futures:
            f.result()
        return scores

    def close(self) -> None:
        """Stop the worker threads."""
        self._workers.shutdown(wait=True)
