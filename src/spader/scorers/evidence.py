"""StepSearch's gold evidence: one passage per gold entity of every training question.

List questions come without gold supporting paragraphs, so the evidence is found with the
project's own search (rule ``build_evidence``, once per training mix, index and reranker): for
each gold entity, the query ``"{question} {canonical name}"`` goes through BM25 top-``depth`` and
the reranker, and the highest-ranked passage whose title or text contains one of the entity's
aliases as whole words (:func:`spader.core.matching.find_hits`, the step-matching rule) is the
entity's evidence. Entities without such a passage are left out; the share left out is reported
per dataset. Option: for QAMPARI, the release's ``proof_text`` of each answer instead.

Queries go to the retrieval service in batched requests (``queries_per_request`` each,
``concurrency`` of them in flight; the service merges concurrent requests into one reranker pass).

Artifact (JSON Lines, one line per training question, in mix order)::

    {"id", "dataset", "n_entities", "evidence": [{"entity", "source", "passage_id", "title",
     "text", "rank"}, ...]}

and a coverage file ``{"datasets": {name: {"questions", "entities", "with_evidence", "coverage"}},
"total": {...}, "settings": {...}}``. The training job reads the first with :func:`read_evidence`.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spader.config.model import EvidenceConfig
from spader.core.matching import find_hits
from spader.core.text import normalize
from spader.data.readers import iter_jsonl, open_release
from spader.data.records import MIX_SCHEMA, DataFormatError, read_records
from spader.infra.atomic import atomic_path, atomic_write
from spader.infra.node import Needs, Node, check_here

if TYPE_CHECKING:
    from spader.retrieval.backend import SearchSettings

__all__ = [
    "EvidenceSettings",
    "build_evidence",
    "build_evidence_with_service",
    "coverage_metrics",
    "entity_query",
    "first_containing",
    "qampari_proofs",
    "read_evidence",
]

log = logging.getLogger(__name__)


#: How evidence is searched: the ``stepsearch.evidence`` section itself (the configuration model
#: holds its defaults, bounds and descriptions; ``model_validate`` builds it from the rule's param).
EvidenceSettings = EvidenceConfig


def entity_query(question: str, canonical: str) -> str:
    """The evidence query of one gold entity: the question, then the entity's canonical name."""
    return f"{question} {canonical}"


def first_containing(
    passages: Sequence[Mapping[str, Any]], aliases: Sequence[str]
) -> tuple[int, dict] | None:
    """``(rank, passage)`` of the first passage whose title or text contains an alias as whole
    words (1-based rank), or None.

    >>> first_containing([{"title": "Paris", "text": "x"}, {"title": "y", "text": "Winter Quay"}], ["winter quay"])
    (2, {'title': 'y', 'text': 'Winter Quay'})
    """
    for rank, p in enumerate(passages, start=1):
        if find_hits([p.get("title", ""), p.get("text", "")], [list(aliases)]):
            return rank, dict(p)
    return None


def qampari_proofs(release: str | os.PathLike, member: str | None) -> dict[str, list[tuple[set[str], str]]]:
    """Per QAMPARI question id, each answer's normalised names and its first non-empty
    ``proof_text`` (answers without one are left out)."""
    out: dict[str, list[tuple[set[str], str]]] = {}
    with open_release(release, member) as (stream, src):
        for line, obj in iter_jsonl(stream, src):
            qid = obj.get("qid")
            if not isinstance(qid, str):
                raise DataFormatError(src.name, line, "field 'qid' must be a string")
            answers = []
            for item in obj.get("answer_list") or []:
                if not isinstance(item, dict):
                    continue
                names = {normalize(n) for n in [item.get("answer_text"), *(item.get("aliases") or [])] if n}
                proofs = [p.get("proof_text") for p in item.get("proof") or [] if isinstance(p, dict)]
                text = next((t.strip() for t in proofs if isinstance(t, str) and t.strip()), None)
                if text and names - {""}:
                    answers.append((names - {""}, text))
            out[qid] = answers
    return out


def _search_all(client, queries: list[str], settings: EvidenceSettings) -> dict[str, list[dict]]:
    """Ranked passages of every distinct query, in batched concurrent requests."""
    unique = list(dict.fromkeys(queries))
    chunks = [
        unique[s : s + settings.queries_per_request]
        for s in range(0, len(unique), settings.queries_per_request)
    ]

    def one(chunk: list[str]) -> list[list[dict]]:
        return client.retrieve(chunk, topk=settings.depth, initial_k=settings.depth)

    ranked: dict[str, list[dict]] = {}
    with ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="evidence") as pool:
        for done, (chunk, results) in enumerate(zip(chunks, pool.map(one, chunks), strict=True), start=1):
            ranked.update(zip(chunk, results, strict=True))
            if done % 20 == 0 or done == len(chunks):
                log.info("evidence search: %d/%d requests (%d queries)", done, len(chunks), len(ranked))
    return ranked


