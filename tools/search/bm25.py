"""BM25 search over a JSONL corpus (built-in: 10k Wikipedia lead sections).

``bm25s`` builds the index (its sparse, precomputed per-token document scores) and
saves/loads it; the index lives in the cache directory under a key made of the corpus
file's SHA-256 and the index parameters, so only the first start pays for building
and later starts only load it (bench/README.md has both times).

Scoring a batch is one vectorised pass over bm25s's score arrays: the postings of every
(query, token) pair are gathered, summed with ``numpy.bincount`` into a dense
queries x documents matrix, and the top k are taken with ``argpartition``. That gives
the same scores as ``bm25s.BM25.retrieve`` without its per-query Python loop, which
dominates the cost of small queries (throughput in bench/README.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
import bm25s
import numpy as np

from protocol import ErrorKind, ToolError, ToolOutput, tool
from tools.search.corpus import Document, builtin_corpus, cache_dir, file_digest, load_corpus
from tools.search.embeddings import reciprocal_rank_fusion
from tools.search.index import BM25_DIR, TERM_MAX, DocStore, SearchIndexError, load_manifest
from tools.search.tokens import Tokenizer
from tools.search.topk import PostingScorer, term_maxima

logger = logging.getLogger(__name__)

INDEX_FORMAT = "1"  # bump when tokenisation or the saved layout changes
MAX_QUERIES = 4096
MAX_QUERY_CHARS = 4096
MAX_TOPK = 100  # the same bound as the server's /retrieve endpoint
INLINE_WORK = 50_000  # queries x documents scored on the event loop (a worker thread above it)
_LARGE = 160_000  # documents from which queries are scored one by one, on every core


@dataclass(frozen=True, slots=True)
class Hit:
    doc: int  # position in the corpus
    score: float


class BM25Index:
    """A bm25s index plus two exact scorers: small corpora in vectorised batches, large ones
    one query at a time, a batch on every core (tools/search/topk.py); both give the same hits."""

    def __init__(self, retriever: bm25s.BM25, tokenizer: Tokenizer, maxima: np.ndarray | None = None) -> None:
        if retriever.nonoccurrence_array is not None:
            raise ValueError(
                "only BM25 variants without a non-occurrence term are supported (lucene, robertson)"
            )
        self.tokenizer = tokenizer
        self._retriever = retriever
        self._vocab: dict[str, int] = retriever.vocab_dict
        # no dtype conversion: a memory-mapped index must stay mapped, not be copied
        self._data = retriever.scores["data"]
        self._indices = retriever.scores["indices"]
        self._indptr = np.asarray(retriever.scores["indptr"], dtype=np.int64)
        self.num_docs = int(retriever.scores["num_docs"])
        if maxima is None:  # an index in memory: its scores are at hand
            maxima = term_maxima(self._indptr, self._data)
        self._one = PostingScorer(self._indptr, self._indices, self._data, maxima, self.num_docs)

    @classmethod
    def build(cls, texts: list[str], tokenizer: Tokenizer, *, k1: float = 1.5, b: float = 0.75) -> BM25Index:
        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.index([tokenizer(text) for text in texts], show_progress=False)
        return cls(retriever, tokenizer)

    @classmethod
    def load(cls, directory: Path, tokenizer: Tokenizer) -> BM25Index:
        return cls(bm25s.BM25.load(str(directory), show_progress=False), tokenizer)

    @classmethod
    def open_saved(cls, directory: Path, tokenizer: Tokenizer) -> BM25Index:
        """A saved index (tools/search/index.py), memory-mapped: pages are read as queries touch them."""
        retriever = bm25s.BM25.load(str(directory / BM25_DIR), mmap=True, show_progress=False)
        return cls(retriever, tokenizer, np.load(directory / TERM_MAX))

    def save(self, directory: Path) -> None:
        """Save atomically: build in a temporary directory, then rename it into place."""
        tmp = directory.with_name(f".{directory.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self._retriever.save(str(tmp), show_progress=False)
        try:
            os.rename(tmp, directory)
        except OSError:  # another process saved it first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)

    def token_ids(self, query: str) -> np.ndarray:
        vocab = self._vocab
        return np.fromiter((vocab[t] for t in self.tokenizer(query) if t in vocab), dtype=np.int64)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top ``k`` documents with a positive score for each query, best first (ties: corpus order)."""
        ids = [self.token_ids(q) for q in queries]
        if self.num_docs >= _LARGE:
            # one query at a time (a queries x documents block no longer fits any cache), a
            # batch shared out over a thread per core, scoring without holding the GIL
            # (tools/search/topk.py; bench/README.md, retrieval at 1M passages)
            found = self._one.top_k_many(ids, min(k, self.num_docs))
            return [[Hit(doc, score) for doc, score in hits] for hits in found]
        # Small chunks keep the dense queries x documents block in the CPU cache, which
        # beats larger vectorised passes (bench/README.md, search).
        chunk = max(1, min(64, 160_000 // max(self.num_docs, 1)))
        hits: list[list[Hit]] = []
        for start in range(0, len(ids), chunk):
            hits.extend(self._score(ids[start : start + chunk], k))
        return hits

    def _score(self, ids: list[np.ndarray], k: int) -> list[list[Hit]]:
        n = self.num_docs
        rows_per_query = np.fromiter((len(t) for t in ids), dtype=np.int64, count=len(ids))
        if not rows_per_query.any():
            return [[] for _ in ids]
        tokens = np.concatenate(ids)
        starts = self._indptr[tokens]
        lengths = self._indptr[tokens + 1] - starts
        # positions of every posting of every (query, token) pair, and the query each belongs to
        ends = np.cumsum(lengths)
        positions = np.arange(ends[-1]) - np.repeat(ends - lengths - starts, lengths)
        query_of = np.repeat(np.repeat(np.arange(len(ids)), rows_per_query), lengths)
        scores = np.bincount(
            query_of * n + self._indices[positions], weights=self._data[positions], minlength=len(ids) * n
        ).reshape(len(ids), n)
        top, top_scores = _top_k(scores, min(k, n))
        return [
            [Hit(int(d), float(s)) for d, s in zip(row_docs, row_scores, strict=True) if s > 0]
            for row_docs, row_scores in zip(top.tolist(), top_scores.tolist(), strict=True)
        ]


def _top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column indices and values of each row's k largest scores, best first, ties by lower index.

    BM25 rows are mostly zeros, where ``argpartition`` is slow; for small k, k passes of
    ``argmax`` (which returns the first maximum) are several times faster. Scores are >= 0,
    so a taken entry is marked with -1. Modifies ``scores``.
    """
    rows = np.arange(scores.shape[0])
    if k <= 8:
        top = np.empty((scores.shape[0], k), dtype=np.int64)
        values = np.empty((scores.shape[0], k), dtype=scores.dtype)
        for j in range(k):
            best = scores.argmax(axis=1)
            top[:, j] = best
            values[:, j] = scores[rows, best]
            scores[rows, best] = -1.0
        return top, values
    kth = np.partition(scores, -k, axis=1)[:, -k]
    top = np.zeros((scores.shape[0], k), dtype=np.int64)  # rows with fewer hits keep score-0 padding
    values = np.zeros((scores.shape[0], k), dtype=scores.dtype)
    for r, row in enumerate(scores):
        # everything at or above the k-th value, so that ties at the cut go to the lower index
        found = np.flatnonzero(row >= kth[r]) if kth[r] > 0 else np.flatnonzero(row > 0)
        found = found[np.lexsort((found, -row[found]))][:k]
        top[r, : len(found)] = found
        values[r, : len(found)] = row[found]
    return top, values


def open_index(
    corpus_path: Path,
    documents: list[Document],
    cache: Path,
    tokenizer: Tokenizer,
    *,
    k1: float = 1.5,
    b: float = 0.75,
    title_weight: int = 2,
) -> BM25Index:
    """Load the cached index of this exact corpus file and settings, or build and cache it.

    The title is indexed ``title_weight`` times: on FanOutQA's sub-questions whose evidence
    page is in the built-in corpus, weight 2 lifts recall@3 from 0.685 to 0.715.
    """
    key = f"{file_digest(corpus_path)[:24]}-{tokenizer.name}-k{k1}-b{b}-t{title_weight}-v{INDEX_FORMAT}"
    directory = cache / "bm25" / key
    if (directory / "params.index.json").is_file():
        index = BM25Index.load(directory, tokenizer)
        if index.num_docs == len(documents):
            return index
    texts = ["\n".join([d.title] * title_weight + [d.contents]) for d in documents]
    index = BM25Index.build(texts, tokenizer, k1=k1, b=b)
    directory.parent.mkdir(parents=True, exist_ok=True)
    index.save(directory)
    return index


def open_saved_index(directory: Path) -> tuple[BM25Index, DocStore]:
    """A saved index (tools/search/index.py) and its passages, both memory-mapped."""
    manifest = load_manifest(directory)
    stemmer = None if manifest.tokenizer == "nostem" else manifest.tokenizer.removeprefix("stem-")
    tokenizer = Tokenizer(stemmer)
    if tokenizer.name != manifest.tokenizer:
        raise SearchIndexError(
            f"{directory} was built with tokenizer {manifest.tokenizer!r}, but here it would be {tokenizer.name!r}"
        )
    documents = DocStore(directory)
    index = BM25Index.open_saved(directory, tokenizer)
    if index.num_docs != len(documents) or index.num_docs != manifest.num_docs:
        raise SearchIndexError(
            f"{directory}: the index, the passages and the manifest disagree on their count"
        )
    return index, documents


def _invalid(message: str) -> ToolError:
    return ToolError(message, ErrorKind.INVALID_ARGUMENTS)


@tool(name="search", cacheable=True, timeout_s=30)
class SearchTool:
    """Search an encyclopedia (by default the lead sections of 10,000 vital Wikipedia articles).

    Keyword (BM25) search: use distinctive names and terms rather than full questions.
    """

    def __init__(
        self,
        corpus: str | None = None,
        cache_dir: str | None = None,
        topk: int = 3,
        max_chars_per_doc: int | None = 1000,
        stemmer: str | None = "auto",
        k1: float = 1.5,
        b: float = 0.75,
        title_weight: int = 2,
        index: str | None = None,
        hybrid: bool = False,
        dense_model: str = "all-minilm-l6-v2",
        rrf_k: int = 60,
    ) -> None:
        """Configure the corpus.

        Args:
            corpus: JSONL of ``{id, title, contents}``, indexed in memory at start-up (cached);
                default: the built-in Wikipedia corpus.
            index: a saved index directory (``python -m tools.search.index build``), served
                memory-mapped: for collections of millions of passages. Excludes ``corpus``;
                its tokeniser and BM25 parameters come from the index.
            hybrid: fuse BM25 with dense (MiniLM) retrieval by reciprocal rank fusion. Needs
                the ``dense`` extra and the model package; without them the tool logs why and
                serves BM25 alone (``structured["retriever"]`` says which ran).
            rrf_k: the RRF constant: each ranking adds ``1 / (rrf_k + rank)`` per document.
        """
        if not 1 <= topk <= MAX_TOPK:
            raise ValueError(f"topk must be between 1 and {MAX_TOPK}, got {topk}")
        if index is not None and corpus is not None:
            raise ValueError(
                "search: give either 'corpus' (a JSONL file) or 'index' (a saved index), not both"
            )
        if index is not None and hybrid:
            raise ValueError(
                "search: hybrid needs an embedding of every passage; it works with 'corpus', not a saved 'index'"
            )
        if index is not None:
            load_manifest(index)  # a bad directory fails when the config is loaded, not on the first call
        self.corpus = corpus
        self.index_dir = index
        self.topk = topk
        self.max_chars_per_doc = max_chars_per_doc
        self._cache_override = cache_dir
        self._stemmer = stemmer
        self._params = {"k1": k1, "b": b, "title_weight": title_weight}
        self.hybrid = hybrid
        self.dense_model = dense_model
        self.rrf_k = rrf_k
        self.hybrid_unavailable: str | None = None  # why hybrid fell back to BM25, if it did
        self._dense: Any = None  # (DenseIndex, Encoder) when hybrid runs
        self._lock = threading.Lock()
        self._index: BM25Index | None = None
        self._documents: Sequence[Document] = []

    async def startup(self) -> None:
        await anyio.to_thread.run_sync(self.load)

    def load(self) -> None:
        """Load (or build once) the corpus and its index. Idempotent and thread-safe."""
        with self._lock:
            if self._index is not None:
                return
            if self.index_dir is not None:
                self._index, self._documents = open_saved_index(Path(self.index_dir))
                return
            cache = cache_dir(self._cache_override)
            path = Path(self.corpus) if self.corpus else builtin_corpus(cache)
            documents = load_corpus(path)
            if self.hybrid:
                self._dense = self._load_dense(documents, cache)
            self._index = open_index(path, documents, cache, Tokenizer(self._stemmer), **self._params)
            self._documents = documents

    def _load_dense(self, documents: list[Document], cache: Path) -> Any:
        """The dense index and encoder for hybrid search, or None (logged) when the model is missing."""
        from tools.embed import get_encoder
        from tools.search.embeddings import DenseIndex

        try:
            encoder = get_encoder(self.dense_model)
        except (ImportError, FileNotFoundError) as exc:
            self.hybrid_unavailable = str(exc)
            logger.warning("search: hybrid retrieval unavailable, serving BM25 only: %s", exc)
            return None
        docs = [{"id": d.id, "title": d.title, "contents": d.contents} for d in documents]
        return DenseIndex.build(docs, encoder, cache / "dense", progress=False), encoder

    @property
    def retriever(self) -> str:
        """What answers the calls: "hybrid" or "bm25"."""
        self.load()
        return "hybrid" if self._dense is not None else "bm25"

    @property
    def num_documents(self) -> int:
        self.load()
        return len(self._documents)

    def rank(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Corpus positions and scores per query, best first: BM25, or BM25 fused with dense."""
        self.load()
        assert self._index is not None
        if self._dense is None:
            return self._index.search(queries, topk)
        dense, encoder = self._dense
        depth = min(max(4 * topk, 20), MAX_TOPK)  # fuse deeper lists than are returned
        lexical = self._index.search(queries, depth)
        semantic, _ = dense.search(encoder.encode(queries), depth)
        ranked = []
        for bm25_hits, dense_rows in zip(lexical, semantic.tolist(), strict=True):
            ids = [[self._documents[h.doc].id for h in bm25_hits], [dense.docs[r]["id"] for r in dense_rows]]
            fused = reciprocal_rank_fusion(ids, self.rrf_k)[:topk]
            ranked.append([Hit(dense.positions[doc_id], score) for doc_id, score in fused])
        return ranked

    def search_batch(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        """Top ``topk`` documents per query: ``{"id", "title", "contents", "score"}``, best first."""
        cap = self.max_chars_per_doc
        results = []
        for hits in self.rank(queries, topk):
            rows = []
            for hit in hits:
                doc = self._documents[hit.doc]
                contents = (
                    doc.contents if cap is None or len(doc.contents) <= cap else doc.contents[:cap] + "…"
                )
                rows.append(
                    {"id": doc.id, "title": doc.title, "contents": contents, "score": round(hit.score, 4)}
                )
            results.append(rows)
        return results

    async def __call__(
        self,
        query: Annotated[str | list[str], "Search terms, or a list of queries to run at once."],
        topk: Annotated[
            int | None, "How many documents to return per query (default 3, at most 100)."
        ] = None,
    ) -> ToolOutput:
        """Search the corpus; returns the best matching documents for each query."""
        queries = self._validate(query, topk)
        k = self.topk if topk is None else topk
        if self._scores_inline(queries):
            results = self.search_batch(queries, k)
        else:
            results = await anyio.to_thread.run_sync(self.search_batch, queries, k)
        structured: dict[str, Any] = {"results": results, "retriever": self.retriever}
        if self.hybrid_unavailable:
            structured["hybrid_unavailable"] = self.hybrid_unavailable
        return ToolOutput.text(self._render(queries, results, isinstance(query, list)), structured)

    def _scores_inline(self, queries: list[str]) -> bool:
        """Small in-memory BM25 work runs on the event loop: a worker-thread hop costs the
        server more CPU than scoring a few queries over a small corpus (bench/README.md,
        "Capacity plan"). A saved index, dense encoding and a corpus still loading go to a
        thread, as does a large batch."""
        return (
            self._index is not None
            and self._dense is None
            and self.index_dir is None
            and len(queries) * len(self._documents) <= INLINE_WORK
        )

    def _validate(self, query: Any, topk: Any) -> list[str]:
        queries = query if isinstance(query, list) else [query]
        if not queries:
            raise _invalid("query list is empty")
        if len(queries) > MAX_QUERIES:
            raise _invalid(f"{len(queries)} queries in one call, over the limit {MAX_QUERIES}")
        for i, q in enumerate(queries):
            where = "query" if not isinstance(query, list) else f"query[{i}]"
            if not isinstance(q, str):
                raise _invalid(f"{where} must be a string, got {type(q).__name__}")
            if len(q) > MAX_QUERY_CHARS:
                raise _invalid(f"{where} has {len(q)} characters, over the limit {MAX_QUERY_CHARS}")
        if not isinstance(query, list) and not query.strip():
            raise _invalid("query is empty; send a few distinctive search terms")  # in a list: no results
        if topk is not None and (
            isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK
        ):
            raise _invalid(f"topk must be an integer between 1 and {MAX_TOPK}, got {topk!r}")
        return queries

    @staticmethod
    def _render(queries: list[str], results: list[list[dict[str, Any]]], many: bool) -> str:
        blocks = []
        for query, rows in zip(queries, results, strict=True):
            lines = [f'Results for "{query}":'] if many else []
            if not rows:
                lines.append("No matching documents.")
            lines.extend(
                f"Doc {i} (Title: {row['title']}) {row['contents']}" for i, row in enumerate(rows, 1)
            )
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)
