"""Exact BM25 top-k of one query over a large memory-mapped index, in float32 then float64.

The score of every passage is the sum of its postings' scores (bm25s's CSC layout, one
contiguous, document-ordered slice per term). Summing every posting of the query's terms
into a dense float64 array (``numpy.bincount``) and taking its top k is exact but moves
8 bytes a passage through the cache several times a query, and bincount allocates and
zeroes a fresh array each time. Here:

1. every posting of the query's terms is added into a float32 scratch array, one per query
   running at the same time, reused (``numpy.add.at``: one pass, no copy of the weights,
   half the bytes);
2. ``theta``, the k-th best float32 sum among the passages of the shortest list with at
   least k postings, bounds the true k-th best score from below (k passages have at least
   that score, up to float32 rounding);
3. the candidates are the passages whose float32 sum reaches ``theta`` less a bound on the
   rounding of both sums (``n`` terms: relative error at most ``n * 2**-24`` each); every
   passage of the exact top k, ties at the cut included, is among them. They are looked for
   only in the "essential" lists (MaxScore's word): a passage found only in lists whose
   highest scores (``term_max.npy``) add up to less than the cut cannot reach it;
4. the candidates (usually a few dozen) get their exact score: each term's posting found by
   binary search in its document-ordered slice, summed in float64 in query-token order, as
   ``bincount`` sums; sorted by score, ties by lower passage.

So the result is the exhaustive float64 scorer's, scores bit for bit and ties included
(tests/tools/search/test_scale.py checks it against a plain reference), for 1.4-2.1x less
CPU a query at 1M passages (bench/README.md). ``numpy.add.at`` holds the GIL, so more threads
do not make a replica faster; more replicas do.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PostingScorer", "term_maxima"]

_FLOAT32_EPS = 2.0**-24  # unit roundoff of float32
_ROUNDING = 4  # slack in units of n * eps: twice what the two roundings need
_BLOCK = 1 << 26  # postings read at once when computing term maxima (256 MB of float32)


def term_maxima(indptr: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Each term's highest posting score (0 for a term without postings), in float32."""
    indptr = np.asarray(indptr, dtype=np.int64)
    maxima = np.zeros(len(indptr) - 1, dtype=np.float32)
    start = 0
    while start < len(maxima):  # blocks of whole terms, so that memory stays bounded
        end = max(start + 1, int(np.searchsorted(indptr, indptr[start] + _BLOCK, side="right")) - 1)
        end = min(end, len(maxima))
        lo, hi = int(indptr[start]), int(indptr[end])
        filled = np.flatnonzero(np.diff(indptr[start : end + 1]) > 0)
        if len(filled):
            maxima[start + filled] = np.maximum.reduceat(np.asarray(data[lo:hi]), indptr[start + filled] - lo)
        start = end
    return maxima


def _sorted_unique(docs: np.ndarray) -> np.ndarray:
    """``np.unique`` without numpy 2's hash table, 5-10x slower from a few hundred items here."""
    docs = np.sort(docs)
    return docs[np.concatenate(([True], docs[1:] != docs[:-1]))] if len(docs) > 1 else docs


class PostingScorer:
    """Top k of one query at a time; thread-safe (a scratch array for each query in flight)."""

    def __init__(
        self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, maxima: np.ndarray, num_docs: int
    ) -> None:
        # plain ndarray views of the memory maps: np.memmap's per-slice bookkeeping costs
        # more than the small reads themselves
        self._indptr = np.asarray(indptr, dtype=np.int64)
        self._indices = np.asarray(indices)
        self._data = np.asarray(data)
        self._maxima = np.asarray(maxima, dtype=np.float64)
        self.num_docs = num_docs
        self._spare: list[np.ndarray] = []  # scratch arrays, all zeros, for the next queries

    def top_k(self, tokens: np.ndarray, k: int) -> list[tuple[int, float]]:
        """``(document, score)`` best first (ties: lower document), positive scores only."""
        if not len(tokens) or k < 1:
            return []
        bounds = list(zip(self._indptr[tokens].tolist(), self._indptr[tokens + 1].tolist(), strict=True))
        candidates = self._candidates(bounds, self._maxima[tokens], k)
        scores = self._exact(bounds, candidates)
        order = np.lexsort((candidates, -scores))[:k]
        return [(int(candidates[i]), float(scores[i])) for i in order if scores[i] > 0]

    def _candidates(self, bounds: list[tuple[int, int]], maxima: np.ndarray, k: int) -> np.ndarray:
        """Sorted passages among which the exact top k lie (see the module docstring)."""
        lists = [self._indices[a:b] for a, b in bounds]
        sized = [docs for docs in lists if len(docs) >= k]
        if not sized:  # every list is shorter than k: its passages are few, all of them are candidates
            return _sorted_unique(np.concatenate(lists))
        try:
            scratch = self._spare.pop()  # list.pop is atomic: no lock needed
        except IndexError:
            scratch = np.zeros(self.num_docs, dtype=np.float32)  # as many as queries at once
        try:
            for (a, b), docs in zip(bounds, lists, strict=True):
                np.add.at(scratch, docs.astype(np.intp), self._data[a:b])
            shortest = min(sized, key=len)
            theta = float(np.partition(scratch[shortest], -k)[-k])
            slack = _ROUNDING * len(bounds) * _FLOAT32_EPS
            cut = theta * (1 - slack)
            # a passage found only in the lists of lowest maxima, whose sum stays under the cut,
            # cannot reach it: the candidates are in the other ("essential") lists
            order = np.argsort(maxima, kind="stable")
            reach = np.cumsum(maxima[order]) * (1 + slack)
            essential = order[int(np.searchsorted(reach, cut, side="left")) :].tolist()
            found = np.concatenate([lists[j] for j in essential])
            return _sorted_unique(found[scratch[found] >= cut])
        finally:
            if sum(len(docs) for docs in lists) * 8 < self.num_docs:
                for docs in lists:  # few postings: cheaper than clearing every passage
                    scratch[docs] = 0
            else:
                scratch.fill(0)
            self._spare.append(scratch)

    def _exact(self, bounds: list[tuple[int, int]], docs: np.ndarray) -> np.ndarray:
        """The float64 scores of ``docs`` (sorted), summed in query-token order."""
        scores = np.zeros(len(docs))
        for a, b in bounds:
            if a == b:
                continue
            postings = self._indices[a:b]
            at = np.minimum(np.searchsorted(postings, docs), b - a - 1)
            scores += np.where(postings[at] == docs, self._data[a + at], 0.0)
        return scores
