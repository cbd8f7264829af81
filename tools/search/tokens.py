"""The words BM25 scores: lowercase, words of 2+ characters, English stopwords dropped, stemmed.

Documents, queries and saved indexes (``index``) share this one tokenizer, so both sides
always agree.
"""

from __future__ import annotations

import re
from typing import Any

from bm25s.stopwords import STOPWORDS_EN

__all__ = ["Tokenizer"]

_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = frozenset(STOPWORDS_EN)
_STEM_CACHE_LIMIT = 500_000


def _load_stemmer(language: str | None) -> Any:
    if language is None:
        return None
    try:
        import Stemmer  # PyStemmer: optional, improves recall ("cats" finds "cat")
    except ImportError:
        if language == "auto":
            return None
        raise
    return Stemmer.Stemmer("english" if language == "auto" else language)


class Tokenizer:
    """Lowercase, split into words of 2+ characters, drop English stopwords, stem.

    The same function tokenises documents and queries, so both sides always agree.
    """

    def __init__(self, stemmer: str | None = "auto") -> None:
        self._stemmer = _load_stemmer(stemmer)
        language = "english" if stemmer == "auto" else stemmer
        self.name = f"stem-{language}" if self._stemmer is not None else "nostem"  # part of the index key
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> list[str]:
        words = [w for w in _TOKEN.findall(text.lower()) if w not in _STOPWORDS]
        if self._stemmer is None:
            return words
        cache = self._cache
        missing = [w for w in words if w not in cache]
        if missing:
            if len(cache) > _STEM_CACHE_LIMIT:
                cache.clear()
            unique = list(dict.fromkeys(missing))
            cache.update(zip(unique, self._stemmer.stemWords(unique), strict=True))
        return [cache[w] for w in words]
