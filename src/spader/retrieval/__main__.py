"""Command line of the retrieval package: ``spader retrieval`` (also ``python -m spader.retrieval``).

    spader retrieval index --input <dir of chunk .jsonl files or the .tar.gz> --output <index dir>
        [--threads N]
    spader retrieval serve --index <dir> [--reranker <id|path|none>] [--host 127.0.0.1] [--port N]
        [--devices cuda:0,cuda:1 | cpu] [--parent-pid PID]

Defaults of ``serve`` are those of ``config/config.yaml`` (``retrieval`` section).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from spader.config.command import CommandParser, run_command
from spader.config.model import RetrievalConfig
from spader.retrieval.backend import SearchSettings
from spader.retrieval.corpus import CorpusFormatError
from spader.retrieval.errors import (
    IndexBuildError,
    IndexUnavailableError,
    RerankerUnavailableError,
    ServiceError,
)

#: The ``retrieval`` section's defaults (the configuration model's) as the options' defaults.
_DEFAULTS = SearchSettings.from_config(RetrievalConfig())


HELP = "build the BM25 index of a chunk corpus (index), serve BM25 + reranking over HTTP (serve)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(parser))
    _add_index_arguments(sub.add_parser("index", help="build the BM25 index of a chunk corpus"))
    sv = sub.add_parser("serve", help="serve BM25 + reranking over HTTP")
    _add_serve_arguments(sv)
    _add_search_arguments(sv)


def _add_index_arguments(ix: argparse.ArgumentParser) -> None:
    """Add the options of ``index`` to its parser ``ix``."""
    ix.add_argument(
        "--input", required=True, help="directory of chunk .jsonl files, or chunked_wikipedia.tar.gz"
    )
    ix.add_argument("--output", required=True, help="index directory to create")
    ix.add_argument("--stats", default=None, help="stats JSON (default: stats.json next to the index)")
    ix.add_argument("--threads", type=int, default=1, help="indexing threads")
    ix.add_argument("--expected-documents", type=int, default=None, help="fail unless this many were indexed")
    ix.add_argument("--overwrite", action="store_true", help="replace an existing index directory")
    ix.add_argument("--heap", default="8g", help="JVM maximum heap (default 8g)")


def _add_serve_arguments(sv: argparse.ArgumentParser) -> None:
    """Add the options of ``serve`` about the index, the reranker and the process to its parser ``sv``."""
    sv.add_argument("--index", required=True, help="Lucene index directory (raw documents stored)")
    sv.add_argument("--reranker", default=_DEFAULTS.reranker, help="hub id, local path, or 'none'")
    sv.add_argument("--host", default=_DEFAULTS.host, help="bind address (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one")
    sv.add_argument("--port-file", default=None, help="write the bound port to this file")
    sv.add_argument("--threads", type=int, default=1, help="search and CPU reranking threads")
    sv.add_argument(
        "--devices",
        default=None,
        help="reranker devices, comma-separated, one replica each (default: cuda:0 if available, else cpu)",
    )
    sv.add_argument("--parent-pid", type=int, default=None, help="exit when this process dies")


def _add_search_arguments(sv: argparse.ArgumentParser) -> None:
    """Add the options of ``serve`` about search, batching, the cache and HTTP limits to ``sv``."""
    sv.add_argument("--k1", type=float, default=_DEFAULTS.k1)
    sv.add_argument("--b", type=float, default=_DEFAULTS.b)
    sv.add_argument("--initial-k", type=int, default=_DEFAULTS.initial_k, help="BM25 candidates per query")
    sv.add_argument("--topk", type=int, default=_DEFAULTS.topk, help="passages per query")
    sv.add_argument(
        "--batch-size", type=int, default=_DEFAULTS.rerank_batch_size, help="reranker pairs per pass"
    )
    sv.add_argument("--max-length", type=int, default=_DEFAULTS.rerank_max_length, help="tokens per pair")
    sv.add_argument(
        "--max-batch-tokens",
        type=int,
        default=_DEFAULTS.rerank_max_batch_tokens,
        help="most tokens per reranker pass (default: batch size x max length)",
    )
    sv.add_argument(
        "--fp16", action=argparse.BooleanOptionalAction, default=_DEFAULTS.fp16, help="fp16 on GPU"
    )
    sv.add_argument("--max-queries", type=int, default=_DEFAULTS.max_queries_per_request)
    sv.add_argument("--max-query-chars", type=int, default=_DEFAULTS.max_query_chars)
    sv.add_argument("--cache-entries", type=int, default=_DEFAULTS.cache_entries, help="0: no result cache")
    sv.add_argument("--cache-bytes", type=int, default=_DEFAULTS.cache_bytes)
    sv.add_argument("--slice-queries", type=int, default=_DEFAULTS.slice_queries, help="queries per step")
    sv.add_argument(
        "--header-timeout",
        type=float,
        default=_DEFAULTS.header_timeout_s,
        help="seconds for a request's headers",
    )
    sv.add_argument(
        "--body-timeout", type=float, default=_DEFAULTS.body_timeout_s, help="seconds for a request's body"
    )
    sv.add_argument("--max-connections", type=int, default=_DEFAULTS.max_connections, help="open connections")
    sv.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULTS.overlap,
        help="BM25 of the next slice while the current one is reranked",
    )


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m spader.retrieval`` (what :func:`main` parses)."""
    parser = CommandParser(prog="python -m spader.retrieval", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def settings_from_args(args: argparse.Namespace) -> SearchSettings:
    """The search settings a parsed ``serve`` command line carries."""
    return dataclasses.replace(
        _DEFAULTS,
        k1=args.k1,
        b=args.b,
        initial_k=args.initial_k,
        topk=args.topk,
        reranker=None if args.reranker.lower() == "none" else args.reranker,
        rerank_batch_size=args.batch_size,
        rerank_max_length=args.max_length,
        rerank_max_batch_tokens=args.max_batch_tokens,
        fp16=args.fp16,
        host=args.host,
        max_queries_per_request=args.max_queries,
        max_query_chars=args.max_query_chars,
        devices=args.devices,
        cache_entries=args.cache_entries,
        cache_bytes=args.cache_bytes,
        slice_queries=args.slice_queries,
        overlap=args.overlap,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``index`` or ``serve``; a missing or broken index, corpus, reranker or setting, or a
    port in use, is bad input (one line, exit 2); 0 after a stop signal ended the service."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        return _run(args)
    except (
        IndexUnavailableError,
        IndexBuildError,
        CorpusFormatError,
        RerankerUnavailableError,
        ServiceError,
    ) as exc:
        raise ValueError(str(exc)) from exc


def _run(args: argparse.Namespace) -> int:
    if args.action == "index":
        from spader.retrieval.index import build_bm25_index

        stats = build_bm25_index(
            args.input,
            args.output,
            stats_path=args.stats,
            threads=args.threads,
            expected_documents=args.expected_documents,
            overwrite=args.overwrite,
            heap=args.heap,
        )
        print(json.dumps(stats, indent=2))
        return 0
    # The reranker shares its machine with other torch processes (the policy, evaluation):
    # OpenMP threads that spin while waiting for a descheduled sibling then burn the CPU the
    # others need (measured on 2 shared cores: 2-10x slower, erratic). Set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from spader.retrieval.service import serve

    settings = settings_from_args(args)
    serve(
        args.index,
        settings,
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        threads=args.threads,
        parent_pid=args.parent_pid,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the CLI (an alias of ``spader retrieval``); returns the exit status (2 for bad input
    such as a missing index)."""
    return run_command(
        "python -m spader.retrieval", add_arguments, run, argv, description=__doc__.split("\n\n")[0]
    )


def _exit(status: int) -> None:
    """End the process once its work is done and its output flushed, without the interpreter's
    teardown: collecting the JVM's and torch's objects took 10 s after a stopped service."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    _exit(main())
