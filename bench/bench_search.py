"""BM25 search throughput over the built-in 10k-article corpus.

Measures, side by side in one run:
* index build (empty cache) vs load (cached) time;
* single-query latency through the tool (``await tool(query)``, includes the thread hop)
  and through ``search_batch([query])``;
* batched queries/s of our vectorised scorer vs ``bm25s.BM25.retrieve`` on the same index,
  for several batch sizes.

Queries are FanOutQA dev sub-questions when the ``fanoutqa`` package is installed (real
questions), otherwise article titles.

    .venv/bin/python bench/bench_search.py [--queries 2048]
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

from tools.corpus import builtin_corpus, load_corpus
from tools.search import SearchTool


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=2048, help="queries per throughput measurement")
    parser.add_argument("--topk", type=int, default=3)
    args = parser.parse_args()

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