def build_evidence(
    mix_train: str | os.PathLike,
    out_evidence: str | os.PathLike,
    out_coverage: str | os.PathLike,
    *,
    client,
    settings: EvidenceSettings,
    qampari_release: str | os.PathLike | None = None,
    qampari_member: str | None = None,
) -> dict[str, Any]:
    """Find the evidence of every training question and write the artifact and its coverage.

    Args:
        mix_train: the training mix (``results/<suite>/data/mix/train.jsonl``).
        out_evidence, out_coverage: output files (JSON Lines, JSON).
        client: a :class:`spader.retrieval.client.RetrievalClient` of the running service.
        settings: :class:`EvidenceSettings`.
        qampari_release, qampari_member: the QAMPARI train release (needed with
            ``qampari_proof_text``).
    Returns:
        The coverage dict.
    """
    records = read_records(mix_train, MIX_SCHEMA).select("id", "dataset", "question", "answers", "meta")
    rows = list(records.iter_rows(named=True))
    proofs: dict[str, list[tuple[set[str], str]]] = {}
    if settings.qampari_proof_text:
        if qampari_release is None:
            raise ValueError("stepsearch.evidence.qampari_proof_text needs the QAMPARI train release file")
        proofs = qampari_proofs(qampari_release, qampari_member)
    by_proof = settings.qampari_proof_text
    queries = [
        entity_query(r["question"], entity[0])
        for r in rows
        if not (by_proof and r["dataset"] == "qampari")
        for entity in r["answers"]
    ]
    ranked = _search_all(client, queries, settings) if queries else {}
    out_evidence, out_coverage = Path(out_evidence), Path(out_coverage)
    stats = _write_evidence(out_evidence, rows, by_proof, proofs, ranked)
    coverage = _coverage(stats, settings)
    atomic_write(out_coverage, json.dumps(coverage, indent=2, sort_keys=True) + "\n")
    for name, c in coverage["datasets"].items():
        log.info(
            "evidence %s: %d/%d entities (%.1f%%)",
            name,
            c["with_evidence"],
            c["entities"],
            100 * c["coverage"],
        )
    return coverage


def _write_evidence(
    out_evidence: Path,
    rows: list[dict[str, Any]],
    by_proof: bool,
    proofs: dict[str, list[tuple[set[str], str]]],
    ranked: dict[str, list[dict]],
) -> dict[str, dict[str, int]]:
    """Write one evidence line per question; returns the counts per dataset (questions, entities,
    entities with evidence)."""
    stats: dict[str, dict[str, int]] = defaultdict(
        lambda: {"questions": 0, "entities": 0, "with_evidence": 0}
    )
    with atomic_path(out_evidence) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            found = _question_evidence(r, by_proof, proofs, ranked)
            s = stats[r["dataset"]]
            s["questions"] += 1
            s["entities"] += len(r["answers"])
            s["with_evidence"] += len(found)
            line = {
                "id": r["id"],
                "dataset": r["dataset"],
                "n_entities": len(r["answers"]),
                "evidence": found,
            }
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return stats


def _question_evidence(
    r: Mapping[str, Any],
    by_proof: bool,
    proofs: dict[str, list[tuple[set[str], str]]],
    ranked: dict[str, list[dict]],
) -> list[dict]:
    """The evidence items found for the answer entities of one question (row ``r``)."""
    found = []
    for e, aliases in enumerate(r["answers"]):
        if by_proof and r["dataset"] == "qampari":
            item = _proof_evidence(proofs, r, e, aliases)
        else:
            item = _search_evidence(ranked[entity_query(r["question"], aliases[0])], e, aliases)
        if item is not None:
            found.append(item)
    return found


def _search_evidence(ranked: list[dict], e: int, aliases: Sequence[str]) -> dict | None:
    """The evidence item of entity ``e``: the best-ranked passage containing an alias, or None."""
    hit = first_containing(ranked, aliases)
    if hit is None:
        return None
    rank, p = hit
    return {
        "entity": e,
        "source": "search",
        "passage_id": str(p.get("id", "")),
        "title": p.get("title", ""),
        "text": p.get("text", ""),
        "rank": rank,
    }


