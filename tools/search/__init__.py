"""Retrieval: BM25 over the built-in Wikipedia corpus or a wiki-18-size index on disk, and
dense search with MiniLM embeddings.

* ``bm25``: ``SearchTool`` (the ``search`` tool), in memory or over a saved index;
* ``index``: build, save and open a large memory-mapped BM25 index
  (``python -m tools.search.index build``);
* ``topk``: exact top-k of one query over that index;
* ``tokens``: the one tokenizer of documents, queries and saved indexes;
* ``dense``: ``DenseSearchTool`` (the ``dense_search`` tool);
* ``embeddings``: the cached MiniLM matrix of a corpus (``DenseIndex``) and rank fusion;
* ``corpus``: document collections, JSONL files of ``{id, title, contents}``.
"""

from tools.search.bm25 import BM25Index, Hit, SearchTool, open_index, open_saved_index
from tools.search.dense import DenseSearchTool
from tools.search.tokens import Tokenizer

__all__ = ["BM25Index", "DenseSearchTool", "Hit", "SearchTool", "Tokenizer", "open_index", "open_saved_index"]
