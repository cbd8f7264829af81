"""BM25 at Search-R1 scale: a synthetic 1M-passage corpus, built, saved and served memory-mapped.

The corpus (deterministic for a seed) is made from the 10,033 shipped Wikipedia lead
sections (36,961 sentences): passage i takes a random article (its title is the passage's
title) and a run of consecutive sentences from it, starting at a random sentence and
wrapping around, until it has 60 words; then random sentences from the whole collection
until it has 100 words. So passages are ~100 words like wiki-18's, keep a topic, and
every term's document frequency is ~100x the original's: a harsher load than real text
of the same size, where rare terms stay rare.

Measured, side by side in one run:
* build (``python -m tools.search.index build``, a child process): wall time, peak RSS;
  size on disk by part;
* in process, on the same memory-mapped arrays and the same tokenised queries: our scorer
  (tools/search/topk.py: one query at a time, a batch on every core) and
  ``bm25s.BM25.retrieve`` (numpy backend), single queries and batches, and our CPU time per
  query (less sensitive to a busy machine than q/s); agreement of the top k;
* with ``--ref REF``: the scorer of another commit (its tools/search/topk.py, or a file of
  that name) on the same arrays and queries, rounds alternating with ours: q/s one query at
  a time and in batches of 1,024, CPU a query, and whether every hit and score is the same;
* a real ``tool-server`` with ``args: {index: DIR}``: RSS/PSS/USS after start and after
  serving, q/s through ``POST /retrieve`` (Search-R1's API) one query per request and 64;
* Pyserini (Lucene, what Search-R1 uses) on the same passages and queries, when
  ``--pyserini-python`` names an interpreter that has it (bench/README.md says how).

    .venv/bin/python bench/environments/retrieval.py --passages 1000000 --workdir /tmp/retrieval
    .venv/bin/python bench/environments/retrieval.py --passages 1000000 --workdir /tmp/retrieval --quick
    .venv/bin/python bench/environments/retrieval.py --passages 1000000 --workdir /tmp/retrieval --quick --ref HEAD

``--quick`` (about a minute at 1M) needs the corpus and index of an earlier run in the
workdir, and gives bm25s fewer queries.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import psutil

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.environments.search import fanout_questions  # noqa: E402
from tools.search.corpus import builtin_source  # noqa: E402
from tools.search.index import TERM_MAX  # noqa: E402

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def synthesise(path: Path, passages: int, seed: int = 0) -> None:
    """Write ``passages`` lines of ``{"id", "title", "text"}`` (see the module docstring)."""
    articles = orjson.loads(builtin_source().read_bytes())
    titles, runs = [], []
    for key in sorted(articles):
        sentences = [s for s in _SENTENCE_END.split(articles[key].get("extract") or "") if s.strip()]
        if sentences:
            titles.append(articles[key].get("title") or key)
            runs.append([(s, len(s.split())) for s in sentences])
    pool = [sentence for run in runs for sentence in run]
    rng = random.Random(seed)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        for number in range(passages):
            article = rng.randrange(len(runs))
            run = runs[article]
            start = rng.randrange(len(run))
            parts, words = [], 0
            for step in range(len(run)):
                if words >= 60:
                    break
                sentence, count = run[(start + step) % len(run)]
                parts.append(sentence)
                words += count
            while words < 100:
                sentence, count = pool[rng.randrange(len(pool))]
                parts.append(sentence)
                words += count
            record = {"id": str(number), "title": titles[article], "text": " ".join(parts)}
            out.write(orjson.dumps(record) + b"\n")
    os.replace(tmp, path)


def disk_usage(directory: Path) -> dict[str, int]:
    parts: dict[str, int] = {}
    for path in directory.rglob("*"):
        if path.is_file():
            part = path.relative_to(directory).parts[0]
            parts[part] = parts.get(part, 0) + path.stat().st_size
    return parts


def build(corpus: Path, index: Path) -> tuple[float, float]:
    """Build in a child process: (wall seconds, peak RSS in GB of that child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tools.search.index", "build", str(corpus), str(index)],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024 / 1024


def rate(fn, items: list, batch: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(0, len(items), batch):
        fn(items[i : i + batch])
    return len(items) / (time.perf_counter() - start)


def in_process(index_dir: Path, queries: list[str], k: int, bm25s_share: int, ref: str | None) -> None:
    import bm25s

    from tools.search.bm25 import open_saved_index

    ours, _ = open_saved_index(index_dir)
    theirs = bm25s.BM25.load(str(index_dir / "bm25"), mmap=True, show_progress=False)
    tokenized = [ours.tokenizer(q) for q in queries]
    safe = [t or ["the"] for t in tokenized]  # bm25s refuses a query with no known token
    ours.search(queries, k)  # the page cache and the memory maps: both read the same files

    def bm25s_retrieve(tokens: list[list[str]], threads: int = 0) -> None:
        theirs.retrieve(tokens, k=k, show_progress=False, n_threads=threads)

    print(
        f"\nin process, memory-mapped, {len(queries)} queries (bm25s: 1/{bm25s_share} of them), topk {k}, q/s"
    )
    print(f"{'':<16}{'ours':>8}{'bm25s':>8}{'ours/bm25s':>12}")
    for batch in (1, 64, 1024):
        share = queries[:300] if batch == 1 else queries
        a = rate(lambda qs: ours.search(qs, k), share, batch)
        b = rate(bm25s_retrieve, safe[: max(len(share) // bm25s_share, 1)], batch)
        print(f"{f'batch of {batch}':<16}{a:>8.0f}{b:>8.0f}{a / b:>11.1f}x")
    ids = [ours.token_ids(q) for q in queries]
    for workers in (1, None):
        wall, cpu = time.perf_counter(), time.process_time()
        ours._one.top_k_many(ids, k, workers)
        wall, cpu = time.perf_counter() - wall, (time.process_time() - cpu) / len(ids)
        print(
            f"ours, {'one thread' if workers else f'a thread per core ({len(os.sched_getaffinity(0))})'}: "
            f"{cpu * 1e3:.2f} ms CPU a query, {len(ids) / wall:.0f} q/s"
        )
    threaded = rate(lambda ts: bm25s_retrieve(ts, threads=2), safe[: max(2048 // bm25s_share, 2)], 256)
    print(f"bm25s with n_threads=2, batch of 256: {threaded:.0f} q/s")
    # agreement: bm25s sums in float32 and breaks ties arbitrarily, we sum in float64 and
    # break ties by corpus order, so compare the scores of the top k, not the documents
    mine = ours.search(queries[:200], k)
    _, scores = theirs.retrieve(safe[:200], k=k, show_progress=False)
    known = [i for i, t in enumerate(tokenized[:200]) if t]
    same = sum(np.allclose([h.score for h in mine[i]], scores[i][: len(mine[i])], rtol=1e-5) for i in known)
    print(f"same top-{k} scores as bm25s: {same}/{len(known)} queries")
    rss = psutil.Process().memory_info().rss
    print(
        f"this process's RSS after all of the above: {rss / 2**30:.2f} GB (both scorers mapped the same files)"
    )
    if ref:
        side_by_side(ours, index_dir, ids, k, ref)


def reference_scorer(ref: str):  # type: ignore[no-untyped-def]
    """The module tools/search/topk.py of a commit (or a file given by path), imported under another name."""
    path = Path(ref)
    if not path.is_file():
        source = subprocess.run(
            ["git", "show", f"{ref}:tools/search/topk.py"], cwd=REPO, capture_output=True, check=False
        )
        if source.returncode:
            sys.exit(
                f"--ref {ref}: neither a file nor a commit with tools/search/topk.py: {source.stderr.decode()}"
            )
        path = Path(tempfile.mkdtemp()) / "topk_ref.py"
        path.write_bytes(source.stdout)
    spec = importlib.util.spec_from_file_location("topk_ref", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def side_by_side(ours, index_dir: Path, ids: list[np.ndarray], k: int, ref: str) -> None:  # type: ignore[no-untyped-def]
    """REF's scorer and ours on the same memory-mapped arrays, alternating, in this process."""
    old = reference_scorer(ref).PostingScorer(
        ours._indptr, ours._indices, ours._data, np.load(index_dir / TERM_MAX), ours.num_docs
    )

    def batch(scorer, queries: list[np.ndarray]) -> list:  # type: ignore[no-untyped-def]
        if hasattr(scorer, "top_k_many"):
            return scorer.top_k_many(queries, k)
        return [scorer.top_k(tokens, k) for tokens in queries]  # what BM25Index.search did

    def measure(scorer) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
        """q/s one query at a time (300 queries), q/s and CPU ms a query in batches of 1,024."""
        start = time.perf_counter()
        for tokens in ids[:300]:
            batch(scorer, [tokens])
        single = 300 / (time.perf_counter() - start)
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(0, len(ids), 1024):
            batch(scorer, ids[i : i + 1024])
        batched = len(ids) / (time.perf_counter() - start)
        return single, batched, (time.process_time() - cpu) / len(ids) * 1e3

    print(f"\nside by side with --ref {ref} (its topk.py on the same arrays), {len(ids)} queries, topk {k}, "
          f"{len(os.sched_getaffinity(0))} cores")  # fmt: skip
    print(f"{'round':<7}{'':<6}{'1 query q/s':>13}{'1,024 q/s':>11}{'CPU ms/q':>10}{'load':>6}")
    ratios = []
    for round_ in range(1, 4):
        pair = []
        for name, scorer in (("ref", old), ("ours", ours._one)):
            single, batched, cpu = measure(scorer)
            pair.append(batched)
            print(
                f"{round_:<7}{name:<6}{single:>13.0f}{batched:>11.0f}{cpu:>10.2f}{os.getloadavg()[0]:>6.1f}"
            )
        ratios.append(pair[1] / pair[0])
    print(f"batched ours / ref: {', '.join(f'{r:.2f}x' for r in ratios)}")
    same = total = 0
    for depth in (1, 3, 10, 100):
        sample = ids[:500]
        mine = ours._one.top_k_many(sample, depth)
        same += sum(a == b for a, b in zip(mine, [old.top_k(t, depth) for t in sample], strict=True))
        total += len(sample)
    print(f"same hits and scores, bit for bit, as --ref {ref}: {same}/{total} (k = 1, 3, 10, 100)")


def served(index_dir: Path, queries: list[str], k: int) -> None:
    from tests.support.server import running_server, server_config

    config = server_config(
        tools=[{"target": "tools.search:SearchTool", "args": {"index": str(index_dir)}}],
        retrieve={"tool": "search", "default_topk": k},
        cache={"enabled": False},  # repeated queries must be scored, not answered from the cache
    )
    with running_server(config, startup_timeout_s=600) as server:
        process = psutil.Process(server.proc.pid)

        def memory(label: str) -> None:
            info = process.memory_full_info()
            print(f"server {label:<22} RSS {info.rss / 2**30:.2f} GB  PSS {info.pss / 2**30:.2f} GB  "
                  f"USS {info.uss / 2**30:.2f} GB")  # fmt: skip

        memory("after start")
        with httpx.Client(base_url=server.url, timeout=600) as client:

            def post(batch: list[str]) -> None:
                response = client.post("/retrieve", json={"queries": batch, "topk": k, "return_scores": True})
                response.raise_for_status()

            single = rate(post, queries[:300], 1)
            batched = rate(post, queries, 64)
        memory(f"after {len(queries) + 300} queries")
        print(f"POST /retrieve: 1 query per request {single:.0f} q/s, 64 per request {batched:.0f} q/s")


def pyserini(python: str, corpus: Path, queries: list[str], k: int, workdir: Path) -> None:
    """Index and search the same passages with Pyserini in its own interpreter (it needs Java)."""
    script = REPO / "bench" / "environments" / "pyserini_side.py"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(queries, fh)
    out = subprocess.run(
        [python, str(script), str(corpus), str(workdir / "pyserini"), fh.name, str(k)],
        capture_output=True,
        text=True,
        check=False,
    )
    print(out.stdout.strip() or f"pyserini failed: {out.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "toolfactory-retrieval")
    parser.add_argument("--queries", type=int, default=2048)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true", help="rebuild the index even if one is there")
    parser.add_argument("--pyserini-python", help="an interpreter with pyserini installed (and Java)")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument(
        "--ref",
        help="compare with the scorer of this commit (or a topk.py file), side by side in one process",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="reuse the corpus and index in the workdir; bm25s gets 1/32 of the queries",
    )
    args = parser.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = args.workdir / f"passages-{args.passages}-seed{args.seed}.jsonl"
    index = args.workdir / f"index-{args.passages}-seed{args.seed}"
    if args.quick and not (index / "manifest.json").is_file():
        parser.error(f"--quick reuses an index, and {index} has none: run once without --quick")
    if not corpus.is_file():
        start = time.perf_counter()
        synthesise(corpus, args.passages, args.seed)
        print(f"synthesised {args.passages:,} passages in {time.perf_counter() - start:.0f} s: {corpus}")
    print(f"corpus: {corpus.stat().st_size / 2**20:.0f} MB, {args.passages:,} passages")
    if args.rebuild or not (index / "manifest.json").is_file():
        wall, peak = build(corpus, index)
        print(f"build: {wall:.0f} s wall, peak RSS {peak:.2f} GB")
    manifest = json.loads((index / "manifest.json").read_text())
    print(
        f"index: {manifest['num_terms']:,} terms, {manifest['num_postings']:,} postings (build {manifest['build_s']} s)"
    )
    parts = disk_usage(index)
    print("on disk: " + ", ".join(f"{name} {size / 2**20:.0f} MB" for name, size in sorted(parts.items()))
          + f"; total {sum(parts.values()) / 2**20:.0f} MB")  # fmt: skip

    questions = fanout_questions()
    queries = (questions * (args.queries // max(len(questions), 1) + 1))[: args.queries]
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    in_process(index, queries, args.topk, 32 if args.quick else 8, args.ref)
    if not args.skip_server:
        served(index, queries, args.topk)
    if args.pyserini_python:
        pyserini(args.pyserini_python, corpus, queries, args.topk, args.workdir)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}; numpy {np.__version__}")


if __name__ == "__main__":
    main()
