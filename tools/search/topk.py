"""Exact BM25 top-k of one query over a large memory-mapped index, in float32 then float64.

The score of every passage is the sum of its postings' scores (bm25s's CSC layout, one
contiguous, document-ordered slice per term, each passage at most once in it). Summing
every posting of the query's terms into a dense float64 array (``numpy.bincount``) and
taking its top k is exact but moves 8 bytes a passage through the cache several times a
query, and bincount allocates and zeroes a fresh array each time. Here:

1. every posting of the query's terms is added into a float32 scratch array, one per query
   running at the same time, reused, in query-token order (half the bytes of float64);
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
(tests/tools/search/test_scale.py and test_topk.py check it against plain references).

A batch (``top_k_many``) is shared out over one thread per core. Step 1, most of a query's
cost, is then done with fancy indexing (``scratch[docs] += weights``; a term's passages
are distinct, so no update is lost), which releases the GIL; alone, a query uses
``numpy.add.at`` instead: one pass, a quarter less CPU a query, but its fast path holds
the GIL, so threads using it take turns (bench/README.md, retrieval at 1M passages).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

__all__ = ["PostingScorer", "term_maxima"]

_FLOAT32_EPS = 2.0**-24  # unit roundoff of float32
_ROUNDING = 4  # slack in units of n * eps: twice what the two roundings need
_BLOCK = 1 << 26  # postings read at once when computing term maxima (256 MB of float32)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there, and its lock may be held."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _cores() -> int:
    """The cores this process may run on (a CPU affinity mask or a container's cpuset counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _helpers() -> ThreadPoolExecutor:
    """Threads shared by every scorer of the process: one fewer than the cores, since the
    thread that asks scores too."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(_cores() - 1, 1), thread_name_prefix="bm25")
        return _pool


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


def _add_postings(
    scratch: np.ndarray, at: list[np.ndarray], weights: list[np.ndarray], threaded: bool
) -> None:
    """``scratch[at[j]] += weights[j]`` for each term in order, in float32: the same sums both ways."""
    if not threaded:
        for positions, values in zip(at, weights, strict=True):
            np.add.at(scratch, positions, values)  # one pass, holding the GIL
        return
    # gather, add, scatter: three passes, each releasing the GIL; correct because a term's
    # passages are distinct. The first term lands on zeros: assigning it is the same float32.
    scratch[at[0]] = weights[0]
    for positions, values in zip(at[1:], weights[1:], strict=True):
        scratch[positions] += values


class PostingScorer:
    """Top k of one query at a time, or of a batch on every core; thread-safe (a scratch
    array for each query in flight)."""

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

    def top_k_many(
        self, queries: list[np.ndarray], k: int, workers: int | None = None
    ) -> list[list[tuple[int, float]]]:
        """``top_k`` of each query, in order, shared out over ``workers`` threads (default: one
        per core), each taking the next query when it is done with one (their costs vary 10x)."""
        workers = min(workers or _cores(), len(queries))
        if workers <= 1:
            return [self.top_k(tokens, k) for tokens in queries]
        results: list[list[tuple[int, float]]] = [[] for _ in queries]
        taken = itertools.count()  # next() on it is atomic: no two threads get the same query

        def drain() -> None:
            while (i := next(taken)) < len(queries):
                results[i] = self.top_k(queries[i], k, threaded=True)

        helpers: list[Future[None]] = [_helpers().submit(drain) for _ in range(workers - 1)]
        try:
            drain()
        finally:
            for helper in helpers:
                # one still queued behind another batch's helpers has nothing left to do
                if not helper.cancel():
                    helper.result()  # re-raises a helper's error
        return results

    def top_k(self, tokens: np.ndarray, k: int, *, threaded: bool = False) -> list[tuple[int, float]]:
        """``(document, score)`` best first (ties: lower document), positive scores only.

        ``threaded``: other threads score at the same time; add the postings without holding
        the GIL (more CPU, but the threads run at once). The hits are the same either way."""
        if not len(tokens) or k < 1:
            return []
        bounds = list(zip(self._indptr[tokens].tolist(), self._indptr[tokens + 1].tolist(), strict=True))
        candidates = self._candidates(bounds, self._maxima[tokens], k, threaded)
        scores = self._exact(bounds, candidates)
        order = np.lexsort((candidates, -scores))[:k]
        return [(int(candidates[i]), float(scores[i])) for i in order if scores[i] > 0]

    def _candidates(
        self, bounds: list[tuple[int, int]], maxima: np.ndarray, k: int, threaded: bool
    ) -> np.ndarray:
        """Sorted passages among which the exact top k lie (see the module docstring)."""
        lists = [self._indices[a:b] for a, b in bounds]
        sized = [docs for docs in lists if len(docs) >= k]
        if not sized:  # every list is shorter than k: its passages are few, all of them are candidates
            return _sorted_unique(np.concatenate(lists))
        at = [docs.astype(np.intp) for docs in lists]  # converted once, used to add and to clear
        try:
            scratch = self._spare.pop()  # list.pop is atomic: no lock needed
        except IndexError:
            scratch = np.zeros(self.num_docs, dtype=np.float32)  # as many as queries at once
        try:
            _add_postings(scratch, at, [self._data[a:b] for a, b in bounds], threaded)
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
                for positions in at:  # few postings: cheaper than clearing every passage
                    scratch[positions] = 0
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
