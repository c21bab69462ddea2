# Corpus: the QAMPARI Wikipedia 2021 chunk dump and its BM25 index. Shortcuts in the
# config: corpus.archive (an already downloaded dump: no download_dump job) and
# corpus.prebuilt_index (a Lucene index with raw documents: neither job; the retrieval service
# checks it when it starts). The service itself runs inside the jobs that search
# (spader.retrieval.service.running_service), so it is always stopped with them. A built index is
# replaced only on purpose (spader.infra.replace_guard, the onstart hook).


rule download_dump:
    output:
        archive=stage("download_dump", "resources/{suite}/corpus/chunked_wikipedia.tar.gz"),
    log:
        "logs/download_dump/{suite}.log",
    params:
        url=CONFIG.corpus.url,
        sha256=lambda wc: JOBS.dump_sha256(),
    script:
        "../scripts/download_dump.py"


rule build_bm25_index:
    input:
        archive=JOBS.dump,
    output:
        index=directory(stage("build_bm25_index", "results/{suite}/index/bm25")),
        stats=stage("build_bm25_index", "results/{suite}/index/stats.json"),
    log:
        "logs/build_bm25_index/{suite}.log",
    benchmark:
        "results/benchmarks/build_bm25_index/{suite}.tsv"
    threads: 16
    resources:
        mem_mb=32000,
        runtime=720,
    params:
        code=code_of("build_bm25_index"),
    script:
        "../scripts/build_bm25_index.py"
