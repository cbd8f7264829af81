"""``dense_search``: semantic retrieval over the search corpus with MiniLM embeddings.

The corpus is the same JSONL (``{id, title, contents}`` per line) the BM25 ``search``
tool reads. Every document is embedded once (``title. contents``, mean-pooled and
L2-normalised) into a float32 matrix that is cached on disk under a key made of the
corpus content hash and the model fingerprint, so a restart or a second replica
loads it in milliseconds. Search is an exact inner product (cosine) with numpy:
10k × 384 floats is 15 MB and a query costs well under a millisecond, so no ANN
index is needed at this size.

With ``hybrid`` and a BM25 ``SearchTool`` at hand, the two rankings are merged by
reciprocal rank fusion (RRF: ``score = Σ 1 / (k + rank)``), which needs no score
calibration between the two retrievers.

Pre-build the cache (e.g. in a container image): ``python -m tools.search.dense``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from protocol import ErrorKind, ToolError, ToolOutput, tool
from tools.embed import DEFAULT_EMBED_MODEL, Encoder, get_encoder
from tools.search.embeddings import DenseIndex, read_corpus, reciprocal_rank_fusion

logger = logging.getLogger(__name__)

MAX_QUERIES = 64
MAX_TOPK = 50


def render(queries: list[str], results: list[list[dict[str, Any]]], many: bool) -> str:
    """The text the model sees, in the same layout as the BM25 ``search`` tool's."""
    blocks = []
    for query, hits in zip(queries, results, strict=True):
        lines = [f'Results for "{query}":'] if many else []
        if not hits:
            lines.append("No matching documents.")
        lines.extend(f"Doc {n} (Title: {hit['title']}) {hit['contents']}" for n, hit in enumerate(hits, 1))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# ------------------------------------------------------------------------ tool


