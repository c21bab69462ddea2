"""Cross-encoder reranking (BGE-Reranker-v2-M3 by default), loaded through FlagEmbedding.

FlagEmbedding's ``FlagReranker`` loads the model and tokenizer (hub id or local directory, fp16
on GPU). Scoring then runs one batched pass over all (query, passage) pairs of a request:

* one fast-tokenizer call for every pair (``truncation="only_second"``), instead of
  FlagEmbedding 1.4.2's per-pair path, which under transformers 5 tokenizes query and passage,
  decodes both back to text and tokenizes the pair again, one pair at a time in Python;
* pairs grouped by exact length into batches that need no padding and no attention mask (the
  remainders in padded batches sorted by length), ``torch.inference_mode``, the next chunk of
  pairs tokenized while the model scores the current one;
* no probe batch: ``compute_score`` runs its first batch twice to find a batch size that fits,
  which doubles the work of a request of at most ``batch_size`` pairs.

The model input is the same as FlagEmbedding's (queries cut to ``3/4 * max_length`` tokens, then
the passage cut so the pair fits ``max_length``); ``tests/retrieval/test_reranker.py`` checks
the scores against ``FlagReranker.compute_score``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from spader.infra.tokenizers import backend_copy
from spader.retrieval.errors import RerankerUnavailableError, ServiceClosingError

log = logging.getLogger(__name__)

__all__ = ["CrossEncoderReranker", "check_reranker_dir", "chunk_slices", "default_device"]

# What a tokenizer is saved as: the fast tokenizer's JSON, or a slow one's vocabulary files.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "spiece.model",
    "vocab.txt",
    "vocab.json",
)


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be whole (None when its size is the one its header declares)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8:
                return (
                    f"{path.name} is cut short ({size:,} bytes, its header alone declares {header_len + 8:,})"
                )
            header = json.loads(f.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError):
        return f"{path.name} is not a safetensors file (its header does not read)"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"{path.name} has {size:,} bytes where its header declares {expected:,} (cut short or damaged)"
    return None


def check_reranker_dir(model_dir: str | os.PathLike) -> None:
    """Check that a local cross-encoder directory can be loaded: a ``config.json``, weights whose
    safetensors files have the size their headers declare, and a tokenizer (transformers would build
    an empty one from the configuration alone, and rerank with it).

    Raises:
        RerankerUnavailableError: naming the directory and what is missing or damaged.
    """
    path = Path(model_dir)
    where = f"reranker model directory {path}"
    if not (path / "config.json").is_file():
        raise RerankerUnavailableError(f"{where}: no config.json (not a model directory)")
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    if not weights:
        raise RerankerUnavailableError(f"{where}: no weights (*.safetensors or *.bin)")
    for file in weights:
        problem = _safetensors_problem(file) if file.suffix == ".safetensors" else None
        if problem:
            raise RerankerUnavailableError(f"{where}: {problem}; download it again")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise RerankerUnavailableError(
            f"{where}: no tokenizer ({', '.join(_TOKENIZER_FILES)} are all missing); download it again"
        )


# Pairs tokenized at a time. Sorting by length happens within a chunk, which is enough for
# little padding; chunks let tokenization of the next one overlap the model's work on this one.
_CHUNK = 2048


def chunk_slices(n: int, replicas: int) -> list[slice]:
    """Split ``n`` pairs into contiguous chunks of near-equal size, at most ``_CHUNK`` each, their
    number a multiple of ``replicas`` (so each replica gets the same share of the work).

    Args:
        n: number of pairs.
        replicas: number of reranker replicas the chunks are spread over.

    Returns:
        The chunks in order (none for ``n == 0``).
    """
    if n <= 0:
        return []
    count = replicas * -(-n // (replicas * _CHUNK))
    count = min(count, n)
    bounds = [n * i // count for i in range(count + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def default_device() -> str:
    """``cuda:0`` when a GPU is visible, else ``cpu``."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _pair_backend(tokenizer, max_length: int):
    """A private copy of a fast tokenizer's Rust backend that truncates (query, passage) pairs to
    ``max_length`` tokens, passage first, and pads nothing; None for a slow tokenizer
    (:func:`spader.infra.tokenizers.backend_copy`). Truncation set on the tokenizer's own backend
    would change what its other calls (:meth:`CrossEncoderReranker.cut_queries`, FlagEmbedding's
    ``compute_score``) see.
    """
    pairs = backend_copy(tokenizer)
    if pairs is not None:
        pairs.enable_truncation(max_length, strategy="only_second")
    return pairs


