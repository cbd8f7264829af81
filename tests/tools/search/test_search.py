"""BM25 search over the built-in Wikipedia corpus and over custom JSONL corpora."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

import tools.search.bm25 as tools_search
from protocol import ErrorKind, ToolError, get_tool_meta
from tools.search.bm25 import SearchTool
from tools.search.corpus import CorpusError, builtin_corpus, load_corpus


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("search-cache")


@pytest.fixture(scope="module")
def wiki(cache: Path) -> SearchTool:
    tool = SearchTool(cache_dir=str(cache))
    tool.load()
    return tool


def write_corpus(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    return path


def test_builtin_corpus_is_converted_once_to_jsonl(cache: Path, wiki: SearchTool) -> None:
    path = builtin_corpus(cache)
    assert path.parent == cache / "corpora" and path.suffix == ".jsonl"
    documents = load_corpus(path)
    assert len(documents) == wiki.num_documents == 10_033
    titles = {d.title for d in documents}
    assert {"Eiffel Tower", "Albert Einstein", "Photosynthesis"} <= titles
    assert all(d.contents for d in documents[:100])
    assert builtin_corpus(cache) == path  # reused, not rewritten


def test_index_is_cached_and_reloaded(cache: Path, wiki: SearchTool) -> None:
    saved = list((cache / "bm25").iterdir())
    assert len(saved) == 1 and (saved[0] / "params.index.json").is_file()
    stamp = (saved[0] / "params.index.json").stat().st_mtime_ns
    again = SearchTool(cache_dir=str(cache))
    again.load()
    assert list((cache / "bm25").iterdir()) == saved
    assert (saved[0] / "params.index.json").stat().st_mtime_ns == stamp
    assert again.search_batch(["Eiffel Tower"], 3) == wiki.search_batch(["Eiffel Tower"], 3)


@pytest.mark.parametrize(
    "title", ["Eiffel Tower", "Albert Einstein", "Photosynthesis", "2001: A Space Odyssey"]
)
async def test_known_title_comes_first(wiki: SearchTool, title: str) -> None:
    out = await wiki(title)
    results = out.structured["results"]
    assert len(results) == 1 and len(results[0]) == 3
    assert results[0][0]["title"] == title
    assert out.content[0]["text"].startswith(f"Doc 1 (Title: {title}) ")
    assert "Doc 3 (Title: " in out.content[0]["text"]
    scores = [row["score"] for row in results[0]]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0


async def test_batched_queries_and_topk(wiki: SearchTool) -> None:
    queries = ["theory of relativity physicist", "Jupiter gas giant planet", "French Revolution"]
    out = await wiki(queries, topk=5)
    results = out.structured["results"]
    assert [len(r) for r in results] == [5, 5, 5]
    assert results[0][0]["title"] == "Albert Einstein"
    assert "Jupiter" in [row["title"] for row in results[1]]
    assert "French Revolution" in [row["title"] for row in results[2]]
    assert {"id", "title", "contents", "score"} == set(results[0][0])
    text = out.content[0]["text"]
    assert text.count("Results for ") == 3 and text.count("Doc 5 (Title: ") == 3
    assert (await wiki(queries[:1], topk=1)).structured["results"][0] == results[0][:1]
    assert wiki.search_batch(queries, 5) == results  # the plain method gives the same answer


async def test_small_work_is_scored_on_the_event_loop_and_large_batches_in_a_thread(
    wiki: SearchTool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread hop costs the server more than a query over the built-in corpus; a batch
    whose work is over ``INLINE_WORK`` still leaves the event loop free. Same answers."""
    import threading

    threads: list[int] = []
    plain = SearchTool.search_batch

    def recording(self: SearchTool, queries: list[str], topk: int) -> list:
        threads.append(threading.get_ident())
        return plain(self, queries, topk)

    monkeypatch.setattr(SearchTool, "search_batch", recording)
    few = ["Jupiter gas giant planet"]
    many = few * (tools_search.INLINE_WORK // wiki.num_documents + 1)
    small, large = await wiki(few), await wiki(many)
    assert threads[0] == threading.get_ident() != threads[1]
    assert large.structured["results"] == small.structured["results"] * len(many)


async def test_no_match_and_empty_queries(wiki: SearchTool) -> None:
    out = await wiki("qwxzzv blorptang")
    assert out.structured["results"] == [[]]
    assert out.content[0]["text"] == "No matching documents."
    mixed = await wiki(["", "Eiffel Tower"])
    assert mixed.structured["results"][0] == []
    assert mixed.structured["results"][1][0]["title"] == "Eiffel Tower"
    assert (await wiki([" "])).structured["results"] == [[]]  # in a batch, an empty query just finds nothing


@pytest.mark.parametrize(
    ("query", "topk", "message"),
    [
        ("   ", None, "query is empty"),
        ([], None, "query list is empty"),
        (["ok", 3], None, "query[1] must be a string"),
        ("x" * 5000, None, "over the limit 4096"),
        ("Paris", 0, "topk must be an integer between 1 and 100"),
        ("Paris", 101, "topk must be an integer between 1 and 100"),
        ("Paris", True, "topk must be an integer between 1 and 100"),
    ],
)
async def test_bad_arguments(wiki: SearchTool, query: object, topk: object, message: str) -> None:
    with pytest.raises(ToolError) as info:
        await wiki(query, topk)  # type: ignore[arg-type]
    assert info.value.kind is ErrorKind.INVALID_ARGUMENTS
    assert message in info.value.message


@pytest.mark.parametrize("k", [5, 12])  # both top-k paths: repeated argmax (k <= 8) and argpartition
def test_batched_scores_match_bm25s(wiki: SearchTool, k: int) -> None:
    """The vectorised batch scorer returns what bm25s's own per-query retrieve returns."""
    index = wiki._index
    assert index is not None
    queries = [d.title + " history" for d in load_corpus(wiki_corpus_path(wiki))[:300:3]]
    ours = index.search(queries, k)
    reference = index._retriever.retrieve([index.tokenizer(q) for q in queries], k=k, show_progress=False)
    assert all(len(hits) == k for hits in ours)
    for hits, ref_scores in zip(ours, reference.scores, strict=True):
        np.testing.assert_allclose([h.score for h in hits], ref_scores[: len(hits)], rtol=1e-5)


def wiki_corpus_path(tool: SearchTool) -> Path:
    return builtin_corpus(tool._cache_override)


def test_documents_are_capped_for_the_model(cache: Path) -> None:
    tool = SearchTool(cache_dir=str(cache), max_chars_per_doc=40)
    rows = tool.search_batch(["Albert Einstein"], 2)[0]
    assert all(len(r["contents"]) <= 41 for r in rows)
    assert rows[0]["contents"].endswith("…")


async def test_custom_jsonl_corpus(tmp_path: Path) -> None:
    corpus = write_corpus(
        tmp_path / "tiny.jsonl",
        [
            {
                "id": 7,
                "title": "Rust",
                "contents": "Rust is a systems programming language focused on safety.",
            },
            {"id": "py", "title": "Python", "contents": "Python is a dynamic programming language."},
            {"title": "Garlic", "contents": "Garlic is a species of bulbous flowering plant."},
            {"id": "cat", "contents": "Cats are small domesticated carnivorous mammals."},
        ],
    )
    tool = SearchTool(corpus=str(corpus), cache_dir=str(tmp_path / "cache"), topk=2)
    await tool.startup()
    assert tool.num_documents == 4
    out = await tool("memory safety systems language")
    assert out.structured["results"][0][0]["id"] == "7"
    assert out.structured["results"][0][0]["title"] == "Rust"
    assert (await tool("cat")).structured["results"][0][0]["id"] == "cat"  # stemmed: "cats" matches "cat"
    assert (await tool("garlic plant")).structured["results"][0][0]["id"] == "2"  # default id: line position
    # the index key is the file's hash: an edited corpus gets a fresh index
    write_corpus(
        corpus, [{"id": "new", "title": "Zebra", "contents": "Zebras have black and white stripes."}]
    )
    fresh = SearchTool(corpus=str(corpus), cache_dir=str(tmp_path / "cache"))
    assert fresh.search_batch(["stripes"], 3)[0][0]["id"] == "new"
    assert len(list((tmp_path / "cache" / "bm25").iterdir())) == 2


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([b'{"id": 1, "title": "x"}'], "line 1: 'contents' must be a string"),
        ([b'{"contents": "a"}', b"not json"], "line 2: not valid JSON"),
        ([b'{"id": "a", "contents": "x"}', b'{"id": "a", "contents": "y"}'], "line 2: duplicate id 'a'"),
        ([b"[1, 2]"], "line 1: expected an object"),
        ([b""], "has no documents"),
    ],
)
def test_malformed_corpus_is_reported(tmp_path: Path, lines: list[bytes], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorpusError, match=message):
        SearchTool(corpus=str(path), cache_dir=str(tmp_path)).load()


def test_missing_corpus_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "nope.jsonl")


def test_metadata() -> None:
    meta = get_tool_meta(SearchTool)
    assert (meta.name, meta.cacheable, meta.kind) == ("search", True, "program")
    with pytest.raises(ValueError, match="topk"):
        SearchTool(topk=0)
