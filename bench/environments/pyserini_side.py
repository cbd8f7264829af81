"""Pyserini's half of bench/environments/retrieval.py, run by an interpreter that has Pyserini and Java.

    PYTHON corpus.jsonl workdir queries.json topk

Indexes the same passages with Lucene (Anserini's ``JsonCollection``: ``contents`` is the
title on one line and the text below, as Search-R1's wiki-18 has it) and searches the
same queries with Pyserini's defaults (BM25 k1=0.9, b=0.4, what Search-R1 serves); prints
its figures. Kept out of the project's venv: Pyserini pulls torch, faiss, onnxruntime
and a JVM.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    corpus, workdir, queries_file, topk = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    queries = json.loads(Path(queries_file).read_text())
    collection, index = workdir / "collection", workdir / "index"
    if not (index / "segments.gen").exists() and not any(index.glob("segments_*")):
        shutil.rmtree(workdir, ignore_errors=True)
        collection.mkdir(parents=True)
        with (
            open(corpus, encoding="utf-8") as src,
            open(collection / "docs.jsonl", "w", encoding="utf-8") as out,
        ):
            for line in src:
                record = json.loads(line)
                contents = f"{record['title']}\n{record['text']}"
                out.write(json.dumps({"id": record["id"], "contents": contents}) + "\n")
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
             "--input", str(collection), "--index", str(index), "--generator",
             "DefaultLuceneDocumentGenerator", "--threads", "2", "--storeRaw"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        build = time.perf_counter() - start
        size = sum(p.stat().st_size for p in index.rglob("*") if p.is_file())
        print(f"pyserini build: {build:.0f} s wall (2 threads), index {size / 2**20:.0f} MB (with raw text)")
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(index))
    for q in queries[:200]:  # JIT warm-up
        searcher.search(q, topk)
    start = time.perf_counter()
    for q in queries[:300]:
        searcher.search(q, topk)
    single = 300 / (time.perf_counter() - start)
    qids = [str(i) for i in range(len(queries))]
    rates = []
    for threads in (1, 2):
        start = time.perf_counter()
        for i in range(0, len(queries), 64):
            searcher.batch_search(queries[i : i + 64], qids[i : i + 64], topk, threads)
        rates.append(len(queries) / (time.perf_counter() - start))
    print(
        f"pyserini ({searcher.num_docs:,} passages): single {single:.0f} q/s; batch_search 64 per call: {rates[0]:.0f} q/s (1 thread), "
        f"{rates[1]:.0f} q/s (2 threads); process RSS {rss_gb():.2f} GB (JVM + Python)"
    )


if __name__ == "__main__":
    main()
