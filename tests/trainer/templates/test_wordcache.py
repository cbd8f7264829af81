"""The word cache must give exactly the tokenizer's ids, for any text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_client.backends.models import load_tokenizer
from trainer_client.templates.render import TokenCodec
from trainer_client.templates.wordcache import WordCacheEncoder


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


def test_enabled_for_smollm2_and_exact_on_real_text(tokenizer):
    codec = TokenCodec(tokenizer)
    assert isinstance(codec._words, WordCacheEncoder)
    backend = tokenizer.backend_tokenizer
    texts = [p.read_text() for p in sorted(Path(__file__).resolve().parents[3].glob("tool_server/**/*.py"))]
    texts.append(json.dumps({"results": [[{"title": "Zürich", "contents": "Zürich ist … 1,234.5 km²"}]]}))
    texts.append("<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    for text in texts:
        assert codec.encode(text) == backend.encode(text, add_special_tokens=False).ids
        assert codec.encode(text) == backend.encode(text, add_special_tokens=False).ids  # cached path too


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
@settings(max_examples=300, deadline=None)
def test_any_text_encodes_like_the_tokenizer(tokenizer, text):
    codec = TokenCodec(tokenizer)
    assert codec.encode(text) == tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


def test_declines_tokenizers_it_cannot_mimic():
    class Other:
        pre_tokenizer = "Metaspace()"
        normalizer = None
        model = object()

        def get_added_tokens_decoder(self):
            return {}

    assert WordCacheEncoder.for_tokenizer(Other()) is None