class CrossEncoderReranker:
    """Score (query, passage) pairs with an encoder-only cross-encoder.

    Args:
        model: hub id (``BAAI/bge-reranker-v2-m3``) or local model directory.
        batch_size: pairs per forward pass.
        max_length: tokens per pair (query + passage + special tokens).
        fp16: half precision; applied on GPU only (CPU half-precision kernels are slow or missing).
        device: ``cpu``, ``cuda:0``, ...; default :func:`default_device`.
        max_batch_tokens: most tokens in one forward pass (pairs x padded length); a batch of
            longer pairs holds fewer than ``batch_size`` of them. Default ``batch_size * max_length``
            (no cap). It bounds the activation memory whatever the pair lengths, so a large
            ``batch_size`` (fast for the typical ~160-token pairs) cannot blow up on long ones.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        batch_size: int = 64,
        max_length: int = 512,
        fp16: bool = True,
        device: str | None = None,
        max_batch_tokens: int | None = None,
    ):
        from FlagEmbedding import FlagReranker

        self.device = device or default_device()
        self.fp16 = bool(fp16) and self.device.startswith("cuda")
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.max_batch_tokens = int(max_batch_tokens or self.batch_size * self.max_length)
        self.query_max_length = self.max_length * 3 // 4  # FlagEmbedding's default split
        self.name = str(model)
        self.aborted = threading.Event()  # set when the service stops: scoring ends at the next batch
        if Path(model).is_dir():
            check_reranker_dir(model)
        try:
            self._flag = FlagReranker(
                str(model),
                use_fp16=self.fp16,
                devices=[self.device],
                batch_size=self.batch_size,
                max_length=self.max_length,
                query_max_length=self.query_max_length,
            )
        except Exception as exc:  # the loaders raise many kinds: one line naming the model
            detail = (str(exc).strip().splitlines() or [""])[0][:300]
            raise RerankerUnavailableError(
                f"reranker {model} cannot be loaded: {type(exc).__name__}: {detail}"
            ) from exc
        self.tokenizer = self._flag.tokenizer
        self._pair_backend = _pair_backend(self.tokenizer, self.max_length)
        self.model = self._flag.model
        self._pad_id = self.tokenizer.pad_token_id
        if self.fp16:
            self.model.half()
        self.model.to(self.device).eval()
        log.info(
            "reranker %s on %s (fp16=%s, batch %d, max_length %d)",
            model,
            self.device,
            self.fp16,
            self.batch_size,
            self.max_length,
        )

    def rows_for(self, width: int) -> int:
        """Pairs per forward pass at ``width`` tokens per pair.

        Args:
            width: tokens per pair in the batch (its longest pair when padded).

        Returns:
            ``batch_size``, or fewer where that many pairs would exceed ``max_batch_tokens`` (at least 1).
        """
        return max(1, min(self.batch_size, self.max_batch_tokens // max(1, int(width))))

    def flag_reranker(self):
        """The underlying ``FlagEmbedding.FlagReranker`` (its ``compute_score`` is the reference)."""
        return self._flag

    def cut_queries(self, queries: list[str]) -> list[str]:
        """``queries`` with those over ``query_max_length`` tokens cut there (FlagEmbedding's rule)."""
        # Queries longer than query_max_length tokens are cut there, as FlagEmbedding does; the
        # service's max_query_chars keeps this rare, so only the unique queries are tokenized.
        unique = list(dict.fromkeys(queries))
        ids = self.tokenizer(unique, add_special_tokens=False)["input_ids"]
        long = {
            q: self.tokenizer.decode(i[: self.query_max_length])
            for q, i in zip(unique, ids, strict=True)
            if len(i) > self.query_max_length
        }
        return [long.get(q, q) for q in queries] if long else queries

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Relevance logits of ``pairs`` (higher is more relevant), in input order.

        Args:
            pairs: ``(query, passage)`` tuples, any number (scored in batches of ``batch_size``).

        Returns:
            ``(len(pairs),)`` float32 array.
        """
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        queries = self.cut_queries([q for q, _ in pairs])
        passages = [p for _, p in pairs]
        scores = np.empty(len(pairs), dtype=np.float32)
        self.score_chunks(chunk_slices(len(pairs), 1), queries, passages, scores)
        return scores

    def score_chunks(
        self, chunks: list[slice], queries: list[str], passages: list[str], out: np.ndarray
    ) -> None:
        """Score the pairs ``zip(queries, passages)[chunk]`` of every chunk into ``out[chunk]``.

        The next chunk is tokenized (Rust, GIL released) while the model scores this one, by the
        replica's private pair tokenizer, whose settings no call changes.

        Args:
            chunks: slices of the pair lists, scored in this order.
            queries: queries (already cut by :meth:`cut_queries`), one per pair.
            passages: passage texts, one per pair.
            out: float32 array receiving the scores.
        """
        if not chunks:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as pool:
            pending = pool.submit(self._encode, queries[chunks[0]], passages[chunks[0]])
            for k, chunk in enumerate(chunks):
                self._check_aborted()
                encoded = pending.result()
                if k + 1 < len(chunks):
                    nxt = chunks[k + 1]
                    pending = pool.submit(self._encode, queries[nxt], passages[nxt])
                out[chunk] = self._forward(encoded)

    def _encode(self, queries: list[str], passages: list[str]) -> list[list[int]]:
        backend = self._pair_backend
        if backend is None:  # a slow (Python) tokenizer
            return self.tokenizer(
                queries,
                passages,
                truncation="only_second",
                max_length=self.max_length,
                padding=False,
                return_attention_mask=False,
                return_token_type_ids=False,
            )["input_ids"]
        # The Rust tokenizer directly: the same encodings as the call above (the wrapper sets the
        # same truncation and calls encode_batch), without the wrapper's per-call Python work,
        # which is about a third of tokenization time.
        # encode_batch_fast skips the character offsets nobody reads here (~40% of the time).
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        return [e.ids for e in encode(list(zip(queries, passages, strict=False)), add_special_tokens=True)]

    def _forward(self, encoded: list[list[int]]) -> np.ndarray:
        """Scores of tokenized pairs.

        Pairs of one exact length fill whole batches that need no padding and no attention mask
        (the model then runs its unmasked attention kernel, about 20% faster on CPU); the
        remainders of all lengths are scored in padded batches sorted by length.
        """
        import torch

        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        order = np.argsort(-lengths, kind="stable")
        scores = np.empty(len(encoded), dtype=np.float32)
        full: list[np.ndarray] = []
        rest: list[np.ndarray] = []
        for group in np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1):
            size = self.rows_for(int(lengths[group[0]]))
            cut = len(group) - len(group) % size
            full.extend(group[s : s + size] for s in range(0, cut, size))
            rest.append(group[cut:])
        rest_order = np.concatenate(rest) if rest else np.zeros(0, dtype=np.int64)
        # Every batch of the chunk is launched before any result is read back: on a GPU the
        # kernels queue up while Python prepares the next batch, instead of the GPU idling at a
        # copy back after each batch (one synchronisation per chunk).
        done_rows: list[np.ndarray] = []
        logits = []
        with torch.inference_mode():
            for rows in full:
                ids = torch.from_numpy(np.array([encoded[i] for i in rows], dtype=np.int64))
                done_rows.append(rows)
                logits.append(self._logits(ids, None))
            start = 0
            while start < len(rest_order):  # longest first: a batch's first row sets its width
                width = int(lengths[rest_order[start]])
                rows = rest_order[start : start + self.rows_for(width)]
                start += len(rows)
                ids, mask = self._pad([encoded[i] for i in rows], width)
                done_rows.append(rows)
                logits.append(self._logits(ids, mask))
            if logits:
                scores[np.concatenate(done_rows)] = torch.cat(logits).float().cpu().numpy()
        return scores

    def _check_aborted(self) -> None:
        if self.aborted.is_set():
            raise ServiceClosingError("reranking abandoned: the retrieval service is shutting down")

    def _logits(self, ids, mask):
        """The model's logits of one batch, left on the device (a flat tensor)."""
        self._check_aborted()
        mask = None if mask is None else mask.to(self.device, non_blocking=True)
        return self.model(input_ids=ids.to(self.device, non_blocking=True), attention_mask=mask).logits.view(
            -1
        )

    def _pad(self, rows: list[list[int]], width: int):
        """``(len(rows), width)`` input ids and attention mask, padded on the tokenizer's side
        (numpy instead of ``tokenizer.pad``, which costs a third of the model's time on CPU)."""
        import torch

        ids = np.full((len(rows), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        left = self.tokenizer.padding_side == "left"
        for j, row in enumerate(rows):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[j, span] = row
            mask[j, span] = 1
        return torch.from_numpy(ids), torch.from_numpy(mask)
