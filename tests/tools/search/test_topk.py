"""The large-corpus scorer (tools/search/topk.py) against the plain definition, on random postings.

The definition is the scorer that came before it (bench/README.md, "previous scorer"):
every posting of every query token summed with ``numpy.bincount`` in float64, in
query-token order, then the k best, ties by lower passage. Hits and scores must be equal
bit for bit, one query at a time and when a batch is shared out over threads.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from tools.search.topk import PostingScorer, term_maxima

NUM_DOCS = 4000
NUM_TERMS = 60


def random_postings(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CSC score matrix as bm25s lays it out: per term, distinct passages in ascending order.

    List lengths go from empty to most of the corpus, and weights come from a few values
    (plus some arbitrary float32s), so that equal sums, at the cut and elsewhere, are common.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 1, 2, 5, 30, 300, 1500, 3500], size=NUM_TERMS)
    indices, data = [], []
    for length in lengths:
        indices.append(np.sort(rng.choice(NUM_DOCS, size=length, replace=False)).astype(np.int32))
        steps = rng.choice([0.5, 0.75, 1.25, 2.0], size=length).astype(np.float32)
        arbitrary = rng.random(length) < 0.2
        steps[arbitrary] = rng.uniform(0.1, 5.0, size=int(arbitrary.sum())).astype(np.float32)
        data.append(steps)
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    return indptr, np.concatenate(indices), np.concatenate(data)


def reference_top_k(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, tokens: np.ndarray, k: int
) -> list[tuple[int, float]]:
    """The previous scorer: bincount of every posting of every (repeated) token, in order."""
    if not len(tokens):
        return []
    spans = [np.arange(indptr[t], indptr[t + 1]) for t in tokens.tolist()]
    positions = np.concatenate(spans)
    scores = np.bincount(indices[positions], weights=data[positions], minlength=NUM_DOCS)
    ranked = np.lexsort((np.arange(NUM_DOCS), -scores))[:k]
    return [(int(doc), float(scores[doc])) for doc in ranked if scores[doc] > 0]


def random_queries(seed: int, count: int) -> list[np.ndarray]:
    """0-8 tokens, repeats allowed (a repeated token counts each time)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, NUM_TERMS, size=rng.integers(0, 9)) for _ in range(count)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scorer_equals_the_previous_scorer_bit_for_bit_ties_included(seed: int) -> None:
    indptr, indices, data = random_postings(seed)
    scorer = PostingScorer(indptr, indices, data, term_maxima(indptr, data), NUM_DOCS)
    queries = random_queries(seed, 150)
    ties_at_the_cut = 0
    for k in (1, 3, 10, 50):
        expected = [reference_top_k(indptr, indices, data, tokens, k) for tokens in queries]
        assert [scorer.top_k(tokens, k) for tokens in queries] == expected
        assert [scorer.top_k(tokens, k, threaded=True) for tokens in queries] == expected
        for workers in (1, 2, 4):  # more threads than cores too
            assert scorer.top_k_many(queries, k, workers) == expected, (k, workers)
        deeper = [reference_top_k(indptr, indices, data, tokens, k + 1) for tokens in queries]
        ties_at_the_cut += sum(len(h) == k + 1 and h[-1][1] == h[-2][1] for h in deeper)
    assert ties_at_the_cut > 10  # the k-th and the next passage score the same: order decides


class Observed(PostingScorer):
    """Each thread's first query waits until a second thread is scoring too: a batch gets
    through only if it is shared out (in the calling thread alone the barrier gives up)."""

    def __init__(self, seed: int) -> None:
        indptr, indices, data = random_postings(seed)
        super().__init__(indptr, indices, data, term_maxima(indptr, data), NUM_DOCS)
        self.arrays = indptr, indices, data
        self.arrived = threading.Barrier(2, timeout=120)
        self.threads: set[int] = set()

    def top_k(self, tokens: np.ndarray, k: int, *, threaded: bool = False) -> list[tuple[int, float]]:
        assert threaded  # shared out: the postings are added without holding the GIL
        me = threading.get_ident()
        if me not in self.threads:
            self.threads.add(me)
            if len(self.threads) <= 2:
                self.arrived.wait()
        return super().top_k(tokens, k, threaded=threaded)

    def check_batch(self, seed: int) -> None:
        queries = random_queries(seed, 64)
        assert self.top_k_many(queries, 5, workers=2) == [
            reference_top_k(*self.arrays, tokens, 5) for tokens in queries
        ]
        assert len(self.threads) == 2 and threading.get_ident() in self.threads  # the caller scores too


def test_a_batch_is_scored_on_several_threads_at_once() -> None:
    Observed(3).check_batch(3)


def test_a_forked_child_shares_batches_out_on_threads_of_its_own() -> None:
    """A server that forks workers after scoring: the parent's threads are not in the child,
    which starts its own (else its batches would wait on helpers that never come)."""
    indptr, indices, data = random_postings(5)
    parent = PostingScorer(indptr, indices, data, term_maxima(indptr, data), NUM_DOCS)
    parent.top_k_many(random_queries(5, 8), 3, workers=2)  # the parent's helper threads exist now
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        code = 1
        try:
            Observed(6).check_batch(6)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_error_in_a_helper_thread_reaches_the_caller() -> None:
    indptr, indices, data = random_postings(4)
    scorer = PostingScorer(indptr, indices, data, term_maxima(indptr, data), NUM_DOCS)
    queries = random_queries(4, 40) + [np.array([NUM_TERMS + 5])]  # a token past the vocabulary
    with pytest.raises(IndexError):
        scorer.top_k_many(queries, 3, workers=2)
    assert scorer.top_k_many(queries[:-1], 3, workers=2) == [scorer.top_k(t, 3) for t in queries[:-1]]