@tool(name="dense_search", kind="model", timeout_s=60.0, cacheable=True)
class DenseSearchTool:
    """Search the Wikipedia corpus by meaning (semantic search); returns the top pages."""

    def __init__(
        self,
        corpus: str | None = None,
        model: str = DEFAULT_EMBED_MODEL,
        device: str = "cpu",
        cache_dir: str | None = None,
        batch_size: int = 64,
        default_topk: int = 3,
        max_chars_per_doc: int | None = 1000,
        hybrid: bool = False,
        rrf_k: int = 60,
        bm25: Any = None,
        progress: bool = True,
    ) -> None:
        """Configure the index.

        Args:
            corpus: JSONL file of ``{id, title, contents}``; default: the built-in Wikipedia corpus.
            model: embedding model name or local directory.
            cache_dir: where embeddings are cached (default ``$TOOLFACTORY_CACHE/dense``).
            batch_size: documents per forward pass when building.
            default_topk: results per query when the call does not say.
            max_chars_per_doc: longer contents are cut (with "…") in the output, as ``search`` does.
            hybrid: fuse with BM25 by default (needs ``bm25`` or an importable ``tools.search.bm25``).
            rrf_k: the RRF constant (60 is the usual choice).
            bm25: a BM25 search tool instance over the same corpus, for hybrid mode.
        """
        self.corpus = corpus
        self.model = model
        self.device = device
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.batch_size = batch_size
        self.default_topk = default_topk
        self.max_chars_per_doc = max_chars_per_doc
        self.hybrid = hybrid
        self.rrf_k = rrf_k
        self.bm25 = bm25
        self.progress = progress
        self._index: DenseIndex | None = None
        self._encoder: Encoder | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------- lifecycle

    def load(self) -> DenseIndex:
        """Build or load the index (blocking; thread-safe, done once)."""
        with self._lock:
            if self._index is None:
                docs = read_corpus(self.corpus)
                self._encoder = get_encoder(self.model, self.device)
                self._index = DenseIndex.build(
                    docs, self._encoder, self.cache_dir, self.batch_size, self.progress
                )
                if self.hybrid and self.bm25 is None:
                    self.bm25 = self._make_bm25()
            return self._index

    async def startup(self) -> None:
        await asyncio.to_thread(self.load)
        if self.bm25 is not None and hasattr(self.bm25, "startup"):
            await self.bm25.startup()

    def _make_bm25(self) -> Any:
        try:
            from tools.search.bm25 import SearchTool
        except ImportError as exc:
            raise ValueError(f"hybrid search needs the BM25 tool (tools.search.bm25): {exc}") from exc
        return SearchTool(corpus=self.corpus) if self.corpus else SearchTool()

    # ------------------------------------------------------------------ call

    async def __call__(
        self,
        query: Annotated[str | list[str], "A search query, or a list of queries (at most 64)."],
        topk: Annotated[int | None, "Results per query (1 to 50; default 3)."] = None,
        mode: Annotated[
            Literal["dense", "hybrid"] | None, "dense (embeddings only) or hybrid (fused with BM25)."
        ] = None,
    ) -> ToolOutput:
        """Search the corpus by meaning."""
        queries = [query] if isinstance(query, str) else query
        if (
            not isinstance(queries, list)
            or not queries
            or not all(isinstance(q, str) and q.strip() for q in queries)
        ):
            raise ToolError(
                "'query' must be a non-empty string or a list of them", ErrorKind.INVALID_ARGUMENTS
            )
        if len(queries) > MAX_QUERIES:
            raise ToolError(
                f"at most {MAX_QUERIES} queries per call, got {len(queries)}", ErrorKind.TOO_LARGE
            )
        k = self.default_topk if topk is None else topk
        if not 1 <= k <= MAX_TOPK:
            raise ToolError(f"topk must be between 1 and {MAX_TOPK}, got {k}", ErrorKind.INVALID_ARGUMENTS)
        mode = mode or ("hybrid" if self.hybrid else "dense")
        if mode == "hybrid" and self.bm25 is None:
            raise ToolError(
                "hybrid mode needs a BM25 search tool; configure dense_search with hybrid: true",
                ErrorKind.INVALID_ARGUMENTS,
            )
        index = self._index or await asyncio.to_thread(self.load)
        if mode == "dense":
            results = await asyncio.to_thread(self._dense, index, queries, k)
        else:
            depth = min(max(4 * k, 20), MAX_TOPK)
            dense = await asyncio.to_thread(self._dense, index, queries, depth)
            lexical = await self._bm25_rankings(queries, depth)
            results = [
                self._fuse(index, [h["id"] for h in d], lex, k) for d, lex in zip(dense, lexical, strict=True)
            ]
        results = [[self._shorten(hit) for hit in hits] for hits in results]
        return ToolOutput.text(render(queries, results, isinstance(query, list)), {"results": results})

    def _shorten(self, hit: dict[str, Any]) -> dict[str, Any]:
        cap = self.max_chars_per_doc
        if cap is not None and len(hit["contents"]) > cap:
            return {**hit, "contents": hit["contents"][:cap] + "…"}
        return hit

    def _dense(self, index: DenseIndex, queries: list[str], k: int) -> list[list[dict[str, Any]]]:
        assert self._encoder is not None
        top, scores = index.search(self._encoder.encode(queries), k)
        return [
            [
                {**index.docs[int(i)], "score": round(float(s), 6)}
                for i, s in zip(row, row_scores, strict=True)
            ]
            for row, row_scores in zip(top, scores, strict=True)
        ]

    def _fuse(
        self, index: DenseIndex, dense_ids: list[str], lexical_ids: list[str], k: int
    ) -> list[dict[str, Any]]:
        hits = []
        for doc_id, score in reciprocal_rank_fusion([dense_ids, lexical_ids], self.rrf_k)[:k]:
            position = index.positions.get(doc_id)
            if position is not None:  # an id BM25 knows but this corpus does not: skip it
                hits.append({**index.docs[position], "score": round(score, 6)})
        return hits

    async def _bm25_rankings(self, queries: list[str], depth: int) -> list[list[str]]:
        """Document ids ranked by BM25, per query: one batched pass when the tool offers it."""
        search_batch = getattr(self.bm25, "search_batch", None)
        if callable(search_batch):
            groups = await asyncio.to_thread(search_batch, queries, depth)
        else:
            groups = []
            for query in queries:
                out = self.bm25(query=query, topk=depth)
                if asyncio.iscoroutine(out):
                    out = await out
                structured = out.structured if isinstance(out, ToolOutput) else out
                found = structured.get("results") if isinstance(structured, dict) else None
                groups.append(found[0] if found and isinstance(found[0], list) else [])
        return [[str(h["id"]) for h in hits if isinstance(h, dict) and "id" in h] for hits in groups]


def main(argv: Sequence[str] | None = None) -> None:
    """Build (or verify) the on-disk dense index ahead of time."""
    parser = argparse.ArgumentParser(description="Embed the search corpus and cache the matrix.")
    parser.add_argument("--corpus", help="JSONL corpus (default: the built-in Wikipedia corpus)")
    parser.add_argument("--model", default=DEFAULT_EMBED_MODEL)
    parser.add_argument("--cache-dir")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tool_ = DenseSearchTool(
        corpus=args.corpus, model=args.model, cache_dir=args.cache_dir, batch_size=args.batch_size
    )
    index = tool_.load()
    print(f"{len(index.docs)} documents, matrix {index.matrix.shape}, key {index.key}")


if __name__ == "__main__":
    main()
