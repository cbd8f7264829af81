"""BM25 search throughput over the built-in 10k-article corpus.

Measures, side by side in one run:
* index build (empty cache) vs load (cached) time;
* single-query latency through the tool (``await tool(query)``, includes the thread hop)
  and through ``search_batch([query])``;
* batched queries/s of our vectorised scorer vs ``bm25s.BM25.retrieve`` on the same index,
  for several batch sizes.

Queries are FanOutQA dev sub-questions when the ``fanoutqa`` package is installed (real
questions), otherwise article titles.

``--recall`` instead measures recall@k of BM25, dense (MiniLM) and hybrid (RRF) retrieval
on the FanOutQA sub-questions whose evidence page is in the corpus
(``tools.data.search_qa.collect_questions``): the share of questions whose evidence page
is among the top k. It needs the ``dense`` extra; embedding the corpus takes minutes on CPU
(cached afterwards).

    .venv/bin/python bench/environments/search.py [--queries 2048] [--recall]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from tools.search.bm25 import SearchTool
from tools.search.corpus import builtin_corpus, load_corpus


def fanout_questions() -> list[str]:
    spec = importlib.util.find_spec("fanoutqa")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "fanout-final-dev.json"
    questions: list[str] = []

    def walk(node: dict) -> None:
        for sub in node.get("decomposition", []):
            questions.append(sub["question"])
            walk(sub)

    for item in json.loads(path.read_text()):
        questions.append(item["question"])
        walk(item)
    return questions


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def recall(ks: tuple[int, ...] = (1, 3, 5, 10)) -> None:
    from tools.data.search_qa import collect_questions

    items = collect_questions()
    questions = [item["question"] for item in items]
    depth = max(ks)
    bm25 = SearchTool(topk=depth)
    hybrid = SearchTool(topk=depth, hybrid=True)
    hybrid.load()
    if hybrid.retriever != "hybrid":
        raise SystemExit(f"dense retrieval unavailable: {hybrid.hybrid_unavailable}")
    dense, encoder = hybrid._dense
    rows, _ = dense.search(encoder.encode(questions), depth)
    rankings = {
        "bm25": [[hit["title"] for hit in hits] for hits in bm25.search_batch(questions, depth)],
        "dense (MiniLM)": [[dense.docs[r]["title"] for r in row] for row in rows.tolist()],
        "hybrid (RRF, k=60)": [
            [hit["title"] for hit in hits] for hits in hybrid.search_batch(questions, depth)
        ],
    }
    print(f"recall@k: {len(items)} FanOutQA sub-questions whose evidence page is in the corpus")
    print(f"{'retriever':<22}" + "".join(f"{f'@{k}':>8}" for k in ks))
    for name, ranked in rankings.items():
        figures = [
            sum(item["evidence_title"] in titles[:k] for item, titles in zip(items, ranked, strict=True))
            / len(items)
            for k in ks
        ]
        print(f"{name:<22}" + "".join(f"{f:>8.3f}" for f in figures))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=2048, help="queries per throughput measurement")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--recall", action="store_true", help="recall@k of BM25, dense and hybrid instead")
    args = parser.parse_args()
    if args.recall:
        recall()
        return

    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        SearchTool(cache_dir=cache).load()
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        tool = SearchTool(cache_dir=cache)
        tool.load()
        load_s = time.perf_counter() - start

        questions = fanout_questions()
        source = "FanOutQA dev questions"
        if not questions:
            questions = [d.title for d in load_corpus(builtin_corpus(cache))]
            source = "article titles"
        queries = (questions * (args.queries // len(questions) + 1))[: args.queries]

        print(f"corpus: {tool.num_documents} documents; queries: {source}; topk={args.topk}")
        print(f"index build (empty cache): {build_s:.2f} s   load (cached): {load_s * 1000:.0f} ms\n")

        single = []
        for q in queries[:500]:
            t = time.perf_counter()
            tool.search_batch([q], args.topk)
            single.append((time.perf_counter() - t) * 1000)

        async def through_tool() -> list[float]:
            times = []
            for q in queries[:500]:
                t = time.perf_counter()
                await tool(q, args.topk)
                times.append((time.perf_counter() - t) * 1000)
            return times

        via_tool = anyio.run(through_tool)
        print(f"{'single query':<34}{'p50 ms':>10}{'p99 ms':>10}{'q/s':>10}")
        for name, times in (("search_batch([q])", single), ("await tool(q)", via_tool)):
            print(f"{name:<34}{percentile(times, 0.5):>10.3f}{percentile(times, 0.99):>10.3f}"
                  f"{1000 / statistics.mean(times):>10.0f}")  # fmt: skip

        index = tool._index
        assert index is not None
        tokenized = [index.tokenizer(q) for q in queries]
        print(f"\n{'batched':<34}{'ours q/s':>10}{'bm25s q/s':>11}{'ratio':>8}")
        for batch in (16, 64, 256, 1024):
            t = time.perf_counter()
            for i in range(0, len(queries), batch):
                tool.search_batch(queries[i : i + batch], args.topk)
            ours = len(queries) / (time.perf_counter() - t)
            t = time.perf_counter()
            for i in range(0, len(tokenized), batch):
                index._retriever.retrieve(tokenized[i : i + batch], k=args.topk, show_progress=False)
            theirs = len(queries) / (time.perf_counter() - t)
            print(f"{f'batch of {batch}':<34}{ours:>10.0f}{theirs:>11.0f}{ours / theirs:>7.1f}x")


if __name__ == "__main__":
    main()
