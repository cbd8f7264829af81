"""``embed``, ``rerank`` and ``dense_search`` with the real packaged MiniLM model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from protocol import ErrorKind, ToolError, ToolOutput
from tools.embed import EmbedTool, Encoder, RerankTool, get_encoder, resolve_embedding_model
from tools.search.bm25 import SearchTool
from tools.search.corpus import CorpusError
from tools.search.dense import DenseSearchTool
from tools.search.embeddings import DenseIndex, corpus_hash, read_corpus, reciprocal_rank_fusion

DOCS = [
    ("cat", "Cat", "The cat is a small domesticated carnivorous mammal often kept as a house pet."),
    (
        "dog",
        "Dog",
        "The dog is a domesticated descendant of the wolf, bred for herding, hunting and companionship.",
    ),
    ("paris", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("tokyo", "Tokyo", "Tokyo is the capital of Japan and one of the most populous cities in the world."),
    (
        "photo",
        "Photosynthesis",
        "Photosynthesis is how plants turn light, water and carbon dioxide into sugar.",
    ),
    (
        "volcano",
        "Volcano",
        "A volcano is a rupture in the crust of a planet through which lava and ash escape.",
    ),
    (
        "piano",
        "Piano",
        "The piano is a keyboard instrument whose hammers strike strings when keys are pressed.",
    ),
    ("euro", "Euro", "The euro is the currency used by twenty member states of the European Union."),
    ("moon", "Moon", "The Moon is Earth's only natural satellite and orbits it about every 27 days."),
    ("python", "Python (programming language)", "Python is a programming language known for readability."),
    (
        "everest",
        "Mount Everest",
        "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
    ),
    ("chess", "Chess", "Chess is a board game for two players played on a checkered board of 64 squares."),
]


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return get_encoder()


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "title": t, "contents": c}) for i, t, c in DOCS) + "\n")
    return path


@pytest.fixture
def dense(corpus_file: Path, tmp_path: Path) -> DenseSearchTool:
    tool = DenseSearchTool(corpus=str(corpus_file), cache_dir=str(tmp_path / "cache"), progress=False)
    tool.load()
    return tool


# ----------------------------------------------------------------------- encoder


def test_packaged_model_is_found_without_a_hub() -> None:
    path = resolve_embedding_model("all-MiniLM-L6-v2")
    assert (path / "model.safetensors").is_file()
    with pytest.raises(FileNotFoundError, match="no model hub is reachable"):
        resolve_embedding_model("sentence-transformers/some-other-model")


def test_vectors_are_unit_length_and_padding_does_not_change_them(encoder: Encoder) -> None:
    short = "A cat."
    together = encoder.encode([short, "A much longer sentence " * 20, "x"], batch_size=3)
    alone = encoder.encode([short])
    assert together.shape == (3, 384) and together.dtype == np.float32
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    assert np.allclose(together[0], alone[0], atol=1e-5)  # mean pooling ignores the padding
    assert encoder.encode([]).shape == (0, 384)


def test_similar_meanings_are_closer(encoder: Encoder) -> None:
    a, b, c = encoder.encode(
        ["A kitten sleeps on the sofa.", "A young cat naps on a couch.", "Stock prices fell."]
    )
    assert a @ b > 0.6
    assert a @ b > a @ c + 0.3


def test_embed_tool_returns_vectors() -> None:
    out = EmbedTool()(texts=["hello world", "bonjour le monde"])
    assert isinstance(out, ToolOutput)
    assert out.structured["dim"] == 384 and len(out.structured["embeddings"]) == 2
    assert "2 embedding(s) of dimension 384" in out.content[0]["text"]
    vector = np.array(out.structured["embeddings"][0])
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-5


def test_embed_tool_rejects_bad_input() -> None:
    tool = EmbedTool()
    with pytest.raises(ToolError) as err:
        tool(texts=["ok", 3])  # type: ignore[list-item]
    assert err.value.kind == ErrorKind.INVALID_ARGUMENTS and "list of strings" in err.value.message
    with pytest.raises(ToolError) as err:
        tool(texts=["x"] * 1025)
    assert err.value.kind == ErrorKind.TOO_LARGE and "at most 1024" in err.value.message


def test_rerank_orders_documents_by_relevance() -> None:
    documents = [text for _, _, text in DOCS]
    out = RerankTool()(query="Which city is the capital of France?", documents=documents, top_k=3)
    results = out.structured["results"]
    assert len(results) == 3
    assert results[0]["index"] == 2 and results[0]["text"] == documents[2]
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert out.content[0]["text"].startswith("1. [")
    with pytest.raises(ToolError, match="top_k must be > 0"):
        RerankTool()(query="q", documents=["a"], top_k=0)


# ------------------------------------------------------------------ dense search


async def test_dense_search_finds_by_meaning(dense: DenseSearchTool) -> None:
    out = await dense(query="kitten", topk=2)  # no word in common with the page
    hits = out.structured["results"][0]
    assert [h["id"] for h in hits][0] == "cat"
    assert set(hits[0]) == {"id", "title", "contents", "score"}
    assert hits[0]["score"] >= hits[1]["score"]
    assert out.content[0]["text"].startswith("Doc 1 (Title: Cat) The cat is")


async def test_several_queries_get_one_result_list_each(dense: DenseSearchTool) -> None:
    out = await dense(
        query=["tallest mountain on Earth", "money in Europe", "game with kings and queens"], topk=1
    )
    assert [r[0]["id"] for r in out.structured["results"]] == ["everest", "euro", "chess"]
    assert 'Results for "money in Europe":\nDoc 1 (Title: Euro)' in out.content[0]["text"]


@pytest.mark.parametrize(
    ("kwargs", "kind", "needle"),
    [
        ({"query": ""}, ErrorKind.INVALID_ARGUMENTS, "non-empty string"),
        ({"query": ["ok", 5]}, ErrorKind.INVALID_ARGUMENTS, "non-empty string"),
        ({"query": "x", "topk": 0}, ErrorKind.INVALID_ARGUMENTS, "topk must be between 1 and 50"),
        ({"query": ["q"] * 65}, ErrorKind.TOO_LARGE, "at most 64 queries"),
        ({"query": "x", "mode": "hybrid"}, ErrorKind.INVALID_ARGUMENTS, "hybrid mode needs a BM25"),
    ],
)
async def test_dense_search_rejects_bad_calls(
    dense: DenseSearchTool, kwargs: dict, kind: ErrorKind, needle: str
) -> None:
    with pytest.raises(ToolError) as err:
        await dense(**kwargs)
    assert err.value.kind == kind and needle in err.value.message


async def test_hybrid_fuses_dense_and_bm25_rankings(corpus_file: Path, tmp_path: Path) -> None:
    bm25 = SearchTool(corpus=str(corpus_file), cache_dir=str(tmp_path / "bm25"))
    tool = DenseSearchTool(
        corpus=str(corpus_file), cache_dir=str(tmp_path / "dense"), hybrid=True, bm25=bm25, progress=False
    )
    await tool.startup()
    query = "capital city on the Seine"
    hybrid = (await tool(query=query, topk=4)).structured["results"][0]
    dense = (await tool(query=query, topk=20, mode="dense")).structured["results"][0]
    lexical = (await bm25(query=query, topk=20)).structured["results"][0]
    expected = reciprocal_rank_fusion([[h["id"] for h in dense], [h["id"] for h in lexical]], k=60)[:4]
    assert [(h["id"], h["score"]) for h in hybrid] == [(i, round(s, 6)) for i, s in expected]
    assert hybrid[0]["id"] == "paris"  # first in both rankings
    assert {h["id"] for h in lexical} < {h["id"] for h in dense}  # BM25 matches fewer pages...
    assert len(hybrid) == 4  # ...and the fusion still fills the list from the dense side


def test_embeddings_are_cached_on_disk(
    corpus_file: Path, tmp_path: Path, encoder: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    docs = read_corpus(corpus_file)
    first = DenseIndex.build(docs, encoder, cache, progress=False)
    files = list(cache.glob("*.npy"))
    assert [f.name for f in files] == [f"{first.key}.npy"]
    assert first.key.startswith(corpus_hash(docs))

    def no_embedding(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached matrix should have been loaded")

    monkeypatch.setattr(encoder, "encode", no_embedding)
    second = DenseIndex.build(docs, encoder, cache, progress=False)
    assert np.array_equal(np.asarray(second.matrix), first.matrix)
    monkeypatch.undo()

    changed = [*docs[:-1], {**docs[-1], "contents": "Chess is a strategy game."}]
    third = DenseIndex.build(changed, encoder, cache, progress=False)
    assert third.key != first.key and len(list(cache.glob("*.npy"))) == 2


def test_a_bad_corpus_is_reported_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "fine"}\n{"id": 2, "title": "no contents"}\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl, line 2: 'contents' must be a string"):
        DenseSearchTool(corpus=str(bad), cache_dir=str(tmp_path), progress=False).load()


def test_reciprocal_rank_fusion() -> None:
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=60)
    ids = [doc_id for doc_id, _ in fused]
    assert ids[:2] == ["a", "c"]  # in both lists, near the top
    assert set(ids) == {"a", "b", "c", "d"}
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)


def test_schemas_hide_configuration_and_show_call_arguments() -> None:
    from tool_server.schema import derive_signature

    expected = {
        "embed": (EmbedTool(), {"texts"}),
        "rerank": (RerankTool(), {"query", "documents", "top_k"}),
        "dense_search": (DenseSearchTool(corpus="unused.jsonl"), {"query", "topk", "mode"}),
    }
    for name, (instance, properties) in expected.items():
        sig = derive_signature(instance, name, None)
        assert set(sig.input_schema["properties"]) == properties, name
    modes = derive_signature(DenseSearchTool(), "dense_search", None).input_schema["properties"]["mode"]
    assert {"enum": ["dense", "hybrid"], "type": "string"} in modes["anyOf"]
