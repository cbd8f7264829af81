"""Search at scale: a saved, memory-mapped BM25 index; its scorers; serving it; hybrid BM25 + dense.

Corpora are small (the first 3,000 built-in articles, split into passages), but every path
the 1M-passage bench takes runs here: the streaming build, bm25s's own layout, the
memory-mapped load, the one-query-at-a-time scorer (against a plain reference), a real server.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import bm25s
import httpx
import numpy as np
import orjson
import pytest
import yaml

import tools.search.bm25 as search_module
from protocol import decode_results
from tests.support.require import require
from tests.support.server import REPO, running_server, server_config
from tools.search.bm25 import SearchTool, Tokenizer, open_saved_index
from tools.search.corpus import CorpusError, Document, builtin_corpus, load_corpus
from tools.search.embeddings import reciprocal_rank_fusion
from tools.search.index import SearchIndexError, build_index, load_manifest, parse_passage, upgrade_index
from tools.search.topk import PostingScorer, term_maxima

QUERIES = [
    "theory of relativity physicist",
    "Jupiter gas giant planet",
    "French Revolution",
    "What is the capital of Australia?",
    "Who painted the Mona Lisa?",
    "photosynthesis chlorophyll light",
    "the of and",  # stopwords only: no results
    "zzzqqq unknownword",  # no known token
    "river river river Nile",  # a repeated token counts each time
    "Eiffel Tower Paris iron",
]


@pytest.fixture(scope="module")
def passages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built-in articles cut into passages of about 40 words, in Search-R1's wiki-18 layout
    (``{"id", "contents": '"Title"\\ntext'}``): many documents share a title, scores tie."""
    path = tmp_path_factory.mktemp("passages") / "passages.jsonl"
    lines = []
    for doc in load_corpus(builtin_corpus())[:3000]:
        words = doc.contents.split()
        for start in range(0, len(words), 40):
            text = " ".join(words[start : start + 40])
            lines.append(orjson.dumps({"id": f"{doc.id}-{start}", "contents": f'"{doc.title}"\n{text}'}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def saved(passages: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("index") / "wiki"
    build_index(passages, directory, chunk_docs=1000, progress=False)  # several spilled chunks
    return directory


def test_passage_layouts() -> None:
    assert parse_passage({"id": 7, "title": "T", "text": "body"}, 1) == Document("7", "T", "body")  # DPR
    assert parse_passage({"id": "a", "contents": '"Ada Lovelace"\nwrote programs'}, 1) == Document(
        "a", "Ada Lovelace", "wrote programs"
    )  # Search-R1's wiki-18
    assert parse_passage({"id": "b", "title": "T", "contents": "x"}, 1) == Document("b", "T", "x")  # ours
    assert parse_passage({"contents": "no title"}, 5).id == "4"
    with pytest.raises(CorpusError, match="line 3: 'text' or 'contents' must be a string"):
        parse_passage({"id": "c"}, 3)
    with pytest.raises(CorpusError, match="'id' must be a string or an integer"):
        parse_passage({"id": True, "text": "x"}, 1)


def test_saved_layout_equals_bm25s_own_index(passages: Path, saved: Path) -> None:
    """The streaming build writes what ``bm25s.BM25.index`` computes, score for score."""
    documents = [parse_passage(orjson.loads(line), n) for n, line in enumerate(passages.open("rb"), 1)]
    tokenizer = Tokenizer()
    reference = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    reference.index(
        [tokenizer("\n".join([d.title] * 2 + [d.contents])) for d in documents], show_progress=False
    )
    ours = bm25s.BM25.load(str(saved / "bm25"), mmap=True, show_progress=False)
    assert ours.scores["num_docs"] == reference.scores["num_docs"] == len(documents)
    assert isinstance(ours.scores["data"], np.memmap)

    def postings(index: bm25s.BM25, term: str) -> tuple[np.ndarray, np.ndarray]:
        column = index.vocab_dict[term]
        start, end = index.scores["indptr"][column], index.scores["indptr"][column + 1]
        return np.asarray(index.scores["indices"][start:end]), np.asarray(index.scores["data"][start:end])

    terms = [t for t in reference.vocab_dict if t]  # bm25s adds an empty token of its own
    assert set(terms) == set(ours.vocab_dict)
    for term in terms:
        (ref_docs, ref_scores), (our_docs, our_scores) = postings(reference, term), postings(ours, term)
        assert np.array_equal(ref_docs, our_docs), term
        assert np.array_equal(ref_scores, our_scores), term  # bit for bit


def test_term_maxima_are_each_terms_best_posting(saved: Path) -> None:
    indptr = np.load(saved / "bm25" / "indptr.csc.index.npy")
    data = np.load(saved / "bm25" / "data.csc.index.npy")
    maxima = np.load(saved / "term_max.npy")
    assert maxima.dtype == np.float32 and len(maxima) == len(indptr) - 1
    expected = [data[a:b].max() if b > a else 0.0 for a, b in zip(indptr[:-1], indptr[1:], strict=True)]
    assert np.array_equal(maxima, np.array(expected, dtype=np.float32))
    # the blocked computation (for indexes larger than memory) gives the same, block edges or not
    assert np.array_equal(
        term_maxima(np.array([0, 2, 2, 5]), np.array([1, 3, 2, 9, 4], np.float32)), [3, 0, 9]
    )


def test_mmap_index_serves_the_same_results_as_in_memory(passages: Path, saved: Path, tmp_path: Path) -> None:
    # the in-memory tool reads {id, title, contents}: give it the same passages in that layout
    ours_layout = tmp_path / "ours.jsonl"
    ours_layout.write_bytes(
        b"\n".join(
            orjson.dumps({"id": d.id, "title": d.title, "contents": d.contents})
            for d in (parse_passage(orjson.loads(line), n) for n, line in enumerate(passages.open("rb"), 1))
        )
    )
    in_memory = SearchTool(corpus=str(ours_layout), cache_dir=str(tmp_path / "cache"))
    mapped = SearchTool(index=str(saved))
    assert mapped.num_documents == in_memory.num_documents
    for k in (1, 3, 10):
        assert mapped.search_batch(QUERIES, k) == in_memory.search_batch(QUERIES, k)
    assert mapped.search_batch(["the of and"], 3) == [[]]
    index = mapped._index
    assert index is not None and isinstance(index._retriever.scores["indices"], np.memmap)


def reference_top_k(index: search_module.BM25Index, query: str, k: int) -> list[tuple[int, float]]:
    """The plain definition: every passage's score, summed in float64 in query-token order."""
    scores = np.zeros(index.num_docs)
    indptr, indices, data = index._indptr, np.asarray(index._indices), np.asarray(index._data)
    for token in index.token_ids(query).tolist():
        scores[indices[indptr[token] : indptr[token + 1]]] += data[indptr[token] : indptr[token + 1]]
    ranked = sorted(range(index.num_docs), key=lambda doc: (-scores[doc], doc))[:k]
    return [(doc, float(scores[doc])) for doc in ranked if scores[doc] > 0]


@pytest.mark.parametrize("k", [1, 3, 10, 50])
def test_large_corpus_scorer_equals_the_plain_reference_and_the_batched_one(
    saved: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    """One query at a time (float32 sums, then float64 for the candidates) gives exactly the
    plain float64 scores and order, ties included: the passages repeat titles, so equal
    scores at the cut are common; and the small-corpus batched scorer agrees with both."""
    batched, _ = open_saved_index(saved)
    questions = QUERIES + [d.title for d in load_corpus(builtin_corpus())[:3000:37]] + ["", "Paris Paris"]
    expected = batched.search(questions, k)
    assert sum(bool(h) for h in expected) >= len(questions) - 4  # all but the queries without a known word
    monkeypatch.setattr(search_module, "_LARGE", 0)  # what a corpus of 160k+ passages takes
    one_by_one, _ = open_saved_index(saved)
    assert one_by_one.search(questions, k) == expected
    for query, hits in zip(questions, expected, strict=True):
        assert [(h.doc, h.score) for h in hits] == reference_top_k(one_by_one, query, k), query
    ties = sum(any(x.score == y.score for x, y in zip(h, h[1:], strict=False)) for h in expected)
    assert k < 10 or ties > 0  # the corpus does exercise ties


def test_scorer_breaks_ties_by_passage_and_handles_short_lists() -> None:
    """Hand-made postings: equal scores across the cut, a term rarer than k, a repeated
    token, no token, k above the number of passages with a score."""
    # terms x passages: 0 everywhere (1.0), 1 on passages 3..6 (2.0), 2 on passage 9 only (5.0)
    rows = [(0, d, 1.0) for d in range(12)] + [(1, d, 2.0) for d in range(3, 7)] + [(2, 9, 5.0)]
    indptr = np.searchsorted([t for t, _, _ in rows], np.arange(4))
    indices = np.array([d for _, d, _ in rows], dtype=np.int32)
    data = np.array([w for _, _, w in rows], dtype=np.float32)
    scorer = PostingScorer(indptr, indices, data, term_maxima(indptr, data), 12)
    assert scorer.top_k(np.array([0, 1]), 2) == [(3, 3.0), (4, 3.0)]  # four tie at 3.0: lowest first
    assert scorer.top_k(np.array([0, 1]), 6) == [(3, 3.0), (4, 3.0), (5, 3.0), (6, 3.0), (0, 1.0), (1, 1.0)]
    assert scorer.top_k(np.array([2]), 3) == [(9, 5.0)]  # fewer postings than k
    assert scorer.top_k(np.array([2, 1, 1]), 2) == [(9, 5.0), (3, 4.0)]  # a token twice counts twice
    assert scorer.top_k(np.array([2, 0]), 3) == [(9, 6.0), (0, 1.0), (1, 1.0)]
    assert scorer.top_k(np.array([], dtype=np.int64), 3) == []
    assert len(scorer.top_k(np.array([0]), 50)) == 12


def test_bad_index_directories_are_named(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(SearchIndexError, match="does not exist; build it with `python -m tools.search.index"):
        SearchTool(index=str(tmp_path / "missing"))
    with pytest.raises(SearchIndexError, match=r"manifest.json is missing"):
        SearchTool(index=str(tmp_path))
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(saved), str(broken)], check=True)
    (broken / "term_max.npy").unlink()
    with pytest.raises(SearchIndexError, match="incomplete: missing term_max.npy"):
        load_manifest(broken)
    with pytest.raises(ValueError, match="either 'corpus'"):
        SearchTool(corpus="x.jsonl", index=str(saved))
    with pytest.raises(ValueError, match="hybrid needs an embedding of every passage"):
        SearchTool(index=str(saved), hybrid=True)


def test_a_format_1_index_is_refused_then_upgraded_in_place(saved: Path, tmp_path: Path) -> None:
    """Format 1 had best-first copies of the postings and no term maxima: refused with the
    command that fixes it, which turns it into this format without a rebuild."""
    old = tmp_path / "format1"
    subprocess.run(["cp", "-r", str(saved), str(old)], check=True)
    manifest = orjson.loads((old / "manifest.json").read_bytes())
    (old / "manifest.json").write_bytes(orjson.dumps({**manifest, "format": "toolfactory-bm25-1"}))
    (old / "term_max.npy").unlink()
    for name in ("impact.docs.npy", "impact.scores.npy"):
        (old / name).write_bytes(b"")
    with pytest.raises(
        SearchIndexError, match=r"format 'toolfactory-bm25-1'.*`python -m tools.search.index upgrade"
    ):
        SearchTool(index=str(old))
    run = subprocess.run(
        [sys.executable, "-m", "tools.search.index", "upgrade", str(old)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert orjson.loads(run.stdout)["format"] == manifest["format"] == "toolfactory-bm25-2"
    assert not (old / "impact.docs.npy").exists() and not (old / "impact.scores.npy").exists()
    assert np.array_equal(np.load(old / "term_max.npy"), np.load(saved / "term_max.npy"))
    assert SearchTool(index=str(old)).search_batch(QUERIES, 5) == SearchTool(index=str(saved)).search_batch(
        QUERIES, 5
    )
    assert upgrade_index(old) == load_manifest(old)  # already current: nothing to do
    (old / "manifest.json").write_bytes(orjson.dumps({**manifest, "format": "someone-else-3"}))
    with pytest.raises(
        SearchIndexError, match=r"'someone-else-3'.*rebuild it with `python -m tools.search.index build"
    ):
        load_manifest(old)


def test_cli_build_and_info(passages: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli-index"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.search.index",
            "build",
            str(passages),
            str(out),
            "--chunk-docs",
            "5000",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    report = orjson.loads(run.stdout)
    assert report["num_docs"] == sum(1 for _ in passages.open("rb")) and report["size_bytes"] > 0
    assert "tokenising" in run.stderr  # the progress bar
    bad = subprocess.run(
        [sys.executable, "-m", "tools.search.index", "info", str(tmp_path / "nope")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "does not exist; build it with" in bad.stderr


def test_config_serves_the_saved_index_through_a_real_server(saved: Path) -> None:
    config = server_config(
        tools=[{"target": "tools.search:SearchTool", "toolsets": ["default"], "args": {"index": str(saved)}}],
        retrieve={"tool": "search", "default_topk": 3},
    )
    expected = SearchTool(index=str(saved)).search_batch(QUERIES[:4], 3)
    with running_server(config) as server:
        body = httpx.post(
            server.url + "/retrieve", json={"queries": QUERIES[:4], "topk": 3, "return_scores": True}
        ).json()
        assert [[hit["document"]["id"] for hit in hits] for hits in body["result"]] == [
            [row["id"] for row in rows] for rows in expected
        ]
        first = body["result"][0][0]["document"]["contents"]
        assert first.startswith(f'"{expected[0][0]["title"]}"\n')
        call = {"call_id": "c1", "name": "search", "arguments": {"query": QUERIES[1], "topk": 2}}
        (result,) = decode_results(httpx.post(server.url + "/v1/calls", json={"calls": [call]}).content)
        assert result.structured["results"] == [expected[1][:2]] and result.structured["retriever"] == "bm25"


def test_bad_index_dir_stops_the_server_at_startup(tmp_path: Path) -> None:
    config = server_config(
        tools=[{"target": "tools.search:SearchTool", "args": {"index": str(tmp_path / "no-such-index")}}]
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2  # a configuration error: one line, no traceback
    assert "no-such-index does not exist; build it with" in run.stderr
    assert "Traceback" not in run.stderr and "Uvicorn running" not in run.stderr


# ---------------------------------------------------------------------- hybrid

TINY = [
    ("car", "Automobile", "A motor vehicle with four wheels that people drive on roads."),
    ("cat", "Cat", "The cat is a small domesticated carnivorous mammal often kept as a house pet."),
    ("paris", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("tokyo", "Tokyo", "Tokyo is the capital of Japan and one of the most populous cities."),
    ("piano", "Piano", "The piano is a keyboard instrument whose hammers strike strings."),
    ("everest", "Mount Everest", "Mount Everest is the highest mountain above sea level."),
]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps({"id": i, "title": t, "contents": c}) for i, t, c in TINY))
    return path


async def test_hybrid_fuses_bm25_and_dense_by_reciprocal_rank(tiny: Path, tmp_path: Path) -> None:
    require("torch", "hybrid search needs the dense extra")
    require("transformers", "hybrid search needs the dense extra")
    tool = SearchTool(corpus=str(tiny), cache_dir=str(tmp_path / "cache"), hybrid=True, topk=3)
    await tool.startup()
    assert tool.retriever == "hybrid" and tool.hybrid_unavailable is None
    bm25 = SearchTool(corpus=str(tiny), cache_dir=str(tmp_path / "cache"))
    query = "automobile people drive"  # BM25 and MiniLM both find the car page
    dense, encoder = tool._dense
    rows, _ = dense.search(encoder.encode([query]), 20)
    lexical = [row["id"] for row in bm25.search_batch([query], 20)[0]]
    expected = reciprocal_rank_fusion([lexical, [TINY[r][0] for r in rows[0].tolist()]], 60)[:3]
    out = await tool(query)
    assert [(r["id"], r["score"]) for r in out.structured["results"][0]] == [
        (doc_id, round(score, 4)) for doc_id, score in expected
    ]
    assert out.structured["retriever"] == "hybrid"
    # no shared word with any page: BM25 alone finds nothing, the fused ranking still answers
    assert bm25.search_batch(["feline"], 3) == [[]]
    assert (await tool("feline")).structured["results"][0][0]["id"] == "cat"


async def test_hybrid_without_the_model_serves_bm25_and_says_why(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "no-model-here")
    tool = SearchTool(corpus=str(tiny), cache_dir=str(tmp_path / "cache"), hybrid=True, dense_model=missing)
    with caplog.at_level(logging.WARNING, logger="tools.search.bm25"):
        await tool.startup()
    assert tool.retriever == "bm25"
    assert "no-model-here" in (tool.hybrid_unavailable or "")
    assert any("hybrid retrieval unavailable, serving BM25 only" in r.message for r in caplog.records)
    out = await tool("capital of Japan")
    plain = SearchTool(corpus=str(tiny), cache_dir=str(tmp_path / "cache"))
    assert out.structured["results"] == plain.search_batch(["capital of Japan"], 3)
    assert out.structured["retriever"] == "bm25" and "no-model-here" in out.structured["hybrid_unavailable"]
