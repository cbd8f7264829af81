"""A word-level cache in front of byte-level BPE tokenizers (GPT-2 style, e.g. SmolLM2).

Byte-level BPE never merges across pre-tokens, so encoding a text equals splitting it
with the GPT-2 pre-tokenizer pattern and concatenating each piece's ids. The Rust
pre-tokenizer of ``tokenizers`` is the slow part of encoding an observation (its regex
engine handles the look-ahead slowly), while the ``regex`` module splits faster and most
pieces of an observation are words seen before (figures in bench/README.md). Enabled
only for tokenizers whose pipeline matches that assumption, and checked against the real
tokenizer at start.
"""

from __future__ import annotations

import logging
from typing import Any

import regex

logger = logging.getLogger(__name__)

# The GPT-2 pre-tokenizer pattern that ByteLevel(use_regex=True) applies.
_GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
_SELF_TEST = [
    "Hello, world! It's 3.14159 — naïve café 東京 ☃  tabs\tand\n\nnewlines   ",
    '<|im_start|>tool\n{"result": 42, "text": "a b"}<|im_end|>\n<|im_start|>assistant\n',
    "  leading spaces, trailing spaces   \n\t\r\n x'll y've 123abc ABC123 ___ ...",
]
MAX_ENTRIES = 200_000


class WordCacheEncoder:
    """``encode(text) -> list[int]``, identical to ``backend.encode(text, add_special_tokens=False).ids``."""

    def __init__(self, backend: Any, pieces: regex.Pattern[str] | None) -> None:
        self.backend = backend
        self.special = pieces
        self.special_ids: dict[str, int] = {}
        self.cache: dict[str, list[int]] = {}

    @classmethod
    def for_tokenizer(cls, backend: Any) -> WordCacheEncoder | None:
        """A cache encoder if ``backend`` is plain byte-level BPE; None otherwise."""
        try:
            pre = repr(backend.pre_tokenizer)
            normalizer = backend.normalizer
            model = type(backend.model).__name__
            added = backend.get_added_tokens_decoder()
        except Exception:
            return None
        plain_normalizer = normalizer is None or repr(normalizer) == "Sequence(normalizers=[])"
        if model != "BPE" or not plain_normalizer:
            return None
        if not (pre.startswith("ByteLevel(") and "add_prefix_space=False" in pre and "use_regex=True" in pre):
            return None
        if any(
            t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values() if not t.special
        ):
            return None
        contents = sorted((t.content for t in added.values()), key=len, reverse=True)
        special = regex.compile("(" + "|".join(regex.escape(c) for c in contents) + ")") if contents else None
        encoder = cls(backend, special)
        encoder.special_ids = {t.content: i for i, t in added.items()}
        for sample in _SELF_TEST:
            if encoder.encode(sample) != backend.encode(sample, add_special_tokens=False).ids:
                logger.info("word cache disabled: it disagrees with the tokenizer on a self-test")
                return None
        return encoder

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        if self.special is None:
            self._encode_plain(text, ids)
            return ids
        for i, part in enumerate(self.special.split(text)):
            if i % 2:
                ids.append(self.special_ids[part])
            elif part:
                self._encode_plain(part, ids)
        return ids

    def _encode_plain(self, text: str, out: list[int]) -> None:
        cache = self.cache
        words = _GPT2_PATTERN.findall(text)
        misses = [w for w in dict.fromkeys(words) if w not in cache]
        if misses:  # one call into the tokenizer for every new word of this text
            if len(cache) + len(misses) > MAX_ENTRIES:
                cache.clear()
            for word, encoding in zip(
                misses, self.backend.encode_batch(misses, add_special_tokens=False), strict=True
            ):
                cache[word] = encoding.ids
        for word in words:
            out.extend(cache[word])
