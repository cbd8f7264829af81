"""The dense index: every document of a corpus embedded once (``title. contents``, mean-pooled,
L2-normalised) into a float32 matrix cached on disk under the corpus hash and the model
fingerprint; exact inner-product search; and reciprocal rank fusion of rankings.

``dense`` serves it as the ``dense_search`` tool; ``bm25`` uses it for hybrid search.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tools.embed import Encoder
from tools.search.corpus import builtin_corpus, load_corpus
from tools.search.corpus import cache_dir as corpus_cache_dir

logger = logging.getLogger(__name__)


def read_corpus(path: str | os.PathLike[str] | None = None) -> list[dict[str, str]]:
    """The documents of a JSONL corpus (default: the built-in Wikipedia corpus), as dicts.

    Uses the same loader as the BM25 tool, so both index exactly the same documents.
    """
    source = Path(path).expanduser() if path else builtin_corpus()
    return [{"id": d.id, "title": d.title, "contents": d.contents} for d in load_corpus(source)]


def corpus_hash(docs: Iterable[dict[str, str]]) -> str:
    digest = hashlib.sha256()
    for doc in docs:
        for key in ("id", "title", "contents"):
            digest.update(doc[key].encode("utf-8"))
            digest.update(b"\x00")
        digest.update(b"\x01")
    return digest.hexdigest()[:16]


def document_text(doc: dict[str, str]) -> str:
    """What gets embedded: the title carries much of a short page's meaning."""
    return f"{doc['title']}. {doc['contents']}" if doc["title"] else doc["contents"]


# ----------------------------------------------------------------------- index


@dataclass
class DenseIndex:
    docs: list[dict[str, str]]
    matrix: np.ndarray  # [n_docs, dim] float32, unit rows
    key: str
    positions: dict[str, int] = field(default_factory=dict)  # doc id -> row

    def __post_init__(self) -> None:
        if not self.positions:
            self.positions = {doc["id"]: row for row, doc in enumerate(self.docs)}

    @classmethod
    def build(
        cls,
        docs: list[dict[str, str]],
        encoder: Encoder,
        cache_dir: Path | None = None,
        batch_size: int = 64,
        progress: bool = True,
    ) -> DenseIndex:
        """Load the embeddings from the cache, or compute and store them (atomically)."""
        key = f"{corpus_hash(docs)}-{encoder.fingerprint}"
        directory = (cache_dir or corpus_cache_dir() / "dense").expanduser()
        path = directory / f"{key}.npy"
        if path.is_file():
            matrix = np.load(path)  # 15 MB for the built-in corpus: keep it in memory
            if matrix.shape == (len(docs), encoder.dim):
                logger.info("dense index %s loaded from %s", key, path)
                return cls(docs, matrix, key)
            logger.warning("dense cache %s has shape %s; rebuilding", path, matrix.shape)
        label = f"embedding {len(docs)} documents" if progress else False
        matrix = encoder.encode([document_text(d) for d in docs], batch_size=batch_size, progress=label)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp.npy"
        np.save(tmp, matrix)
        os.replace(tmp, path)
        logger.info("dense index %s built and cached at %s", key, path)
        return cls(docs, matrix, key)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k by inner product: ``(indices, scores)``, each ``[n_queries, k]``, best first."""
        k = min(k, len(self.docs))
        scores = np.asarray(queries @ self.matrix.T)  # [q, n]
        if k < scores.shape[1]:
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        else:
            top = np.tile(np.arange(scores.shape[1]), (scores.shape[0], 1))
        top_scores = np.take_along_axis(scores, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        return np.take_along_axis(top, order, axis=1), np.take_along_axis(top_scores, order, axis=1)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int = 60) -> list[tuple[str, float]]:
    """Merge ranked id lists: each list contributes ``1 / (k + rank)`` (rank from 1) per id."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc_id in enumerate(ranking, 1):
            fused[doc_id] = fused.get(doc_id, 0.0) + 1.0 / (k + rank)
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))