def _proof_evidence(proofs, record: Mapping[str, Any], e: int, aliases: Sequence[str]) -> dict | None:
    qid = (record.get("meta") or {}).get("source_id") or record["id"]
    names = {normalize(a) for a in aliases} - {""}
    for k, (answer_names, text) in enumerate(proofs.get(qid, [])):
        if names & answer_names:
            return {
                "entity": e,
                "source": "proof_text",
                "passage_id": f"proof:{qid}:{k}",
                "title": "",
                "text": text,
                "rank": 0,
            }
    return None


def _coverage(stats: Mapping[str, Mapping[str, int]], settings: EvidenceSettings) -> dict[str, Any]:
    def share(c):
        return {**c, "coverage": c["with_evidence"] / c["entities"] if c["entities"] else 0.0}

    total = {k: sum(s[k] for s in stats.values()) for k in ("questions", "entities", "with_evidence")}
    return {
        "datasets": {name: share(dict(c)) for name, c in sorted(stats.items())},
        "total": share(total),
        "settings": settings.model_dump(mode="json", exclude={"gpus"}),
    }


def coverage_metrics(coverage: Mapping[str, Any]) -> dict[str, float]:
    """MLflow metrics of a coverage dict (``evidence/coverage/<dataset>`` and totals)."""
    out = {f"evidence/coverage/{name}": float(c["coverage"]) for name, c in coverage["datasets"].items()}
    out["evidence/coverage/total"] = float(coverage["total"]["coverage"])
    out["evidence/entities"] = float(coverage["total"]["entities"])
    out["evidence/with_evidence"] = float(coverage["total"]["with_evidence"])
    return out


def read_evidence(path: str | os.PathLike) -> dict[str, list[str]]:
    """Question id -> evidence texts (title and text) of a :func:`build_evidence` artifact.

    Raises:
        DataFormatError naming the file and line of a malformed entry.
    """
    out: dict[str, list[str]] = {}
    with open_release(path) as (stream, src):
        for line, obj in iter_jsonl(stream, src):
            try:
                texts = [f"{e['title']} {e['text']}".strip() for e in obj["evidence"]]
                out[str(obj["id"])] = texts
            except (KeyError, TypeError) as exc:
                raise DataFormatError(
                    src.name, line, f"not an evidence entry ({type(exc).__name__}: {exc})"
                ) from exc
    return out


def build_evidence_with_service(
    mix_train: str | os.PathLike,
    index_dir: str | os.PathLike,
    retrieval: SearchSettings,
    out_evidence: str | os.PathLike,
    out_coverage: str | os.PathLike,
    *,
    settings: EvidenceSettings,
    threads: int = 1,
    service_log: str | os.PathLike | None = None,
    qampari_release: str | os.PathLike | None = None,
    qampari_member: str | None = None,
    needs: Needs | None = None,
    measure: Callable[..., Node] | None = None,
) -> dict[str, Any]:
    """:func:`build_evidence` against a retrieval service started for the job (rule glue), once the
    node holds what the job needs (before the reranker loads).

    Args:
        mix_train, out_evidence, out_coverage, settings, qampari_release, qampari_member: see
            :func:`build_evidence`.
        index_dir: the Lucene index.
        retrieval: the job's search and service settings (reranker resolved to a local directory).
        threads: search and CPU reranking threads of the service.
        service_log: the service's log file.
        needs: what the job needs of its node (:func:`spader.planning.needs.evidence_needs`;
            default: nothing beyond a measurable node); measure: how the node is measured
            (:func:`spader.infra.node.measure_node`).
    Returns:
        The coverage dict.
    Raises:
        PreflightError: the node lacks what the job needs (one line; nothing loaded).
    """
    from spader.retrieval.service import connected_client

    check_here(needs or Needs("build_evidence"), Path(out_evidence).parent, measure=measure, logger=log)

    limit = retrieval.max_queries_per_request
    if settings.queries_per_request > limit:
        raise ValueError(
            f"stepsearch.evidence.queries_per_request ({settings.queries_per_request}) exceeds "
            f"retrieval.service.max_queries_per_request ({limit})"
        )
    with connected_client(index_dir, retrieval, log_path=service_log, threads=threads) as client:
        return build_evidence(
            mix_train,
            out_evidence,
            out_coverage,
            client=client,
            settings=settings,
            qampari_release=qampari_release,
            qampari_member=qampari_member,
        )
